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


class DiskFull(UserError):
    """A write that failed because the filesystem it went to is full (or nearly: a checkpoint's
    writer reports it as a failed write, not as ENOSPC)."""


def full_disk(error: BaseException, path) -> str | None:
    """``path``'s filesystem and what is free on it when ``error`` looks like a full disk (an
    ENOSPC or EDQUOT anywhere in its chain, or any failed write where under 100 MiB or 1% is
    left); None otherwise."""
    import errno
    import shutil
    from pathlib import Path

    chain, seen = error, 0
    while chain is not None and seen < 8:
        if isinstance(chain, OSError) and chain.errno in (errno.ENOSPC, errno.EDQUOT):
            break
        chain, seen = chain.__cause__ or chain.__context__, seen + 1
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return None
    if chain is None and usage.free >= max(100 * 2**20, usage.total // 100):
        return None
    return f"{usage.free / 2**20:,.1f} MiB free of {usage.total / 2**20:,.0f} MiB on the filesystem of {folder}"


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
