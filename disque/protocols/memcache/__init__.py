"""Kestrel's memcache text protocol (spec/kestrel.md).

`parser` turns a connection's bytes into request values, `encoder` turns
results into reply lines.  Both are pure; per-queue limits and their Kestrel
defaults live in `disque.store.queue_config`, because they bind RESP clients
too.
"""
