"""One sandboxed process: write the program, start it through the harness, read its output
until it exits or the deadline passes, stop and reap it, and say how it ended.

:func:`run_in` is the whole life of one child, given an :class:`~.containment.Isolation`,
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
from typing import TYPE_CHECKING, Any

from .limits import TIMEOUT, Limits, classify, failure_detail, limits_spec
from .users import kill, remove_litter, status_fields, sweep, tasks_of_user

if TYPE_CHECKING:
    from .containment import Isolation

# handed to the child as ``python -c`` text (harness.py, beside this package)
HARNESS_SOURCE = (Path(__file__).parents[1] / "harness.py").read_text(encoding="utf-8")
STDERR_KEEP = 4000  # characters of stderr kept for diagnostics


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
    seconds: float = 0.0
    detail: str = ""


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
    try:
        stdout, stderr, ended = _collect(proc, began + limits.time, limits.output_bytes)
    finally:
        forced = _stop(proc, iso)
        returncode, cpu_seconds = _reap(proc)
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
        detail = f"wall-clock limit of {limits.time:g} s exceeded"
    elif status == TIMEOUT:
        detail = f"CPU limit of {limits.cpu_seconds()} s exceeded ({cpu_seconds:.2f} s used)"
    elif ended == "output":
        detail = f"more than {limits.output_bytes} bytes of output"
    else:
        detail = failure_detail(status, returncode, err_text)
    return Execution(status, out_text, err_text, returncode, seconds, detail), clean


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str]:
    """Read stdout/stderr until the process exits, the deadline passes or a cap is exceeded.

    Returns (stdout, stderr, how): how is ``exited``, ``timeout`` or ``output``. Stops at the
    main process's exit rather than at EOF: a daemon holding the pipes must not stall us.
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
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                how = "timeout"
                break
            exited = False
            for key, _ in selector.select(remaining if pidfd is not None else min(remaining, 0.01)):
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
                if not _wait_exit(proc, deadline - time.monotonic()):  # both pipes closed: wait for the exit
                    how = "timeout"
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


