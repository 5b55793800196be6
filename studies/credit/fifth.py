"""The credit study's fifth edition (issue #55): HH-RLHF dialogue at 135M, after a pilot.

    python -m studies.credit --edition 5 --pilot [--quick] [--report-only] [--out studies/credit]

The edition's protocol is written from its pilot's figures, so for now the runner runs the
pilot: ``fifth/pilot.yaml`` is all it reads. A pilot is never evidence; it answers whether
each of the edition's gates can be passed and what the edition would cost on this machine.
It reuses the fourth edition's course (:mod:`.fourth`: marlhf's own command line for SFT and
the reward models, its gate-1 statistics, its PPO jobs and records), with HH's data
(:mod:`.fifth_data`) in place of TL;DR's. Each phase is resumable: a finished phase is a
committed JSON record under ``<out>/fifth-pilot/``, skipped on a rerun; models and unfinished
runs live under its ``work/`` (not committed). Every record carries the commit, the pilot's
hash, the machine (CPU model and flags) and the torch thread count.

The course:

1. **data**: both HH samples split by conversation (test split set aside, read by nothing
   here), the SFT/RM/PPO shares, the RM share split again into the pilot's training and
   validation pairs (``data.json``).
2. **models**: ``marlhf sft``, then ``marlhf rm`` at each rate on the pilot's training pairs
   (``models.json``).
3. **the reward models' gate**: each on the pilot's validation pairs against the better length
   rule, as gate 1 will be on the test pairs (``rm-gate.json``); the better one goes on. Where
   none passes, the pilot stops here and reports (the issue: a gate that cannot be passed is a
   result).
4. **the critic's fit**: the token-PPO arm's warm-up at each critic rate; gate 2's figure, the
   pooled explained variance over its 10 steps (``critic/``).
5. **one token-PPO run**: its held-out RM-score curve and its cost (``curve/``).
6. **the report**: ``pilot-report.md``, from the records alone (``--report-only`` writes it
   again from them).
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from types import SimpleNamespace

from . import fourth
from .fifth_report import gate1_passable
from .fourth import _record, model_paths, pick, pooled_fit, ppo_job, ppo_path, run_ppo
from .protocol import HERE
from .runs import REPO, H, Workers, run_jobs

PILOT = HERE / "fifth" / "pilot.yaml"
SHARED_HH = REPO.parent / "shared" / "data" / "hh-rlhf"


def stamp(settings: dict, threads: int) -> dict:
    """What every record of the pilot carries besides its figures: the commit and libraries,
    the pilot's hash, the machine and the thread count."""
    from marlhf_cli import provenance

    return {"protocol": settings["digest"], "threads": threads,
            "provenance": {key: value for key, value in provenance.provenance().items() if key != "command"},
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}  # fmt: skip


def prepare_data(settings: dict, work: Path, shared: Path | None):
    """The derived files (fifth_data.prepare) and data.json's figures: the counts, the files'
    hash, and the length rules on the pilot's validation pairs and on each source."""
    from marlhf_cli.models import load_tokenizer

    from . import fourth_stats as S
    from .fifth_data import digest, lengths, prepare, read_pairs
    from .fourth_data import read_jsonl

    pairs, skipped, source = read_pairs(shared)
    data = settings["data"]
    tokenizer = load_tokenizer(settings["model"])
    files, summary = prepare(pairs, work / "data", tokenizer, prompt_tokens=data["prompt_tokens"], test_share=data["test_share"],
                             pilot_val_share=data["pilot_val_share"], seed=data["split_seed"])  # fmt: skip
    val = lengths(read_jsonl(files.pilot_val), tokenizer)
    rules = {rule: sum(S.length_rule(val["chosen"], val["rejected"], rule)) / max(len(val["chosen"]), 1) for rule in ("longer", "shorter")}
    return files, {"source": source, "skipped": skipped, **summary, "files": digest(files), "pilot_val_length_rules": rules}


