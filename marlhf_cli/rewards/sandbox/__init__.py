"""Run untrusted programs: one process per test, isolated, limited, killed at the deadline.

Model-written code is hostile input (docs/method.md "Program rewards"). Every run gets

* a fresh interpreter in isolated mode (``python -I -S -X utf8``) started through
  ``harness.py``, with an empty environment (nothing of the parent's) and a fresh temporary
  working directory that is removed afterwards;
* resource limits set with ``setrlimit`` by the harness before it even reads the program
  (:func:`.limits.limits_spec` says why not in ``preexec_fn``): CPU seconds, address space,
  processes, file size, open files, no core files;
* a time limit in CPU seconds of all its processes together (each process's RLIMIT_CPU,
  and their sum read from /proc while it runs), so that how busy the machine is never
  turns a crash or a memory error into a timeout; a generous wall-clock backstop
  (:meth:`.limits.Limits.wall_seconds`) for programs that wait without computing; at
  either the whole process group is SIGKILLed (``start_new_session``); caps on the bytes
  of stdout/stderr read back;
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
module (best effort). The uid must be able to run the interpreter: the project's own may
sit under ``/root`` (mode 0700), so the system ``python3`` is tried next
(``MARLHF_SANDBOX_PYTHON`` picks one); sandboxed programs get its standard library
only (``-S``: no site-packages, which also halves start-up time).

One concern per module: :mod:`.containment` (which isolation mode, probed once),
:mod:`.launcher` (how a child is launched in that mode: its command prefix and preexec),
:mod:`.users` (the per-run uids and the clean-up after them), :mod:`.limits` (limits and
how a run's end maps to a status), :mod:`.execution` (one child process, start to reap),
:mod:`.runner` (:func:`run` and the :class:`Sandbox` pool). The code that runs inside the
child is ``harness.py``, beside this package.
"""

from .execution import Execution, Job
from .containment import MODES, isolation
from .launcher import Isolation
from .limits import COMPILE_ERROR, MEMORY_LIMIT, OK, OUTPUT_LIMIT, RUNTIME_ERROR, TIMEOUT, Limits
from .runner import Sandbox, compile_error, run, run_many
from .users import SandboxUnavailable, processes_of

__all__ = [
    "COMPILE_ERROR", "MEMORY_LIMIT", "MODES", "OK", "OUTPUT_LIMIT", "RUNTIME_ERROR", "TIMEOUT",
    "Execution", "Isolation", "Job", "Limits", "Sandbox", "SandboxUnavailable",
    "compile_error", "isolation", "processes_of", "run", "run_many",
]  # fmt: skip
