"""`disque-server`: start a node from a config file and command-line directives.

Thin on purpose: it parses the configuration, sets up logging and hands the
node to `disque.shell.server.Server`; trio and the server are imported only then,
so `--version` and `--help` answer at once."""

from __future__ import annotations

import logging
import os
import sys
import time

from disque.core import config as cfg
from disque.shell.config_file import build_config
from disque.version import server_line

USAGE = """Usage: disque-server [/path/to/disque.conf] [options]
       disque-server - (read config from stdin)
       disque-server -v or --version
       disque-server -h or --help

Examples:
       disque-server (run the server with default conf)
       disque-server /etc/disque/7711.conf
       disque-server --port 7777
       disque-server /etc/mydisque.conf --loglevel verbose
"""

LEVELS = {"debug": logging.DEBUG, "verbose": logging.INFO, "notice": logging.INFO, "warning": logging.WARNING}
MARKS = {logging.DEBUG: ".", logging.INFO: "*", logging.WARNING: "#", logging.ERROR: "#", logging.CRITICAL: "#"}


class LogFormatter(logging.Formatter):
    """`<pid>:P <dd Mon HH:MM:SS.mmm> <lvl> <message>` (spec/config.md §2.1),
    Disque's own log lines, so tools that read those read ours."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%d %b %H:%M:%S", time.localtime(record.created))
        return f"{os.getpid()}:P {stamp}.{int(record.msecs):03d} {MARKS[record.levelno]} {record.getMessage()}"


def setup_logging(config: cfg.Config) -> None:
    handler: logging.Handler
    handler = logging.FileHandler(config.logfile) if config.logfile else logging.StreamHandler(sys.stdout)
    handler.setFormatter(LogFormatter())
    root = logging.getLogger("disque")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[config.loglevel])
    root.propagate = False


def server_main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = build_config(argv)
    except cfg.ShowVersion:
        print(server_line())
        sys.exit(0)
    except cfg.ShowHelp:
        print(USAGE, file=sys.stderr)
        sys.exit(1)
    except cfg.ConfigError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
    try:
        os.chdir(config.dir)
    except OSError as e:
        print(f"Can't chdir to '{config.dir}': {e.strerror}", file=sys.stderr)
        sys.exit(1)
    setup_logging(config)
    log = logging.getLogger("disque")
    if config.config_file is None:
        log.warning("Warning: no config file specified, using the default config. In order to specify a config file use disque-server /path/to/disque.conf")
    if (config.port or config.tls_port) > 55535:
        log.warning("Port %d is too high: the cluster bus port (port + 10000) would overflow", config.port or config.tls_port)
        sys.exit(1)
    import trio

    from disque.cluster.membership import ConfError
    from disque.shell.nodes_file import NodesFileLocked
    from disque.shell.security import SecurityError
    from disque.shell.server import Server

    try:
        server = Server(config)
    except (ConfError, NodesFileLocked, SecurityError) as e:
        log.warning("%s", e)
        sys.exit(1)
    try:
        trio.run(server.serve)
    except OSError as e:
        log.warning("Creating Server TCP listening socket *:%d: %s", config.port, e.strerror)
        sys.exit(1)
    except KeyboardInterrupt:  # a second Ctrl-C before the shutdown finished
        sys.exit(1)
