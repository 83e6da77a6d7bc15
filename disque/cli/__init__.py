"""The command-line programs: `disque-server` (`disque.cli.server`) and the
`disque` client (`disque.cli.main`).  Nothing is imported here, so each
program loads only what it needs."""
