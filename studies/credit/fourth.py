"""The credit study's fourth edition (issue #43): MA-PPO against token PPO on real TL;DR text,
SmolLM2-135M, a critic started from the reward model. ``fourth/PROTOCOL.md`` is its protocol,
``fourth/protocol.yaml`` the settings this module reads and nothing else.

    python -m studies.credit --edition 4 [--quick] [--workers 2] [--report-only] [--out studies/credit]

The course, each phase resumable (a finished run is a committed JSON record, skipped on a
rerun; models and unfinished runs live under ``<folder>/work/``, not committed):

1. **data** (:mod:`.fourth_data`): the comparisons and the reference posts split by post,
   prompts cut to fit.
2. **models**: ``marlhf sft`` on the demonstrations, then ``marlhf rm`` from it at each rate of
   the grid, each through marlhf's own command line as a user runs it; the reward model with
   the best accuracy on the stage's own held-out pairs is kept (``models.json``).
3. **gate 1** (:mod:`.fourth_stats`): the reward model on the test pairs against the length
   baseline (``gate1.json``). A failed gate stops the edition (quick mode goes on).
4. **the critic's rate**: the baseline arm's warm-up at each critic rate; the best pooled
   explained variance over the warm-up is the rate; **gate 2** asks it to be at least the bar.
5. **the actor's rate**: the baseline arm at each actor rate on the tuning seeds; the best mean
   final held-out score is the rate of every arm.
6. **the reported runs**: every arm on the reported seeds, at those rates.
7. **the judge**: ``marlhf judge --rm`` of the two judged arms' final samples, seed by seed.
8. **the report**: the gates, the tables, the speedups with Holm and the rule's verdicts, the
   README's sentences, the deviations and the cost.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from . import fourth_stats as S
from .protocol import HERE
from .runs import REPO, H, Workers, run_jobs

PROTOCOL = HERE / "fourth" / "protocol.yaml"
SHARED_TLDR = REPO.parent / "shared" / "data" / "tldr"
MODES = ("full", "quick")


# ---------------------------------------------------------------------------------------
# the protocol


def load(mode: str = "full", path: Path = PROTOCOL) -> dict:
    """The settings of ``mode``: the file's shared keys with the mode's own on top (one level
    deep), plus ``digest``, a short hash of everything that decides what a run is."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if mode not in document.get("modes", {}):
        raise ValueError(f"protocol {path} has no mode {mode!r}")
    settings = {key: copy.deepcopy(value) for key, value in document.items() if key != "modes"}
    for key, value in document["modes"][mode].items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    settings["mode"] = mode
    settings["digest"] = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return settings


# ---------------------------------------------------------------------------------------
# phases 1-2: data and models, through marlhf's own command line


