"""Which containment the OS allows, probed once per process: :func:`isolation`, an
:class:`~.launcher.Isolation`.

The modes are described in the package docstring. A mode counts as available only when a
probe program, run exactly as programs will be run (harness, limits, launcher, uid), reports
the expected uid from a whole interpreter of 3.8+; none available raises
:class:`~.users.SandboxUnavailable`. Kept apart from the running itself because it is the
part that differs from machine to machine.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from .execution import Job, run_in, temp_root
from .launcher import SETPRIV, UNSHARE, Isolation
from .limits import OK, Limits
from .users import UID_BASE, UID_COUNT, SandboxUnavailable, UidPool

PR_SET_CHILD_SUBREAPER = 36


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
    workdir = tempfile.mkdtemp(prefix="marlhf-sandbox-probe-", dir=temp_root())
    try:
        execution, _ = run_in(Job(_PROBE), Limits(time=5.0, wall=30.0), candidate, uid, workdir)
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
    unshare, setpriv = os.path.exists(UNSHARE), os.path.exists(SETPRIV)
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


def _become_subreaper() -> None:
    """Orphans of sandboxed programs get reparented here (and reaped by the sweep)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