def reward_model_gate(settings: dict, files, work: Path, models: dict, threads: int) -> dict:
    """Each reward model of the grid on the pilot's validation pairs (fourth.gate_one against
    the better length rule); the rate of the best accuracy (ties: the lower) is picked."""
    rules = tuple(settings["gate1"]["length_rules"])
    results = {}
    for lr in settings["rm"]["lrs"]:
        started = time.perf_counter()
        gate = fourth.gate_one(settings, files.pilot_val, model_paths(work, lr)["rm"], rules)
        results[f"{lr:g}"] = {**{k: v for k, v in gate.items() if not k.endswith("_scores")}, "seconds": time.perf_counter() - started}
    picked = pick({lr: results[f"{lr:g}"]["accuracy"] for lr in settings["rm"]["lrs"]})
    return {"by_lr": results, "picked_rm_lr": picked, "rm_digest": models["rm"][f"{picked:g}"]["digest"], **stamp(settings, threads)}


def run(args) -> int:
    settings = fourth.load("quick" if args.quick else "full", args.protocol or PILOT)
    root = args.out / settings["folder"]
    with Workers(1, settings["threads"], root) as workers:  # the pilot's PPO runs, one at a time on its core
        return _course(args, settings, root, workers)


def _course(args, settings: dict, root: Path, workers: Workers) -> int:
    work = root / "work"
    threads = settings["threads"]
    print(H.machine_line())
    print(f"# fifth edition, pilot {settings['digest']} ({settings['mode']}): {threads} thread(s); records under {root}", flush=True)
    if args.report_only:
        return write_report(settings, root)
    shared = None if args.quick else SHARED_HH
    files, data = prepare_data(settings, work, shared)
    _record(root / "data.json", lambda: {**data, **stamp(settings, threads)})

    def train_models() -> dict:
        # the reward models learn from the pilot's training pairs only (fourth.train_models reads rm_train)
        started = time.perf_counter()
        models = fourth.train_models(settings, SimpleNamespace(sft=files.sft, rm_train=files.pilot_train), work, 1)
        return {**models, "seconds": round(time.perf_counter() - started, 1), **stamp(settings, threads)}

    models = _record(root / "models.json", train_models)
    gate = _record(root / "rm-gate.json", lambda: reward_model_gate(settings, files, work, models, threads))
    models = {**models, "picked_rm_lr": gate["picked_rm_lr"]}  # the pilot's pick, on its validation pairs
    if not gate1_passable(gate):
        # issue 55: a pilot that shows a gate cannot be passed says so with its figures and stops there
        workers.close()
        return write_report(settings, root)

    def runner(jobs: list[dict], label: str) -> list[dict]:
        return run_jobs(jobs, root, workers, threads, label, run=run_ppo, path=ppo_path)

    c, warmup = settings["critic"], settings["ppo"]["warmup_steps"]
    critic_jobs = [ppo_job(settings, models, work, "critic", c["arm"], c["actor_lr"], lr, c["seed"], warmup + 1,
                           eval_every=0, eval_prompts=0) for lr in c["lrs"]]  # fmt: skip
    critic_records = runner(critic_jobs, "critic rate")
    critic_lr = pick({job["critic_lr"]: pooled_fit(r, warmup) for job, r in zip(critic_jobs, critic_records)})
    k = settings["curve"]
    runner([ppo_job(settings, models, work, "curve", k["arm"], k["actor_lr"], critic_lr, k["seed"], k["steps"])], "token-PPO curve")
    workers.close()
    return write_report(settings, root)


def write_report(settings: dict, root: Path) -> int:
    """``pilot-report.md`` from the records (fifth_report.pilot_lines), also printed."""
    from .fifth_report import pilot_lines

    lines = pilot_lines(settings, root)
    (root / "pilot-report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


def records_of(root: Path, phase: str) -> list[dict]:
    """The saved PPO records of one phase, by file name."""
    return [json.loads(path.read_text()) for path in sorted((root / phase).glob("*.json"))]
