"""How a sandboxed child is launched in its containment mode: :class:`Isolation`, the mode
:func:`~.containment.isolation` found, with the command that wraps the interpreter (its uid
and namespaces) or the ``preexec_fn`` that sets them. Apart from the probing
(:mod:`.containment`), which runs children to find a mode, and from the running
(:mod:`.execution`), which launches them in it: both read this, neither reads the other's
types.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable

from .users import UidPool

CLONE_NEWNET = 0x40000000
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"


@dataclass
class Isolation:
    """What :func:`~.containment.isolation` found. ``launcher``: how the child gets its uid and namespaces
    (``unshare``/``setpriv`` commands in front of the interpreter, or ``preexec`` when only
    a ``preexec_fn`` can do it, or ``none``)."""

    mode: str  # namespaces | setuid | userns | rlimits
    python: str
    network: str  # namespace | socket-patch
    uids: UidPool | None = None
    launcher: str = "none"  # unshare | setpriv | preexec | none
    netns_in_preexec: bool = False

    def prefix(self, uid: int | None) -> list[str]:
        """The command that wraps the interpreter (namespaces and uid switch), if any."""
        if self.launcher == "unshare" and self.mode == "namespaces":
            return [UNSHARE, "--pid", "--fork", "--kill-child", "--net", "--setgid", str(uid), "--setuid", str(uid), "--"]
        if self.launcher == "unshare":
            return [UNSHARE, "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--net", "--"]
        if self.launcher == "setpriv":
            return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
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
