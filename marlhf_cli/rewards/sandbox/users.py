"""One unprivileged uid per concurrent run: claiming it, and clearing what it left behind.

A run's own uid is what makes its process limit, its files and the ``kill(-1)`` sweep its
own (the package docstring says why); this module owns the uids: :class:`UidPool` claims
them across processes, :func:`processes_of` and :func:`sweep` find and kill a uid's
processes, :func:`remove_litter` deletes its files in the shared temp folders.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ...errors import UserError

UID_BASE = int(os.environ.get("MARLHF_SANDBOX_UID_BASE", "64000"))
UID_COUNT = 512
LITTER_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


class SandboxUnavailable(UserError):
    """No way to run programs with the containment this package promises (one line for users)."""


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


def status_fields(pid: str) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status`` (empty when the process is gone)."""
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
        status = status_fields(name)
        uids = status.get("Uid", "").split()
        if len(uids) >= 4 and str(uid) in (uids[0], uids[2]):
            found.append((int(name), int(status.get("PPid", "0").strip() or 0), status.get("State", "").strip()[:1]))
    return found


def tasks_of_user(uid: int) -> int:
    """Processes + threads of ``uid`` now (RLIMIT_NPROC counts them all, per user)."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            status = status_fields(name)
            if status.get("Uid", "").split()[:1] == [str(uid)]:
                total += int(status.get("Threads", "1").strip() or 1)
    return total


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
                kill(pid)
        time.sleep(0.005)
    return not processes_of(uid)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def remove_litter(uid: int) -> None:
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
