"""Errors meant for users: one line, exit code 2, no traceback unless --debug."""

from __future__ import annotations


class UserError(Exception):
    """A problem with what the user gave us (a file, a flag, a missing stage output).

    The CLI prints ``str(error)`` on one line and exits with code 2. Build messages with
    :func:`where` so they always name the file, line and field when those are known.
    """

    exit_code = 2


class UserCodeError(UserError):
    """An error in code the user wrote and named on the command line (a reward function):
    the CLI shows ``details``, the traceback of their code, above the one line."""

    def __init__(self, message: str, *, details: str = ""):
        super().__init__(message)
        self.details = details


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's time limit or preemption, ``kill``, torchrun stopping its
    workers), raised where the process stands so it ends as Ctrl-C does: run.json says
    "interrupted" rather than "running", with the shell's exit code for SIGTERM."""


def where(path: object = None, line: int | None = None, field: str | None = None) -> str:
    """Format a location prefix such as ``data.jsonl:12: field 'chosen'``."""
    parts = []
    if path is not None:
        parts.append(f"{path}:{line}" if line is not None else str(path))
    if field is not None:
        parts.append(f"field '{field}'")
    return ": ".join(parts)


def bad_input(message: str, path: object = None, line: int | None = None, field: str | None = None) -> UserError:
    """A :class:`UserError` whose message starts with the location of the bad input."""
    loc = where(path, line, field)
    return UserError(f"{loc}: {message}" if loc else message)