def _cli(args: list, *, threads: int, log: Path) -> None:
    """``marlhf ARGS`` in a subprocess (its output appended to ``log``); a failure stops the study."""
    env = H.child_env(threads) | {"CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "marlhf_cli.cli", *map(str, args)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"\n$ {' '.join(command[2:])}\n")
        handle.flush()
        done = subprocess.run(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"marlhf {args[0]} failed (exit {done.returncode}); its output is in {log}")


def _finished(stage_dir: Path) -> bool:
    return (stage_dir / "config.json").is_file()


def _has_checkpoint(stage_dir: Path) -> bool:
    return any(stage_dir.glob("checkpoints/**/latest"))


def weights_digest(folder: Path) -> str:
    """A short hash of a model folder's weights (its safetensors files)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:12]


def _stage_metrics(run_dir: Path, stage: str) -> dict:
    return json.loads((run_dir / "run.json").read_text())["stages"][stage]["metrics"]


def prepare_data(settings: dict, work: Path, shared: Path | None):
    from marlhf_cli.models import load_tokenizer

    from .fourth_data import prepare, read_sources

    comparisons, references, source = read_sources(shared)
    data = settings["data"]
    files, summary = prepare(
        comparisons, references, work / "data", load_tokenizer(settings["model"]), prompt_tokens=data["prompt_tokens"],
        rm_test_share=data["rm_test_share"], ppo_posts=data["ppo_posts"], seed=data["split_seed"],
    )  # fmt: skip
    return files, {"source": source, **summary}


def model_paths(work: Path, rm_lr: float) -> dict[str, str]:
    """Where the SFT model and the reward model trained at ``rm_lr`` are (under ``work``)."""
    return {"sft": str(work / "sft-run" / "sft"), "rm": str(work / f"rm-run-lr{rm_lr:g}" / "rm")}


def data_files(work: Path):
    from .fourth_data import Files

    folder = work / "data"
    return Files(folder / "sft.jsonl", folder / "rm-train.jsonl", folder / "rm-test.jsonl", folder / "ppo.jsonl")


def train_models(settings: dict, files, work: Path, workers: int) -> dict:
    """SFT, then a reward model at each rate of the grid, one after the other on every core
    (two reward models side by side need ~22 GiB at batch 16 x 2 x 256 tokens: the first
    attempt ran out of memory); the picked one. Skips what is done, resumes what was stopped."""
    threads = settings["threads"]
    data = settings["data"]
    lengths = ["--max-prompt-length", data["prompt_tokens"], "--max-response-length", data["response_tokens"]]
    common = ["--dataset", data["source"], "--dtype", settings["dtype"], *lengths, "--save-every", 20]
    sft_run = work / "sft-run"
    if not _finished(sft_run / "sft"):
        s = settings["sft"]
        _cli(["sft", "--model", settings["model"], "--data-file", files.sft, "--split-shares", "100/0/0", "--run-dir", sft_run,
              "--epochs", s["epochs"], "--batch-size", s["batch_size"], "--lr", s["lr"], "--seed", s["seed"], *common,
              *(["--resume"] if _has_checkpoint(sft_run / "sft") else [])], threads=threads * workers, log=work / "sft.log")  # fmt: skip
    r = settings["rm"]

    def reward_model(lr: float) -> None:
        rm_run = work / f"rm-run-lr{lr:g}"
        if not _finished(rm_run / "rm"):
            _cli(["rm", "--model", sft_run / "sft", "--data-file", files.rm_train, "--split-shares", "0/100/0", "--run-dir", rm_run,
                  "--epochs", r["epochs"], "--batch-size", r["batch_size"], "--lr", lr, "--seed", r["seed"], *common,
                  *(["--resume"] if _has_checkpoint(rm_run / "rm") else [])], threads=threads * workers,
                 log=work / f"rm-lr{lr:g}.log")  # fmt: skip

    for lr in r["lrs"]:
        reward_model(lr)
    models = {"sft": {"digest": weights_digest(sft_run / "sft"), "threads": threads * workers, **_stage_metrics(sft_run, "sft")},
              "rm": {f"{lr:g}": {"digest": weights_digest(work / f"rm-run-lr{lr:g}" / "rm"), "threads": threads * workers,
                                 **_stage_metrics(work / f"rm-run-lr{lr:g}", "rm")} for lr in r["lrs"]}}  # fmt: skip
    # the best held-out accuracy of the stage's own split; ties to the lower rate
    models["picked_rm_lr"] = max(r["lrs"], key=lambda lr: (models["rm"][f"{lr:g}"]["eval_accuracy"], -lr))
    return models


def prompt_of(source: str, row: dict) -> str:
    """The prompt text of a pair file's row: the paper's TL;DR format from a post's fields, or
    the row's own prompt (an HH dialogue)."""
    if source == "tldr":
        from marlhf_cli.data.tldr import format_prompt

        return format_prompt(row["subreddit"], row["title"], row["post"])
    return row["prompt"]


def gate_one(settings: dict, pairs: Path, rm: str, length_rules: tuple[str, ...] = ("longer",)) -> dict:
    """The picked reward model on the pairs of the file ``pairs`` against the better of the
    ``length_rules`` (fourth_stats.gate_one)."""
    from marlhf_cli.evaluate.rm_judge import score_texts
    from marlhf_cli.models import load_reward_model, load_tokenizer
    from marlhf_cli.train.forward import disable_dropout

    from .fourth_data import read_jsonl

    rows = read_jsonl(pairs)
    tokenizer = load_tokenizer(rm)
    model = load_reward_model(rm)
    disable_dropout(model)
    model.eval().requires_grad_(False)
    data = settings["data"]
    prompts = [prompt_of(data["source"], r) for r in rows]

    def scores(key: str) -> list[float]:
        return score_texts(model, tokenizer, prompts, [r[key] for r in rows], max_prompt=data["prompt_tokens"],
                           max_response=data["response_tokens"], batch_size=8)  # fmt: skip

    def tokens(key: str) -> list[int]:
        return [len(tokenizer(r[key], add_special_tokens=False)["input_ids"]) for r in rows]

    chosen, rejected = scores("chosen"), scores("rejected")
    result = S.gate_one(chosen, rejected, tokens("chosen"), tokens("rejected"), bar=settings["gate1"]["accuracy"],
                        alpha=settings["gate1"]["alpha"], length_rules=length_rules)  # fmt: skip
    return {"passed": result.passed, **{k: v for k, v in result.__dict__.items()}, "chosen_scores": chosen, "rejected_scores": rejected}


# ---------------------------------------------------------------------------------------
# phases 4-6: PPO runs


def ppo_job(settings: dict, models: dict, work: Path, phase: str, arm: str, actor_lr: float, critic_lr: float, seed: int,
            steps: int, **stage: dict) -> dict:  # fmt: skip
    """One PPO run. ``paths`` (where the models, the prompts and the run's folder are on this
    machine) is left out of its record; ``model`` names the weights by their digests."""
    rm_lr = models["picked_rm_lr"]
    job = {
        "phase": phase, "arm": arm, "lr": round(float(actor_lr), 12), "critic_lr": round(float(critic_lr), 12), "seed": int(seed),
        "steps": int(steps), "flags": dict(settings["arms"][arm]), "stage": {**settings["ppo"]["stage"], **stage},
        "model": {"dtype": settings["dtype"], "sft": models["sft"]["digest"], "rm": models["rm"][f"{rm_lr:g}"]["digest"]},
        "protocol": settings["digest"],
    }  # fmt: skip
    paths = model_paths(work, rm_lr)
    paths |= {"dataset": settings["data"]["source"], "data_file": str(data_files(work).ppo), "run": str(work / "ppo" / ppo_path(Path(), job).with_suffix("").as_posix().replace("/", "_"))}
    return job | {"paths": paths}


def ppo_path(root: Path, job: dict) -> Path:
    return root / job["phase"] / f"{job['arm']}-lr{job['lr']:g}-c{job['critic_lr']:g}-s{job['seed']}-{job['steps']}steps.json"


TRAIN_KEYS = ("score", "kl_k3", "response_length", "eos_rate", "explained_variance", "explained_variance_pooled", "critic_warmup",
              "value_loss", "policy_loss", "step_time")  # fmt: skip


def run_ppo(job: dict) -> dict:
    """One PPO run with the stage's own ``ppo.run`` (in a worker); its record. Resumes from its
    own checkpoint when the worker was stopped; its folder is removed once the record exists."""
    import torch

    from marlhf_cli import provenance
    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.train import ppo

    paths = job["paths"]
    work = Path(paths["run"])
    resume = any((work / "ppo").glob("*/checkpoints/**/latest"))
    config = H.ppo_config(
        work, name="run", policy=paths["sft"], reward_model=paths["rm"], dataset=paths["dataset"], data_file=paths["data_file"],
        split_shares="0/0/100", dtype=job["model"]["dtype"], **job["flags"], **job["stage"], actor_lr=job["lr"],
        critic_lr=job["critic_lr"], max_steps=job["steps"], seed=job["seed"], resume=resume,
    )  # fmt: skip
    started = time.perf_counter()
    ppo.run(config)
    rows = read_jsonl(work / "metrics" / "ppo-run.jsonl")
    samples = read_jsonl(work / "samples" / "run.jsonl") if (work / "samples" / "run.jsonl").is_file() else []
    record = {
        **{key: value for key, value in job.items() if key != "paths"},
        "train": [{k: row[k] for k in ("step", *TRAIN_KEYS) if k in row} for row in rows if row["split"] == "train"],
        "eval": [{k: row[k] for k in ("step", "score", "response_length", "eos_rate") if k in row} for row in rows if row["split"] == "eval"],
        "samples": [{k: s[k] for k in ("prompt", "response", "score") if k in s} for s in samples],
        "seconds": time.perf_counter() - started, "resumed": resume,
        "provenance": {key: value for key, value in provenance.provenance().items() if key != "command"},
        "threads": torch.get_num_threads(),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)  # ~3 GB of checkpoints at 135M
    return record


def pooled_fit(record: dict, step: int) -> float:
    """The pooled explained variance the run logged at ``step`` (over its last 10 steps)."""
    row = next((r for r in record["train"] if r["step"] == step), None)
    value = None if row is None else row.get("explained_variance_pooled")
    return math.nan if value is None else float(value)


def final_score(record: dict) -> float:
    return float(record["eval"][-1]["score"])


def pick(values: dict[float, float]) -> float:
    """The rate with the highest value (NaN lowest); ties to the lower rate."""
    return max(values, key=lambda lr: (-math.inf if math.isnan(values[lr]) else values[lr], -lr))


def eval_curves(settings: dict, records: list[dict]) -> tuple[list[float], np.ndarray]:
    """(actor steps, [seeds, evaluations] held-out scores) of one arm's reported runs, from the
    evaluation at the warm-up's end (the actor's start) to the last; records in seed order."""
    warmup = settings["ppo"]["warmup_steps"]
    steps = [row["step"] - warmup for row in records[0]["eval"] if row["step"] >= warmup]
    scores = np.array([[row["score"] for row in r["eval"] if row["step"] >= warmup] for r in records], dtype=float)
    return steps, scores


# ---------------------------------------------------------------------------------------
# phase 7: the judge


def judge_seed(settings: dict, models: dict, a: dict, b: dict, work: Path, threads: int) -> dict:
    """``marlhf judge --rm`` on one seed's final samples of arms a and b: its verdict counts."""
    folder = work / "judge" / f"s{a['seed']}"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for record in (a, b):
        path = folder / f"{record['arm']}.jsonl"
        path.write_text("".join(json.dumps({"prompt": s["prompt"], "response": s["response"]}) + "\n" for s in record["samples"]))
        files.append(path)
    data = settings["data"]
    _cli(["judge", "--rm", "--reward-model", model_paths(work, models["picked_rm_lr"])["rm"], "--run-dir", folder, "--name", "judged", "--max-prompt-length",
          data["prompt_tokens"], "--max-response-length", data["response_tokens"], *files], threads=threads, log=work / "stages.log")  # fmt: skip
    result = json.loads((folder / "judge" / "judged-rm.json").read_text())
    verdicts = [row["verdict"] for row in result["pairs"]]
    return {"seed": a["seed"], **{v: verdicts.count(v) for v in ("win", "tie", "loss")}}


# ---------------------------------------------------------------------------------------
# the course


def _record(path: Path, make):
    """The committed record at ``path``, made (and written) by ``make()`` when absent."""
    from marlhf_cli.artifacts import write_json

    if path.is_file():
        return json.loads(path.read_text())
    value = make()
    write_json(path, value)
    return value


def run(args) -> int:
    settings = load("quick" if args.quick else "full", args.protocol or PROTOCOL)
    root = args.out / settings["folder"]
    # one set of worker processes for the three PPO phases, closed however the course ends
    with Workers(args.workers, settings["threads"], root) as workers:
        return _course(args, settings, root, workers)


def _course(args, settings: dict, root: Path, workers: Workers) -> int:
    from . import fourth_report as R

    work = root / "work"
    shared = None if args.quick else SHARED_TLDR
    print(H.machine_line())
    print(f"# {R.summary_line(settings)}; {args.workers} worker(s) x {settings['threads']} thread(s); records under {root}", flush=True)
    started = time.perf_counter()
    threads = settings["threads"]
    report = R.Report(settings)

    def runner(jobs: list[dict], label: str) -> list[dict]:
        if args.report_only:
            return saved_records(root, jobs)
        return run_jobs(jobs, root, workers, threads, label, run=run_ppo, path=ppo_path)

    if args.report_only and not (root / "gate1.json").is_file():
        report.stopped("no gate1.json: the edition has not trained and tested its reward model yet")
        return report.print()
    files = data_files(work)
    if not args.report_only:
        files, data = prepare_data(settings, work, shared)
        _record(root / "data.json", lambda: data)
    report.data = json.loads((root / "data.json").read_text())
    report.models = models = _record(root / "models.json", lambda: train_models(settings, files, work, args.workers))
    report.gate1 = gate1 = _record(root / "gate1.json", lambda: gate_one(settings, files.rm_test, model_paths(work, models["picked_rm_lr"])["rm"]))
    if not gate1["passed"] and settings["enforce_gates"]:
        report.stopped("gate 1")
        return report.print()

    c = settings["critic"]
    warmup = settings["ppo"]["warmup_steps"]
    critic_jobs = [ppo_job(settings, models, work, "critic", c["arm"], c["actor_lr"], lr, c["seed"], warmup + 1,
                           eval_every=0, eval_prompts=0) for lr in c["lrs"]]  # fmt: skip
    critic_records = runner(critic_jobs, "critic rate")
    if len(critic_records) < len(critic_jobs):
        report.stopped("runs missing (critic rate)")
        return report.print()
    fits = {job["critic_lr"]: pooled_fit(r, warmup) for job, r in zip(critic_jobs, critic_records)}
    critic_lr = pick(fits)
    report.critic = {"fits": fits, "picked": critic_lr, "passed": fits[critic_lr] >= c["gate"]}
    if not report.critic["passed"] and settings["enforce_gates"]:
        report.note_gate_two()  # the edition goes on, and makes no claim about the critic arms

    t = settings["tuning"]
    tuning_jobs = [ppo_job(settings, models, work, "tuning", t["arm"], lr, critic_lr, seed, t["steps"])
                   for lr in t["lrs"] for seed in t["seeds"]]  # fmt: skip
    tuning_records = runner(tuning_jobs, "actor rate")
    if len(tuning_records) < len(tuning_jobs):
        report.stopped("runs missing (actor rate)")
        return report.print()
    finals = {lr: statistics.fmean(final_score(r) for j, r in zip(tuning_jobs, tuning_records) if j["lr"] == lr) for lr in t["lrs"]}
    actor_lr = pick(finals)
    report.tuning = {"finals": finals, "picked": actor_lr, "records": tuning_records}

    seeds = settings["reported"]["seeds"]
    reported_jobs = [ppo_job(settings, models, work, "reported", arm, actor_lr, critic_lr, seed, settings["ppo"]["steps"])
                     for seed in seeds for arm in settings["arms"]]  # fmt: skip
    reported = runner(reported_jobs, "reported runs")
    workers.close()  # before the judge, which runs marlhf's own command line
    report.reported = reported
    if len(reported) < len(reported_jobs):
        report.stopped("runs missing (reported)")
        return report.print()

    judged = settings["decision"]["judge"]
    by_arm = {arm: [r for r in reported if r["arm"] == arm] for arm in settings["arms"]}
    if not args.report_only or (root / "judge.json").is_file():
        report.judge = _record(root / "judge.json", lambda: [judge_seed(settings, models, a, b, work, threads)
                                                            for a, b in zip(by_arm[judged["a"]], by_arm[judged["b"]])])  # fmt: skip
    report.wall = time.perf_counter() - started
    return report.print(figure=root / "eval_curves.png")


def saved_records(root: Path, jobs: list[dict]) -> list[dict]:
    """The saved records of ``jobs`` that have one, in the jobs' order (a report-only run)."""
    return [json.loads(ppo_path(root, job).read_text()) for job in jobs if ppo_path(root, job).is_file()]
