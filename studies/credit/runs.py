"""One training run of the study, and the resumable pool that runs many (every edition).

A run is (task, arm, learning rate, seed, steps, response tokens): the PPO stage's own
``ppo.run`` on the tiny random-init policy with the task's reward, everything else equal
(the edition's ``stage`` settings, 8 responses per step). Every finished run is a small JSON
file (its per-step score, responses and generated tokens, the CPU it ran on and, from the
second edition on, the protocol hash it ran under), skipped when the study runs again. The
first edition names a run's arm ``config`` and keys its files by steps alone; its jobs are
otherwise the same (:func:`first_edition_job`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import _harness as H

from .protocol import Protocol


def _init_worker(threads: int, log: str) -> None:
    """One torch thread per run; the stage's own console output goes to the log, not the
    study's terminal (the study shows one progress bar)."""
    import os

    import torch

    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch.set_num_threads(threads)
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)


@functools.cache
def task_reward(task: str, model: str = "tiny"):
    from .tasks import TaskReward

    return TaskReward(task, model)


@functools.lru_cache(maxsize=1)
def prompts_file() -> str:
    return str(H.write_prompts(Path(tempfile.mkdtemp(prefix="marlhf-credit-prompts-")) / "prompts.jsonl"))


def first_edition_job(task: str, config: str, flags: dict, stage: dict, lr: float, seed: int, steps: int, tokens: int,
                      responses_per_step: int) -> dict:  # fmt: skip
    """A first-edition run (``first.py``): actor = critic rate ``lr``, ``steps`` steps, the
    stage's cosine schedule; ``stage`` may carry a model and dtype (``gpu_scale.py``)."""
    return {"task": task, "config": config, "lr": lr, "seed": seed, "steps": steps, "tokens": tokens, "flags": dict(flags),
            "stage": dict(stage), "responses_per_step": responses_per_step}  # fmt: skip


def make_job(protocol: Protocol, task: str, arm: str, lr: float, seed: int, steps: int, critic_lr: float | None = None) -> dict:
    """One run. Second edition: ``steps`` steps at actor = critic rate ``lr``. Third: ``steps``
    is a budget of generated tokens (the arm runs the steps it affords) and ``critic_lr`` the
    critic's rate (None for an arm without a critic)."""
    job = {"task": task, "arm": arm, "lr": round(float(lr), 10), "seed": int(seed), "steps": int(steps),
           "tokens": protocol.tokens[task], "flags": protocol.arms[arm].flags, "stage": protocol.stage,
           "responses_per_step": protocol.responses_per_step, "protocol": protocol.digest()}  # fmt: skip
    if protocol.edition >= 3:
        job["budget"] = int(steps)
        job["steps"] = int(steps) // tokens_per_step(protocol, task, arm)
        job["critic_lr"] = None if critic_lr is None or not has_critic(protocol.arms[arm].flags) else round(float(critic_lr), 10)
    return job


JOB_KEYS = ("task", "config", "arm", "lr", "seed", "steps", "tokens", "flags", "stage", "responses_per_step", "protocol", "budget", "critic_lr")


def job_of(record: dict) -> dict:
    """The job a saved record ran (to run it again)."""
    return {key: record[key] for key in JOB_KEYS if key in record}


def rerun(records: list[dict], threads: int = 1, steps: int | None = None) -> list[dict]:
    """The records' jobs run again, one after the other in one fresh process with ``threads``
    torch threads, as a study worker runs its jobs: same inputs, same machine, the same
    numbers bit for bit. ``steps``: only the first steps (at a constant learning rate, the
    third edition's, they are the records' first steps)."""
    jobs = [job_of(record) | ({"steps": steps} if steps else {}) for record in records]
    folder = Path(tempfile.mkdtemp(prefix="marlhf-credit-rerun-"))  # for its runs.log, the stage's console output
    try:
        with Workers(1, threads, folder) as worker:
            futures = [worker.submit(run_job, job) for job in jobs]
            return [future.result() for future in futures]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def has_critic(flags: dict) -> bool:
    return flags.get("advantage", "gae") == "gae"


