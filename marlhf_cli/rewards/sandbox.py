"""Run untrusted programs: one process per test, isolated, limited, killed at the deadline.

Model-written code is hostile input (docs/method.md "Program rewards"). Every run gets

* a fresh interpreter in isolated mode (``python -I -S -X utf8``) started through
  :mod:`.harness`, with an empty environment (nothing of the parent's) and a fresh temporary
  working directory that is removed afterwards;
* resource limits set with ``setrlimit`` by the harness before it even reads the program
  (:func:`limits_spec` says why not in ``preexec_fn``): CPU seconds, address space,
  processes, file size, open files, no core files;
* a wall-clock deadline, after which the whole process group is SIGKILLed
  (``start_new_session``), and caps on the bytes of stdout/stderr read back;
* containment of process trees, which depends on what the OS allows (:func:`isolation`):

  ``namespaces`` (root with CAP_SYS_ADMIN: the usual CI and GPU box)
      ``unshare --pid --fork --kill-child --net --setgid U --setuid U``: the program is
      pid 1 of its own PID namespace, so when it ends the kernel kills everything it left
      (double-forked daemons included) and reaps it; its network namespace has only a
      downed loopback; it runs as an unprivileged uid ``U`` of its own, where RLIMIT_NPROC
      *is* enforced (root ignores it, so a fork bomb would not be contained as root).
  ``setuid`` (root without namespaces, e.g. a default Docker container)
      the child drops to uid ``U`` through ``setpriv`` (or ``preexec_fn`` where it is
      missing, with a network namespace if allowed); after the run every process of ``U``
      is killed with ``kill(-1)`` issued *as* ``U``, and this process becomes a child
      subreaper so orphans' zombies are reaped here instead of piling up under a PID 1
      that does not reap.
  ``userns`` / ``rlimits`` (not root)
      ``unshare --user --map-root-user --pid --net`` when unprivileged user namespaces are
      allowed, else limits and the process group only. Not root means the program runs as
      the user: it can read what the user can (including ``/proc/<parent>/environ``), and a
      ``setsid`` daemon escapes in the ``rlimits`` mode. :func:`isolation` says which mode
      is in force; run training as root (or in a VM/container) for full containment.

Each concurrent run gets its own uid ``U`` (default 64000 + k, claimed across processes
with an abstract unix socket per uid), so its process count, its files and the ``kill(-1)``
sweep never touch another run; what ``U`` left at the top of /tmp, /var/tmp or /dev/shm is
removed after the run. Not covered: disk use (RLIMIT_FSIZE bounds each file, not their
number) and reads of world-readable files; a VM or container is the boundary for those.
Where sockets cannot be isolated by a namespace, the harness disables the ``socket``
module (best effort). The uid must be able to run the interpreter:
the project's own may sit under ``/root`` (mode 0700), so the system ``python3`` is tried
next (``MARLHF_SANDBOX_PYTHON`` picks one); sandboxed programs get its standard library
only (``-S``: no site-packages, which also halves start-up time).
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import UserError
from .harness import compile_program

HARNESS_SOURCE = Path(__file__).with_name("harness.py").read_text(encoding="utf-8")
EXIT_COMPILE, EXIT_MEMORY, EXIT_NO_FUNCTION, EXIT_BAD_RESULT, EXIT_CPU, EXIT_SETUP = 111, 112, 113, 114, 115, 116

# what one execution ended in
OK = "ok"
RUNTIME_ERROR = "runtime_error"
TIMEOUT = "timeout"
MEMORY_LIMIT = "memory_limit"
OUTPUT_LIMIT = "output_limit"
COMPILE_ERROR = "compile_error"

UID_BASE = int(os.environ.get("MARLHF_SANDBOX_UID_BASE", "64000"))
UID_COUNT = 512
STDERR_KEEP = 4000  # characters of stderr kept for diagnostics
CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER = 36


class SandboxUnavailable(UserError):
    """No way to run programs with the containment this module promises (one line for users)."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``cpu`` defaults to ``ceil(time)``; the CPU hard limit is one more second."""

    time: float = 4.0  # wall-clock seconds
    cpu: float | None = None  # CPU seconds (RLIMIT_CPU)
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    processes: int = 16  # processes + threads at once (RLIMIT_NPROC)
    output_bytes: int = 8 << 20  # stdout (and, separately, stderr) bytes read back
    file_bytes: int = 16 << 20  # largest file it may write (RLIMIT_FSIZE)
    open_files: int = 64  # RLIMIT_NOFILE

    def cpu_seconds(self) -> int:
        return max(1, math.ceil(self.cpu if self.cpu is not None else self.time))


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


