"""One sandboxed process: write the program, start it through the harness, read its output
until it exits or the deadline passes, stop and reap it, and say how it ended.

:func:`run_in` is the whole life of one child, given an :class:`~.launcher.Isolation`,
a uid and a working directory; the caller owns the uid and the directory
(:func:`~.runner.run`, or the containment probe, which runs its probe program exactly as
programs will be run).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .launcher import Isolation
from .limits import TIMEOUT, Limits, classify, failure_detail, limits_spec
from .users import kill, remove_litter, status_fields, sweep, tasks_of_user

# handed to the child as ``python -c`` text (harness.py, beside this package)
HARNESS_SOURCE = (Path(__file__).parents[1] / "harness.py").read_text(encoding="utf-8")
STDERR_KEEP = 4000  # characters of stderr kept for diagnostics
CPU_POLL = 0.2  # seconds between looks at the CPU time of a run's processes together
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Job:
    """One program on one input: ``stdin`` text, or ``call_args`` for ``fn_name`` (call-based)."""

    source: str
    stdin: str = ""
    fn_name: str | None = None
    call_args: Any = None
    limits: Limits | None = None


@dataclass
class Execution:
    """How one run ended. ``stdout`` is the program's output (call-based: the result's JSON)."""

    status: str
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    seconds: float = 0.0  # wall clock
    detail: str = ""
    cpu_seconds: float = 0.0  # its processes together (what the time limit counts)


_ENV_BASE = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _environment(workdir: str) -> dict[str, str]:
    """A clean environment: nothing inherited from the parent (its secrets stay there)."""
    return {
        **_ENV_BASE, "HOME": workdir, "TMPDIR": workdir, "MALLOC_ARENA_MAX": "2",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
    }  # fmt: skip


def temp_root() -> str:
    """Where working directories go (``MARLHF_SANDBOX_TMPDIR``, else /tmp)."""
    root = os.environ.get("MARLHF_SANDBOX_TMPDIR") or "/tmp"
    return root if os.path.isdir(root) else tempfile.gettempdir()


def run_in(job: Job, limits: Limits, iso: Isolation, uid: int | None, workdir: str) -> tuple[Execution, bool]:
    """Run ``job`` in ``workdir`` as ``uid``: how it ended, and whether the uid was left clean
    (no process of it remains, so it can serve another run)."""
    program = os.path.join(workdir, "solution.py")
    inputs = os.path.join(workdir, "input.txt")
    with open(program, "w", encoding="utf-8") as handle:
        handle.write(job.source)
    call = job.fn_name is not None
    with open(inputs, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(job.call_args) if call else job.stdin)
    os.chmod(program, 0o644)
    os.chmod(inputs, 0o644)
    if uid is not None:
        os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o700)
    if uid is not None:
        nproc = limits.processes
    else:
        nproc = tasks_of_user(os.getuid()) + limits.processes
    block_net = "0" if iso.network == "namespace" else "1"
    argv = iso.prefix(uid) + [
        iso.python, "-I", "-S", "-B", "-X", "utf8", "-c", HARNESS_SOURCE,
        "call" if call else "stdin", block_net, limits_spec(limits, nproc), program, inputs, job.fn_name or "",
    ]  # fmt: skip
    preexec = iso.preexec(uid)
    began = time.monotonic()
    with open(inputs if not call else os.devnull, "rb") as stdin:
        proc = subprocess.Popen(
            argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir,
            env=_environment(workdir), start_new_session=True, preexec_fn=preexec, close_fds=True,
        )  # fmt: skip
    polled = [0.0]  # the run's CPU seconds as the last poll read them (what a kill for CPU decides on)

    def over_cpu() -> bool:
        polled[0] = max(polled[0], _run_cpu_seconds(proc.pid, uid))
        return polled[0] > limits.time

    try:
        stdout, stderr, ended = _collect(proc, began + limits.wall_seconds(), limits.output_bytes, over_cpu)
    finally:
        forced = _stop(proc, iso)
        returncode, reaped = _reap(proc)
    # two readings of one figure: the kernel's accounting at the reap, and /proc's ticks at the
    # last poll, which can run ahead of it on a busy machine; the run used at least the larger,
    # and a run killed for CPU reports the reading that killed it
    cpu_seconds = max(reaped, polled[0])
    seconds = time.monotonic() - began
    clean = True
    if uid is not None and (iso.mode == "setuid" or forced):
        clean = sweep(uid, iso.python)
    elif iso.mode == "rlimits":
        _reap_session(proc.pid)
    if uid is not None:
        remove_litter(uid)
    err_text = stderr.decode("utf-8", "replace")[-STDERR_KEEP:]
    out_text = stdout.decode("utf-8", "replace")
    status = classify(ended, returncode, err_text, limits, cpu_seconds)
    if ended == "timeout":
        detail = f"wall-clock backstop of {limits.wall_seconds():g} s reached ({cpu_seconds:.2f} CPU s used: waiting, not computing)"
    elif status == TIMEOUT:
        detail = f"CPU limit of {limits.time:g} s exceeded ({cpu_seconds:.2f} s used)"
    elif ended == "output":
        detail = f"more than {limits.output_bytes} bytes of output"
    else:
        detail = failure_detail(status, returncode, err_text)
    return Execution(status, out_text, err_text, returncode, seconds, detail, cpu_seconds), clean


def _collect(proc: subprocess.Popen, deadline: float, cap: int, over_cpu: Callable[[], bool]) -> tuple[bytes, bytes, str]:
    """Read stdout/stderr until the process exits, the deadline passes, its processes have
    used their CPU time (asked every :data:`CPU_POLL` seconds) or a cap is exceeded.

    Returns (stdout, stderr, how): how is ``exited``, ``timeout``, ``cpu`` or ``output``.
    Stops at the main process's exit rather than at EOF: a daemon holding the pipes must
    not stall us.
    """
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    selector = selectors.DefaultSelector()
    for fd in buffers:
        selector.register(fd, selectors.EVENT_READ)
    pidfd = None
    try:
        pidfd = os.pidfd_open(proc.pid)
        selector.register(pidfd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        pass
    how = "exited"
    next_poll = time.monotonic() + CPU_POLL
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                how = "timeout"
                break
            if now >= next_poll:
                if over_cpu():
                    how = "cpu"
                    break
                next_poll = now + CPU_POLL
            wait = min(deadline, next_poll) - now
            exited = False
            for key, _ in selector.select(wait if pidfd is not None else min(wait, 0.01)):
                if key.fd == pidfd:
                    exited = True
                    continue
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                    continue
                buffers[key.fd] += data
                if len(buffers[key.fd]) > cap:
                    how = "output"
            if how == "output":
                break
            if exited or (pidfd is None and not _alive(proc)):
                _drain(buffers, cap)
                break
            if len(selector.get_map()) == (1 if pidfd is not None else 0):
                how = _wait_exit_polled(proc, deadline, over_cpu)  # both pipes closed: wait for the exit
                break
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)
    out, err = buffers[proc.stdout.fileno()], buffers[proc.stderr.fileno()]
    proc.stdout.close()
    proc.stderr.close()
    return bytes(out[:cap]), bytes(err[:cap]), how


def _drain(buffers: dict[int, bytearray], cap: int) -> None:
    """What the exited program left in the pipes (non-blocking: holders may still live)."""
    for fd, buffer in buffers.items():
        os.set_blocking(fd, False)
        while len(buffer) <= cap:
            try:
                data = os.read(fd, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            buffer += data


def _stop(proc: subprocess.Popen, iso: Isolation) -> bool:
    """End the run; True when it had to fall back to killing the process group.

    In a PID namespace the namespace's init (``unshare``'s child) is killed, not ``unshare``:
    the kernel then kills and reaps every process of the namespace, and ``unshare`` reaps
    the init and exits, so nothing is orphaned to a PID 1 that may never reap it.
    """
    if _alive(proc) and iso.mode in ("namespaces", "userns"):
        for child in _children(proc.pid):
            kill(child)
        _wait_exit(proc, 2.0)
    if _alive(proc):
        _kill_group(proc)
        return iso.mode in ("namespaces", "userns")
    _kill_group(proc)  # anything the program left in its group (rlimits/setuid modes)
    return False


def _alive(proc: subprocess.Popen) -> bool:
    """Still running? Asked without reaping it, so that :func:`_reap` gets its CPU time."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout)
    while _alive(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True


def _wait_exit_polled(proc: subprocess.Popen, deadline: float, over_cpu: Callable[[], bool]) -> str:
    """:func:`_wait_exit` that also stops at the CPU limit: ``exited``, ``cpu`` or ``timeout``."""
    while not _wait_exit(proc, min(CPU_POLL, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            return "timeout"
        if over_cpu():
            return "cpu"
    return "exited"


def _run_cpu_seconds(session: int, uid: int | None) -> float:
    """CPU seconds used so far by the run's processes, the ones they reaped included: those of
    its session (``start_new_session``) and of its own uid (where it has one: a program
    that calls ``setsid`` leaves the session, not the uid).

    RLIMIT_CPU holds each process to the limit, but a program that forks busy children
    would use a multiple of it; counting them together here closes that. One scan of
    /proc costs about a millisecond per hundred processes.
    """
    ticks = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            ours = int(fields[3]) == session or (uid is not None and os.stat(f"/proc/{name}").st_uid == uid)
        except (OSError, IndexError):
            continue  # gone meanwhile
        if ours:
            ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / _CLOCK_TICKS


def _reap(proc: subprocess.Popen) -> tuple[int, float]:
    """(exit code as subprocess reports it, CPU seconds of the process and the children it reaped).

    The CPU time tells a CPU-limit kill from other deaths in every mode (``unshare`` does not
    pass a SIGKILLed child's status on faithfully).
    """
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:
        return proc.wait(), 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _reap_session(session: int, patience: float = 0.5) -> None:
    """Reap the killed program's orphans (they were reparented here, a child subreaper).

    Only processes of the run's own session are touched, so no other child of this process
    ever has its exit status taken.
    """
    me, deadline = os.getpid(), time.monotonic() + patience
    while True:
        waiting = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            state, parent, sid = fields[0], int(fields[1]), int(fields[3])
            if sid != session:
                continue
            if parent == me and state == "Z":
                try:
                    os.waitpid(int(name), os.WNOHANG)
                except ChildProcessError:
                    pass
            else:
                waiting = True  # still dying, or not (yet) ours
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
            return [int(word) for word in handle.read().split()]
    except OSError:
        return [int(name) for name in os.listdir("/proc") if name.isdigit() and status_fields(name).get("PPid", "").strip() == str(pid)]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


