"""`disque` without a command: an interactive prompt, or the lines piped in.

Theory of operation: each line is split like redis-cli splits it
(`config.split_args`) and run by `main.dispatch`, the lookup the one-shot
commands use, so a line is what would follow `disque` and its options on the
command line.  The prompt (prompt_toolkit, imported only here) completes the first
word, keeps a history file, shows the syntax of the command being typed, and
turns Ctrl-C into the end of the running command, not of the prompt.
Errors are printed as `(error) ...` and the next line runs; piped lines end
with exit status 1 if any failed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from disque.cli.main import completions, dispatch, synopsis
from disque.cli.session import Session
from disque.client import DisqueConnectionError, DisqueReplyError
from disque.core.config import split_args


def prompt_loop(root: click.Context) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import FileHistory, History, InMemoryHistory

    session: Session = root.obj
    path = Path(os.environ.get("DISQUE_HISTFILE") or Path.home() / ".disque_history")
    try:
        path.touch()
        history: History = FileHistory(str(path))
    except OSError:
        history = InMemoryHistory()
    words = completions()
    # sentence=True: what precedes the cursor must prefix a name, so only the first word completes.
    completer = WordCompleter(list(words), ignore_case=True, sentence=True, meta_dict=words)
    prompt: PromptSession[str] = PromptSession(history=history, completer=completer, auto_suggest=AutoSuggestFromHistory(), complete_while_typing=False)

    def hint() -> str:
        name = (prompt.default_buffer.text.split() or [""])[0]
        return f" {synopsis(root, name) or 'help [command] | exit'}"

    while True:
        try:
            line = prompt.prompt(f"{session.label}> ", bottom_toolbar=hint)
        except KeyboardInterrupt:
            continue
        except EOFError:
            return
        try:
            if run_line(root, line) == "quit":
                return
        except KeyboardInterrupt:  # the command was interrupted; its connection, out of step, is closed
            session.close()


def script_loop(root: click.Context) -> None:
    """Commands piped in, one per line: like the prompt, but exit status 1 if any failed."""
    outcomes = set()
    for line in sys.stdin:
        outcome = run_line(root, line)
        if outcome == "quit":
            break
        outcomes.add(outcome)
    if "error" in outcomes:
        root.exit(1)


def run_line(root: click.Context, line: str) -> str:
    """Run one typed line: "ok", "error", or "quit"."""
    try:
        words = split_args(line)
    except ValueError:
        click.echo("Invalid argument(s)", err=True)
        return "error"
    if not words:
        return "ok"
    if words[0].lower() in ("exit", "quit"):
        return "quit"
    try:
        dispatch(root, words)
    except click.exceptions.Exit as e:  # --help, check-aof's status
        return "ok" if e.exit_code == 0 else "error"
    except click.UsageError as e:
        e.show()
        return "error"
    except click.ClickException as e:
        click.echo(f"(error) {e.format_message()}", err=True)
        return "error"
    except (DisqueReplyError, DisqueConnectionError) as e:
        click.echo(f"(error) {e}", err=True)
        return "error"
    return "ok"