def compile_error(source: str) -> str | None:
    """The reason ``source`` does not compile (checked here, before spending a process), else None."""
    try:
        compile_program(source)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as err:
        return f"{type(err).__name__}: {err}"
    return None


# ---------------------------------------------------------------------------------------
# which isolation the OS gives us (probed once per process)


@dataclass
class Isolation:
    """What :func:`isolation` found. ``launcher``: how the child gets its uid and namespaces
    (``unshare``/``setpriv`` commands in front of the interpreter, or ``preexec`` when only
    a ``preexec_fn`` can do it, or ``none``)."""

    mode: str  # namespaces | setuid | userns | rlimits
    python: str
    network: str  # namespace | socket-patch
    uids: "UidPool | None" = None
    launcher: str = "none"  # unshare | setpriv | preexec | none
    netns_in_preexec: bool = False

    def prefix(self, uid: int | None) -> list[str]:
        """The command that wraps the interpreter (namespaces and uid switch), if any."""
        if self.launcher == "unshare" and self.mode == "namespaces":
            return [_UNSHARE, "--pid", "--fork", "--kill-child", "--net", "--setgid", str(uid), "--setuid", str(uid), "--"]
        if self.launcher == "unshare":
            return [_UNSHARE, "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--net", "--"]
        if self.launcher == "setpriv":
            return [_SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return []

    def preexec(self, uid: int | None) -> Callable[[], None] | None:
        """Only the setuid mode without ``setpriv`` needs one (it forces a slow fork)."""
        return _drop_privileges(uid, self.netns_in_preexec) if self.launcher == "preexec" and uid is not None else None

    def describe(self) -> str:
        users = {
            "namespaces": "own uid per run, PID + network namespaces",
            "setuid": "own uid per run, kill(-1) sweep and subreaper",
            "userns": "user + PID + network namespaces (not root)",
            "rlimits": "limits and process group only (not root, no namespaces)",
        }[self.mode]
        return f"{self.mode}: {users}; network: {self.network}; launcher: {self.launcher}; python: {self.python}"


_UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
_SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
# the uid, and whether this is a whole interpreter of 3.8+ (an executable whose own library
# is unreadable to the uid may start with another installation's: not acceptable)
_PROBE = (
    "import os, sys, json; print(os.getuid(), sys.version_info[:2] >= (3, 8) and "
    "os.path.realpath(sys.executable).startswith(os.path.realpath(sys.base_prefix) + os.sep))"
)
MODES = ("namespaces", "setuid", "userns", "rlimits")
_isolations: dict[str | None, Isolation] = {}
_isolation_lock = threading.Lock()


def isolation(mode: str | None = None) -> Isolation:
    """The strongest containment this process can set up (probed once), or the named ``mode``.

    ``MARLHF_SANDBOX_MODE`` names a mode too (tests use it to exercise the fallbacks); a mode
    the OS does not allow raises :class:`SandboxUnavailable`, as does having none at all.
    """
    mode = mode or os.environ.get("MARLHF_SANDBOX_MODE") or None
    if mode is not None and mode not in MODES:
        raise SandboxUnavailable(f"unknown sandbox mode '{mode}': expected one of {', '.join(MODES)}")
    with _isolation_lock:
        if mode not in _isolations:
            _isolations[mode] = _probe(mode)
        return _isolations[mode]


def _interpreters() -> list[str]:
    chosen = os.environ.get("MARLHF_SANDBOX_PYTHON")
    names = [chosen] if chosen else []
    names += [sys.executable, os.path.realpath(sys.executable), getattr(sys, "_base_executable", "")]
    names += ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3", shutil.which("python3") or ""]
    seen, out = set(), []
    for name in names:
        if name and os.path.isfile(name) and os.path.realpath(name) not in seen:
            seen.add(os.path.realpath(name))
            out.append(name)
    return out


def _works(candidate: Isolation, uid: int | None) -> bool:
    """Run the probe program exactly as programs will be run (harness, limits, launcher)."""
    workdir = tempfile.mkdtemp(prefix="marlhf-sandbox-probe-", dir=_temp_root())
    try:
        execution, _ = _run_in(Job(_PROBE), Limits(time=20.0), candidate, uid, workdir)
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    words = execution.stdout.split()
    return execution.status == OK and len(words) == 2 and words[1] == "True" and (uid is None or words[0] == str(uid))


def _probe(only: str | None = None) -> Isolation:
    def wanted(mode: str) -> bool:
        return only is None or only == mode

    pythons = _interpreters()
    unshare, setpriv = os.path.exists(_UNSHARE), os.path.exists(_SETPRIV)
    if os.geteuid() != 0:
        for python in pythons:
            userns = Isolation("userns", python, "namespace", launcher="unshare")
            if wanted("userns") and unshare and _works(userns, None):
                return userns
            plain = Isolation("rlimits", python, "socket-patch")
            if wanted("rlimits") and _works(plain, None):
                _become_subreaper()  # killed programs' children are reaped here (by session)
                return plain
        raise SandboxUnavailable(f"no sandbox mode {only or ''} works here (tried {', '.join(pythons)})")
    pool = UidPool(UID_BASE, UID_COUNT)
    uid = pool.acquire()
    try:
        for python in pythons:
            candidates = []
            if wanted("namespaces") and unshare:
                candidates.append(Isolation("namespaces", python, "namespace", uids=pool, launcher="unshare"))
            if wanted("setuid") and setpriv:
                candidates.append(Isolation("setuid", python, "socket-patch", uids=pool, launcher="setpriv"))
            if wanted("setuid"):
                netns = Isolation("setuid", python, "namespace", uids=pool, launcher="preexec", netns_in_preexec=True)
                candidates += [netns, dataclasses.replace(netns, network="socket-patch", netns_in_preexec=False)]
            for candidate in candidates:
                if _works(candidate, uid):
                    # orphans of killed programs (or a namespace's init, should unshare die
                    # first) are reparented here and reaped, not left to a PID 1 that may not
                    _become_subreaper()
                    return candidate
    finally:
        pool.release(uid)
    if only in ("userns", "rlimits"):
        raise SandboxUnavailable(f"sandbox mode '{only}' is for non-root users; this process runs as root")
    raise SandboxUnavailable(
        f"no Python interpreter can be run by the unprivileged sandbox uid {uid} (tried {', '.join(pythons)}): "
        "install a system python3 readable by all users, or set MARLHF_SANDBOX_PYTHON"
    )


def _libc_unshare(flags: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")


def _drop_privileges(uid: int, netns: bool) -> Callable[[], None]:
    def drop() -> None:
        if netns:
            _libc_unshare(CLONE_NEWNET)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return drop


def _become_subreaper() -> None:
    """Orphans of sandboxed programs get reparented here (and reaped by the sweep)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------------------------------
# one uid per concurrent run


class UidPool:
    """Unprivileged uids for sandboxed runs, each used by one run at a time.

    A uid is claimed for the life of this process by binding an abstract unix socket named
    after it, so two marlhf processes (two ranks, two test workers) never share one; uids
    that have a user in /etc/passwd, or processes that cannot be cleared, are skipped.
    """

    def __init__(self, base: int, count: int):
        self._candidates = list(range(base, base + count))
        self._free: list[int] = []
        self._claims: dict[int, socket.socket] = {}
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
            while self._candidates:
                uid = self._candidates.pop(0)
                if self._claim(uid):
                    return uid
        raise SandboxUnavailable(f"no free sandbox uid left in {UID_BASE}..{UID_BASE + UID_COUNT - 1}")

    def claimed(self) -> list[int]:
        """Every uid this process has claimed (in use or free)."""
        with self._lock:
            return sorted(self._claims)

    def release(self, uid: int, clean: bool = True) -> None:
        with self._lock:
            if clean:
                self._free.append(uid)

    def _claim(self, uid: int) -> bool:
        import pwd

        try:
            pwd.getpwuid(uid)
            return False  # a real account: not ours to use
        except KeyError:
            pass
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0marlhf-sandbox-uid-{uid}")
        except OSError:
            claim.close()
            return False
        if processes_of(uid) and not sweep(uid, None):
            claim.close()
            return False
        self._claims[uid] = claim
        return True


def _status_fields(pid: str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def processes_of(uid: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, state) of every process whose real or saved uid is ``uid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        status = _status_fields(name)
        uids = status.get("Uid", "").split()
        if len(uids) >= 4 and str(uid) in (uids[0], uids[2]):
            found.append((int(name), int(status.get("PPid", "0").strip() or 0), status.get("State", "").strip()[:1]))
    return found


def sweep(uid: int, python: str | None, rounds: int = 50) -> bool:
    """Kill every process of ``uid`` (``kill(-1)`` issued as that uid) and reap our orphans.

    True when none is left. Zombies whose parent is not this process cannot be reaped here;
    they make the uid unusable (they count against its process limit).
    """
    python = python or sys.executable
    me = os.getpid()
    for _ in range(rounds):
        left = processes_of(uid)
        for pid, parent, state in left:
            if parent == me:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        left = processes_of(uid)
        if not left:
            return True
        if all(state == "Z" and parent != me for _, parent, state in left):
            time.sleep(0.02)  # zombies of someone else: wait for their parent to reap them
            continue
        try:
            subprocess.run(
                [python, "-I", "-S", "-c", "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass"],
                user=uid, group=uid, extra_groups=[], env={}, cwd="/", timeout=10,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            for pid, _, _ in left:
                _kill(pid)
        time.sleep(0.005)
    return not processes_of(uid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------
# one run


_ENV_BASE = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _environment(workdir: str) -> dict[str, str]:
    """A clean environment: nothing inherited from the parent (its secrets stay there)."""
    return {
        **_ENV_BASE, "HOME": workdir, "TMPDIR": workdir, "MALLOC_ARENA_MAX": "2",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
    }  # fmt: skip


def _tasks_of_user(uid: int) -> int:
    """Processes + threads of ``uid`` now (RLIMIT_NPROC counts them all, per user)."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            status = _status_fields(name)
            if status.get("Uid", "").split()[:1] == [str(uid)]:
                total += int(status.get("Threads", "1").strip() or 1)
    return total


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


def run(job: Job, limits: Limits | None = None, iso: Isolation | None = None) -> Execution:
    """Run one program on one input under :func:`isolation` (blocking; thread-safe)."""
    limits = job.limits or limits or Limits()
    problem = compile_error(job.source)
    if problem is not None:
        return Execution(COMPILE_ERROR, detail=problem)
    iso = iso or isolation()
    uid = iso.uids.acquire() if iso.uids is not None else None
    workdir = tempfile.mkdtemp(prefix="marlhf-sandbox-", dir=_temp_root())
    clean = True
    try:
        execution, clean = _run_in(job, limits, iso, uid, workdir)
        return execution
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            iso.uids.release(uid, clean)


def _temp_root() -> str:
    root = os.environ.get("MARLHF_SANDBOX_TMPDIR") or "/tmp"
    return root if os.path.isdir(root) else tempfile.gettempdir()


def _run_in(job: Job, limits: Limits, iso: Isolation, uid: int | None, workdir: str) -> tuple[Execution, bool]:
    import json

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
        nproc = _tasks_of_user(os.getuid()) + limits.processes
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
        _remove_litter(uid)
    err_text = stderr.decode("utf-8", "replace")[-STDERR_KEEP:]
    out_text = stdout.decode("utf-8", "replace")
    status = _classify(ended, returncode, err_text, limits, cpu_seconds)
    if ended == "timeout":
        detail = f"wall-clock limit of {limits.time:g} s exceeded"
    elif status == TIMEOUT:
        detail = f"CPU limit of {limits.cpu_seconds()} s exceeded ({cpu_seconds:.2f} s used)"
    elif ended == "output":
        detail = f"more than {limits.output_bytes} bytes of output"
    else:
        detail = _detail(status, returncode, err_text)
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
            _kill(child)
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


LITTER_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _remove_litter(uid: int) -> None:
    """Remove what the run's uid left in the world-writable temp folders (top level only).

    Its processes are all gone by now, so nothing races the removal; links are unlinked,
    never followed (``rmtree`` refuses them and walks directories by descriptor).
    """
    for folder in LITTER_DIRS:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


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
        return [int(name) for name in os.listdir("/proc") if name.isdigit() and _status_fields(name).get("PPid", "").strip() == str(pid)]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(ended: str, returncode: int, stderr: str, limits: Limits, cpu_seconds: float) -> str:
    if ended == "timeout":
        return TIMEOUT
    if ended == "output":
        return OUTPUT_LIMIT
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


def _detail(status: str, returncode: int, stderr: str) -> str:
    if status == OK:
        return ""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if returncode is not None and returncode < 0:
        try:
            last = f"killed by {signal.Signals(-returncode).name}" + (f"; {last}" if last else "")
        except ValueError:
            pass
    return last[:300]


# ---------------------------------------------------------------------------------------
# many runs at once


class Sandbox:
    """A bounded pool running jobs in parallel (threads, each driving one subprocess)."""

    def __init__(self, limits: Limits | None = None, max_workers: int | None = None, mode: str | None = None):
        self.limits = limits or Limits()
        self.max_workers = max_workers or default_workers()
        self.isolation = isolation(mode)
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="marlhf-sandbox")

    def submit(self, job: Job) -> Future:
        return self._pool.submit(run, job, self.limits, self.isolation)

    def run(self, job: Job) -> Execution:
        return self.submit(job).result()

    def map(self, jobs: Iterable[Job]) -> list[Execution]:
        return [future.result() for future in [self.submit(job) for job in jobs]]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def run_many(jobs: Sequence[Job], limits: Limits | None = None, max_workers: int | None = None) -> list[Execution]:
    with Sandbox(limits, max_workers) as sandbox:
        return sandbox.map(jobs)
