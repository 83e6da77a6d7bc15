"""The trio shell: sockets, files, signals and clocks around the sans-IO core.

Nothing under `disque.core`, `disque.store`, `disque.cluster` or
`disque.protocols` imports from here; the shell drives the core through its
entry points and carries out the effects it returns.
"""
