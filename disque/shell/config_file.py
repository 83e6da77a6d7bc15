"""The file-system half of the configuration: reading `disque-server`'s
arguments and config files (with their `include`s), test-opening the log
file as upstream does, and writing CONFIG REWRITE's result in place.

Parsing, CONFIG GET/SET and the rewrite's text live in the pure
`disque.core.config`; this module only moves text between it and files.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from disque.core.config import (
    Check,
    Config,
    ConfigError,
    ConfigFileError,
    ShowHelp,
    ShowVersion,
    decode_text,
    encode_text,
    parse_config_text,
    quote_arg,
    rewrite_config_text,
)


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        return decode_text(f.read())


def read_config(path: str, base: str) -> str:
    try:
        return _read_text(os.path.join(base, path))
    except OSError:
        raise ConfigError(f"Fatal error, can't open config file '{path}'") from None


def _check_logfile(config: Config, name: str, args: list[str]) -> None:
    """Upstream opens the log file for append while parsing, to fail early."""
    if name == "logfile" and args[0]:
        try:
            with open(os.path.join(config.dir, args[0]), "a"):
                pass
        except OSError as exc:
            raise ValueError(f"Can't open the log file: {exc.strerror}") from None


def build_config(argv: list[str], *, check: Check | None = None, stdin: TextIO | None = None) -> Config:
    """The configuration for ``disque-server <argv...>`` (program name excluded).

    ``argv[0]``, unless it starts with ``--``, is the config file (``-``
    reads ``stdin``, defaulting to ``sys.stdin``, and leaves ``config_file``
    None since there is nothing to rewrite).  Each later ``--name`` starts a
    line, other arguments are quoted values; these lines are parsed after
    the file's, so they win.  The log file is test-opened as upstream does;
    ``check`` adds the caller's own checks (e.g. rename-command targets).

    Raises ``ShowVersion`` / ``ShowHelp`` for ``-v|--version`` /
    ``-h|--help`` as the first argument, and ``ConfigError`` /
    ``ConfigFileError`` for an unreadable or bad configuration.
    """
    if argv[:1] in (["-v"], ["--version"]):
        raise ShowVersion
    if argv[:1] in (["-h"], ["--help"]):
        raise ShowHelp
    config = Config(os.getcwd())
    text, options = "", argv
    if argv and not argv[0].startswith("--"):
        path, options = argv[0], argv[1:]
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            config.config_file = os.path.abspath(path)
            text = read_config(path, config.dir)
    lines = ""
    for arg in options:
        if arg.startswith("--"):
            lines += ("\n" if lines else "") + arg[2:] + " "
        else:
            lines += quote_arg(arg) + " "

    def hooks(cfg: Config, name: str, args: list[str]) -> None:
        _check_logfile(cfg, name, args)
        if check:
            check(cfg, name, args)

    try:
        parse_config_text(text + "\n" + lines, config, check=hooks, read=read_config)
    except ConfigFileError as e:
        e.option = e.line_no > text.count("\n") + 1  # a line of the options, which no file holds
        raise
    return config


def write_config_file(path: str, text: str) -> None:
    """Replace the file's content without it ever being seen empty: pad the
    new content with ``\\n###...`` to the old size, write it at once, then
    truncate.  Raises ``OSError``."""
    content = encode_text(text)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        padding = os.fstat(fd).st_size - len(content)
        padded = content + (b"\n" + b"#" * (padding - 1) if padding > 0 else b"")
        view = memoryview(padded)
        while view:
            view = view[os.write(fd, view) :]
        if padding > 0:
            os.ftruncate(fd, len(content))
    finally:
        os.close(fd)


def rewrite_config_file(config: Config) -> None:
    """CONFIG REWRITE end to end.  Raises ``ConfigError`` when the server runs
    without a config file and ``OSError`` on I/O failure."""
    if config.config_file is None:
        raise ConfigError("The server is running without a config file")
    try:
        old_text = _read_text(config.config_file)
    except FileNotFoundError:
        old_text = ""
    write_config_file(config.config_file, rewrite_config_text(old_text, config))
