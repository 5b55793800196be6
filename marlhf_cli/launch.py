"""Who started this process, and ``--nproc N``: the same command again under torchrun.

A plain ``marlhf sft`` is one process, and :func:`marlhf_cli.engine.init_distributed` sets
the variables a launcher would (marked by :data:`SELF_LAUNCHED`, so that they are told apart
from a real launcher's and kept from child processes). ``--nproc N`` re-runs the command as
``python -m torch.distributed.run --nproc_per_node N -m marlhf_cli.cli`` and waits for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from typing import Sequence

from .errors import Terminated

LAUNCHER_VARS = ("LOCAL_RANK", "WORLD_SIZE", "RANK")
SELF_LAUNCHED = "MARLHF_SINGLE_PROCESS"  # marks launcher variables that we set ourselves
LOCK_HELD = "MARLHF_LOCK_HELD"  # set for --nproc's children: the relaunching process holds the output lock


def launched() -> bool:
    """Whether a launcher (torchrun, the deepspeed launcher) started this process."""
    return all(name in os.environ for name in LAUNCHER_VARS) and SELF_LAUNCHED not in os.environ


def launcher_free_env() -> dict[str, str]:
    """This process's environment without the single-process variables :func:`marlhf_cli.engine.init_distributed` set.

    A child process (``--nproc`` relaunch, a test's subprocess) must not inherit them: it
    would take itself for rank 0 of our one-process group, on our port.
    """
    env = dict(os.environ)
    if SELF_LAUNCHED in env:
        for name in (*LAUNCHER_VARS, "MASTER_ADDR", "MASTER_PORT", SELF_LAUNCHED):
            env.pop(name, None)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N`` (the children must not relaunch)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        if arg.startswith("--nproc="):
            continue
        out.append(arg)
    return out


RELAUNCH_ARGV = "MARLHF_RELAUNCH_ARGV"  # the command's arguments, for the processes torchrun starts


def relaunch_command(nproc: int) -> list[str]:
    """The torchrun command line that runs ``marlhf`` in ``nproc`` processes.

    The command's own arguments travel in the environment (:data:`RELAUNCH_ARGV`, read back
    by :func:`relaunched_argv`), not after the module name: torchrun's parser takes a
    ``--n 3`` there for an abbreviation of its own ``--nnodes``/``--nproc_per_node``.
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        "-m", "marlhf_cli.cli",
    ]  # fmt: skip


def relaunched_argv() -> list[str] | None:
    """In a process :func:`maybe_relaunch` started, the command's arguments (once: the
    variable is removed, so the process's own children do not inherit them); else None."""
    value = os.environ.pop(RELAUNCH_ARGV, None)
    return None if value is None else json.loads(value)


def maybe_relaunch(nproc: int, argv: Sequence[str] | None = None) -> int | None:
    """Run the command under torchrun when ``--nproc`` > 1 and no launcher started us.

    Returns the launcher's exit code (the caller exits with it), or None to go on in this
    process. ``argv`` defaults to this process's arguments after the program name.
    """
    if nproc is None or nproc <= 1 or launched():
        return None
    if argv is None:
        argv = sys.argv[1:]
    env = launcher_free_env()
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env[RELAUNCH_ARGV] = json.dumps(strip_nproc(argv))
    env[LOCK_HELD] = "1"  # this process holds the stage's output lock for its children (RunDir.writing)
    with subprocess.Popen(relaunch_command(nproc), env=env) as launcher:
        try:
            return launcher.wait()
        except KeyboardInterrupt as stop:
            # Ctrl-C at a terminal reached torchrun too (one process group); a SIGTERM may have
            # reached only this process: pass it on, so that torchrun stops its workers and each
            # marks the run interrupted, rather than leaving them running without a parent
            if isinstance(stop, Terminated):
                launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                launcher.kill()
            raise