def tokens_per_step(protocol: Protocol, task: str, arm: str) -> int:
    """Tokens one step generates when every response runs to its length (the study's do: a
    random-init policy's EOS is one token in 49k): the responses, plus for ``mc`` M
    continuations from every kept boundary of every response, each to the response's length
    limit. The study's ``mc`` arms cut fixed segments, so their boundaries are known before
    the run; a run's record keeps the tokens it really generated."""
    from marlhf_cli.macro.montecarlo import kept_boundaries

    flags, length, responses = protocol.arms[arm].flags, protocol.tokens[task], protocol.responses_per_step
    tokens = responses * length
    if flags.get("advantage") == "mc":
        if flags.get("termination") != "fixed":
            raise ValueError(f"arm {arm}: the tokens of an mc step are known in advance for fixed segments only")
        n = int(flags["n"])
        kept = kept_boundaries(-(-length // n), flags.get("mc_max_boundaries"))
        tokens += responses * int(flags["mc_rollouts"]) * sum(length - k * n for k in kept)
    return tokens


def job_path(root: Path, job: dict) -> Path:
    if "config" in job:  # the first edition
        return root / job["task"] / f"{job['config']}-lr{job['lr']:g}-s{job['seed']}-{job['steps']}steps.json"
    if "budget" in job:
        critic = "" if job["critic_lr"] is None else f"-c{job['critic_lr']:g}"
        return root / job["task"] / f"{job['arm']}-lr{job['lr']:g}{critic}-s{job['seed']}-{job['budget']}budget-{job['tokens']}tok.json"
    return root / job["task"] / f"{job['arm']}-lr{job['lr']:g}-s{job['seed']}-{job['steps']}steps-{job['tokens']}tok.json"


def run_job(job: dict) -> dict:
    """Train one job with the stage (in a worker process); its per-step record."""
    import torch

    from marlhf_cli import provenance
    from marlhf_cli.train import ppo

    flags, stage = dict(job["flags"]), dict(job["stage"])
    model = stage.pop("model", "tiny")
    # the first three editions ran before --value-head-init existed: their critics started from
    # the random head that the default now replaces with zeros (their records re-execute bit for bit)
    stage.setdefault("value_head_init", "random")
    group = flags.get("samples_per_prompt", 1)
    work = Path(tempfile.mkdtemp(prefix="marlhf-credit-run-"))
    try:
        config = H.ppo_config(
            work, name="run", policy=model, reward_model=model, dataset=prompts_file(), **flags, **stage,
            rollout_batch_size=job["responses_per_step"] // group, mini_batch_size=job["responses_per_step"],
            max_new_tokens=job["tokens"], actor_lr=job["lr"], critic_lr=job.get("critic_lr") or job["lr"], max_steps=job["steps"],
            eval_every=0, eval_prompts=0, save_every=0, seed=job["seed"],
        )  # fmt: skip
        started = time.perf_counter()
        ppo.run(config, reward_fn=task_reward(job["task"], model))
        seconds = time.perf_counter() - started
        rows = H.train_rows(work, "run")
    finally:
        shutil.rmtree(work, ignore_errors=True)  # a tiny run's checkpoints are ~13 MB each
    return {
        **job,
        "score": [row["score"] for row in rows],
        "responses": [row["responses"] for row in rows],
        "generated_tokens": [row["generated_tokens"] for row in rows],
        "explained_variance": [row.get("explained_variance") for row in rows],  # None without a critic
        "explained_variance_pooled": [row.get("explained_variance_pooled") for row in rows],  # the last 10 steps'
        # from issue 54 on: the actor's lambda (gae) and the paper's Figure 11 norms, per step
        "gae_lambda": [row.get("gae_lambda") for row in rows],
        "advantage_l2": [row.get("advantage_l2") for row in rows],
        "q_l2": [row.get("q_l2") for row in rows],
        # rloo and grpo log none (one advantage per response): a response is their one segment
        "segment_length": statistics.mean(row.get("segment_length", row["response_length"]) for row in rows),
        "step_time": statistics.median(row["step_time"] for row in rows),
        "seconds": seconds,
        "cpu": H.cpu_model(),
        "torch": torch.__version__,
        # what the figures depend on besides the job: marlhf's commit, the libraries, the CPU's
        # model and flags, the GPUs, and the threads (a run re-executed on another CPU departs)
        "provenance": {key: value for key, value in provenance.provenance().items() if key != "command"},
        "threads": torch.get_num_threads(),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def saved(root: Path, jobs: list[dict]) -> list[dict]:
    """The saved records of ``jobs`` (those that have one), in the jobs' order."""
    return [json.loads(job_path(root, job).read_text()) for job in jobs if job_path(root, job).is_file()]


class Workers:
    """A study's worker processes: ``count`` of them, ``threads`` torch threads each, their
    console output appended to ``root/runs.log``. They start at the first job and serve
    every phase after it: a phase waits for the one before, but its workers need not start
    again (each start imports torch and transformers, about 5 CPU-s)."""

    def __init__(self, count: int, threads: int, root: Path):
        self.count, self.threads, self.root = count, threads, root
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, run, job: dict):
        if self._pool is None:
            self.root.mkdir(parents=True, exist_ok=True)
            self._pool = ProcessPoolExecutor(max_workers=self.count, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(self.threads, str(self.root / "runs.log")))  # fmt: skip
        return self._pool.submit(run, job)

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(cancel=kind is not None)


def run_jobs(jobs: list[dict], root: Path, workers: int | Workers, threads: int, label: str = "runs", *, run=None,
             path=None) -> list[dict]:  # fmt: skip
    """Run the jobs not already saved under ``root`` (``workers`` processes at a time, or on
    a study's :class:`Workers`); every job's record, in the jobs' order, as :func:`saved`
    returns them, so a report is the same whether its runs were just trained or only read
    (the power simulation draws from the records in order). The ``mc`` runs (about three
    times as long per step) start first, so no worker waits long at the end. ``run`` (a job
    -> its record, in a worker) and ``path`` ((root, job) -> the record's file) default to
    this module's :func:`run_job` and :func:`job_path`; the fourth edition passes its own."""
    run, job_path_of = run or run_job, path or job_path
    todo = [job for job in jobs if not job_path_of(root, job).is_file()]
    todo.sort(key=lambda job: job["flags"].get("advantage") != "mc")  # stable: the rest keep their order
    if todo:
        from rich.progress import Progress

        from marlhf_cli.artifacts import write_json

        print(f"# {label}: {len(todo)} of {len(jobs)} runs to do ({len(jobs) - len(todo)} saved)", flush=True)
        shared = isinstance(workers, Workers)
        with contextlib.nullcontext(workers) if shared else Workers(workers, threads, root) as pool:
            futures = {pool.submit(run, job): job for job in todo}
            with Progress(transient=False) as progress:
                bar = progress.add_task(label, total=len(todo))
                for future in as_completed(futures):
                    result = future.result()
                    target = job_path_of(root, futures[future])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    write_json(target, result)
                    progress.advance(bar)
    return [json.loads(job_path_of(root, job).read_text()) for job in jobs]
