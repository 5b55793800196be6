"""The entry points: :func:`run` for one job, :class:`Sandbox` for many at once.

:func:`run` checks that the program compiles (no process is spent on one that does not),
takes a uid from the isolation's pool and a fresh working directory, and gives both back
afterwards; :class:`Sandbox` runs jobs in parallel on a bounded pool of threads, each driving
one subprocess.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Sequence

from ..harness import compile_program
from .execution import Execution, Job, run_in, temp_root
from .containment import isolation
from .launcher import Isolation
from .limits import COMPILE_ERROR, Limits


def compile_error(source: str) -> str | None:
    """The reason ``source`` does not compile (checked here, before spending a process), else None."""
    try:
        compile_program(source)
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def run(job: Job, limits: Limits | None = None, iso: Isolation | None = None) -> Execution:
    """Run one program on one input under :func:`isolation` (blocking; thread-safe)."""
    limits = job.limits or limits or Limits()
    problem = compile_error(job.source)
    if problem is not None:
        return Execution(COMPILE_ERROR, detail=problem)
    iso = iso or isolation()
    uid = iso.uids.acquire() if iso.uids is not None else None
    workdir = tempfile.mkdtemp(prefix="marlhf-sandbox-", dir=temp_root())
    clean = True
    try:
        execution, clean = run_in(job, limits, iso, uid, workdir)
        return execution
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:
            iso.uids.release(uid, clean)


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
