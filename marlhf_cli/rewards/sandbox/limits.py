"""What a sandboxed run may use, and what it ended in.

:class:`Limits` and the ``setrlimit`` spec the harness applies (:func:`limits_spec`); the
statuses an execution ends in, and how a finished child's exit code, stderr and CPU time
map to one (:func:`classify`, :func:`failure_detail`). Kept apart from the process handling
so that the result protocol (shared with ``harness.py``'s exit codes) reads on one page.
"""

from __future__ import annotations

import math
import resource
import signal
from dataclasses import dataclass

# the harness's exit codes (harness.py defines the same numbers: it runs standalone, via -c)
EXIT_COMPILE, EXIT_MEMORY, EXIT_NO_FUNCTION, EXIT_BAD_RESULT, EXIT_CPU, EXIT_SETUP = 111, 112, 113, 114, 115, 116

# what one execution ended in
OK = "ok"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
OUTPUT_LIMIT = "output_limit"
COMPILE_ERROR = "compile_error"


@dataclass(frozen=True)
class Limits:
    """Per-run limits.

    A run is timed by the CPU seconds its processes use, not by the clock on the wall: on a
    busy machine a program gets less of a core, and a crash, a memory error or a program
    that finishes in time must not turn into a timeout because of that. The wall clock only
    backs the CPU limit up, for programs that wait without computing (a sleep, a daemon).
    """

    time: float = 4.0  # CPU seconds, all of the run's processes together
    wall: float | None = None  # wall-clock backstop; None: 5 x time + 5 s (:meth:`wall_seconds`)
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    processes: int = 16  # processes + threads at once (RLIMIT_NPROC)
    output_bytes: int = 8 << 20  # stdout (and, separately, stderr) bytes read back
    file_bytes: int = 16 << 20  # largest file it may write (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE

    def cpu_seconds(self) -> int:
        """Each process's own RLIMIT_CPU (whole seconds; the hard limit is one more)."""
        return max(1, math.ceil(self.time))

    def wall_seconds(self) -> float:
        """Generous: a program with a fifth of a core (a 2-core machine under a load of 10)
        that computes for ``time`` seconds still ends before it."""
        return self.wall if self.wall is not None else 5 * self.time + 5


def limits_spec(limits: Limits, nproc: int) -> str:
    """The limits for the harness (``CPU=4:5,AS=...``), never above this process's own.

    The harness sets them with ``setrlimit`` before it reads the program: no ``preexec_fn``
    is needed, so ``subprocess`` can start the child with vfork, which costs ~1 ms instead
    of a fork's page-table copy (~200 ms from a parent holding 3 GB, i.e. a training run).
    """
    cpu = limits.cpu_seconds()
    wanted = [
        ("CPU", resource.RLIMIT_CPU, cpu, cpu + 1),
        ("AS", resource.RLIMIT_AS, limits.memory_mb << 20, limits.memory_mb << 20),
        ("NPROC", resource.RLIMIT_NPROC, nproc, nproc),
        ("FSIZE", resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
        ("NOFILE", resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        ("CORE", resource.RLIMIT_CORE, 0, 0),
    ]
    parts = []
    for name, res, soft, hard in wanted:
        _, current = resource.getrlimit(res)
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        parts.append(f"{name}={soft}:{hard}")
    return ",".join(parts)


def classify(ended: str, returncode: int, stderr: str, limits: Limits, cpu_seconds: float) -> str:
    """The status of a finished run; ``ended`` is how output collection stopped
    (``exited``, ``timeout`` (the wall-clock backstop), ``cpu`` (its processes together used
    more than ``limits.time``) or ``output``)."""
    if ended in ("timeout", "cpu"):
        return TIMEOUT
    if ended == "output":
        return OUTPUT_LIMIT
    if cpu_seconds > limits.time:
        return TIMEOUT  # over its CPU time, though it ended before the next look at it
    if returncode == 0:
        return OK
    if returncode == EXIT_COMPILE:
        return COMPILE_ERROR
    if returncode == EXIT_MEMORY or stderr.rstrip().endswith("MemoryError"):
        return MEMORY_LIMIT
    if returncode in (-signal.SIGXCPU, EXIT_CPU) or cpu_seconds >= limits.cpu_seconds() - 0.05:
        return TIMEOUT  # the CPU limit (soft: SIGXCPU; hard, or as a namespace's init: SIGKILL)
    if returncode == -signal.SIGXFSZ:
        return OUTPUT_LIMIT
    return RUNTIME_ERROR


def failure_detail(status: str, returncode: int, stderr: str) -> str:
    """One line for the user: the last line of stderr, and the signal that killed the run."""
    if status == OK:
        return ""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if returncode is not None and returncode < 0:
        try:
            last = f"killed by {signal.Signals(-returncode).name}" + (f"; {last}" if last else "")
        except ValueError:
            pass
    return last[:300]
