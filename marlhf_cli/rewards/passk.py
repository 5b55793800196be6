"""``marlhf passk``: pass@k of any model on APPS-style problems (the paper's Table 3).

For each problem the model samples ``--n`` programs (batched, with the PPO stage's sampler:
same left padding, mask-derived positions and ``logits / T`` transform as training, so a
PPO policy is evaluated as it was trained); each program is extracted from its response
(markdown fences stripped), run against every test in the sandbox, and counts as correct
when it passes them all. Testing overlaps generation: a batch's programs run in the sandbox
pool while the next batch is sampled. pass@k uses the unbiased estimator
(:func:`.apps.pass_at_k`), averaged per difficulty and overall.

Outputs: ``passk/<name>.json`` (settings, the table, per-problem outcomes, the sandbox's
isolation mode), ``passk/<name>-samples.jsonl`` (every program with its status and reward),
a ``passk/<name>`` entry in ``run.json``, and the table on the terminal.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .. import artifacts
from .. import config as config_module
from ..artifacts import RunDir
from ..errors import UserError
from . import apps
from . import sandbox as sb

STAGE = "passk"


def check(config) -> list[int]:
    """The k values, and a one-line error when --n is too few for the largest (each value
    alone was checked with the options: accepts.ACCEPTS)."""
    from ..accepts import parse_list

    ks = parse_list(config.k, int, "--k")
    if config.n < ks[-1]:
        raise UserError(f"--n {config.n} is too few samples for pass@{ks[-1]}: use --n {ks[-1]} or more")
    return ks


def load_problems(config) -> tuple[list[dict], Any]:
    """Problems of the chosen split: the hub's test split, or every record of a --data-file."""
    from ..data import load_records

    split = config.split or ("all" if config.data_file else "eval")
    result = load_records(
        config.dataset, data_file=config.data_file, split=None if split == "all" else split,
        strict=config.strict, limit=config.limit,
    )  # fmt: skip
    if result.records and result.kind != "problem":
        raise UserError(f"{result.source}: these are not program-synthesis problems (tests with inputs/outputs); use --dataset apps")
    if not result.records:
        raise UserError(f"{result.source}: no problems in the '{split}' split (try --split all)")
    return result.records, result


def problem_ids(records: Sequence[dict]) -> list[str]:
    ids = [str(r.get("problem_id") or f"problem-{i}") for i, r in enumerate(records)]
    if len(set(ids)) != len(ids):  # repeated ids in a user's file: keep every problem apart
        ids = [f"{pid}#{i}" for i, pid in enumerate(ids)]
    return ids


def sample_responses(model, tokenizer, device, prompts: Sequence[str], config):
    """Yield (start, responses) per batch of ``config.batch_size`` sequences, in order."""
    import torch

    from ..train.ppo.experience import RolloutSettings, decode_responses, generate

    settings = RolloutSettings(
        temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
        max_prompt_length=config.max_prompt_length, max_new_tokens=config.max_new_tokens,
    )  # fmt: skip
    for start in range(0, len(prompts), config.batch_size):
        part = list(prompts[start : start + config.batch_size])
        with torch.no_grad():
            _, _, response_ids, mask, _ = generate(model, tokenizer, part, settings, device=device)
        yield start, decode_responses(tokenizer, response_ids, mask)


def print_table(name: str, rows: list[dict], ks: Sequence[int], console) -> None:
    from rich.table import Table

    table = Table(title=f"pass@k: {name}", title_justify="left")
    table.add_column("difficulty")
    table.add_column("problems", justify="right")
    for k in ks:
        table.add_column(f"pass@{k} (%)", justify="right")
    for row in rows:
        if not row["problems"] and row["difficulty"] != "all":
            continue
        cells = ["-" if row[f"pass@{k}"] is None else f"{100 * row[f'pass@{k}']:.1f}" for k in ks]
        table.add_row(row["difficulty"], str(row["problems"]), *cells, style="bold" if row["difficulty"] == "all" else None)
    console.print(table)


def run(config) -> dict[str, Any]:
    """Sample, test, tabulate and write the results (module doc); returns the JSON payload."""
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import precision
    from ..evaluate.bon import resolve_policy
    from ..seeding import derived_seed
    from ..models import load_causal_lm, load_tokenizer
    from ..train.forward import disable_dropout

    console = Console(stderr=True)
    ks = check(config)
    run_dir = RunDir(config.run_dir)
    policy, default_name = resolve_policy(config.model, run_dir)
    name = config.name or default_name
    records, loaded = load_problems(config)
    if loaded.notice:
        console.print(loaded.notice, highlight=False, soft_wrap=True)
    ids = problem_ids(records)
    iso = sb.isolation()
    console.print(f"passk '{name}': {policy}, {len(records)} problems x {config.n} samples from {loaded.source}; sandbox {iso.describe()}",
                  highlight=False, soft_wrap=True)  # fmt: skip

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(policy, padding_side="left")
    config.dtype, why = precision.resolve(config.dtype)
    if why is not None:
        console.print(f"precision: {config.dtype} (--dtype auto: {why})", highlight=False, soft_wrap=True)
    model = load_causal_lm(policy, dtype=config.dtype)
    disable_dropout(model)
    model.eval().requires_grad_(False).to(device)
    model.config.pad_token_id = tokenizer.pad_token_id

    owners = [i for i in range(len(records)) for _ in range(config.n)]
    prompts = [records[i]["prompt"] for i in owners]
    responses: list[str] = [""] * len(prompts)
    results: list[apps.ProgramResult | None] = [None] * len(prompts)
    judge = apps.Judge(
        limits=sb.Limits(time=config.time_limit, memory_mb=config.memory_mb), max_workers=config.workers,
        max_tests=config.max_tests,
    )  # fmt: skip
    began = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress, ThreadPoolExecutor(1) as tester:
            sampling = progress.add_task("sampling", total=len(prompts), note="")
            testing = progress.add_task("testing", total=len(prompts), note="")
            passed = [0]

            def test(start: int, programs: list[str]) -> None:
                checked = judge.check(programs, [records[owners[start + j]] for j in range(len(programs))])
                for j, result in enumerate(checked):
                    results[start + j] = result
                passed[0] += sum(r.all_passed for r in checked)
                progress.update(testing, advance=len(programs), note=f"{passed[0]} passed")

            pending = []
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derived_seed(config.seed, STAGE))
                for start, texts in sample_responses(model, tokenizer, device, prompts, config):
                    responses[start : start + len(texts)] = texts
                    pending.append(tester.submit(test, start, [apps.extract_program(t) for t in texts]))
                    progress.update(sampling, advance=len(texts))
            for future in pending:
                future.result()
    finally:
        judge.close()
    seconds = time.monotonic() - began

    per_problem: dict[str, list[bool]] = {pid: [] for pid in ids}
    rows = []
    for index, (owner, response, result) in enumerate(zip(owners, responses, results)):
        assert result is not None
        per_problem[ids[owner]].append(result.all_passed)
        rows.append({
            "problem_id": ids[owner], "difficulty": records[owner].get("difficulty"), "sample": index % config.n,
            "status": result.status, "reward": result.reward, "passed_tests": result.passed,
            "failed_tests": result.failed, "error_tests": result.errors, "program": apps.extract_program(response),
            "response": response,
        })  # fmt: skip
    difficulties = {ids[i]: records[i].get("difficulty") for i in range(len(records))}
    table = apps.passk_table(per_problem, difficulties, ks)
    print_table(name, table, ks, console)
    overall = next(row for row in table if row["difficulty"] == "all")
    payload = {
        "name": name, "model": policy, "dataset": config.dataset, "data_file": config.data_file,
        "source": loaded.source, "problems": len(records), "n": config.n, "k": ks,
        "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens, "time_limit": config.time_limit, "seconds": round(seconds, 2),
        "sandbox": iso.describe(), "table": table,
        "mean_reward": sum(r["reward"] for r in rows) / len(rows),
        "per_problem": [{"problem_id": pid, "difficulty": difficulties[pid], "passed": per_problem[pid]} for pid in ids],
    }  # fmt: skip
    out = run_dir.path(STAGE, f"{name}.json")
    artifacts.write_json(out, payload)
    artifacts.write_jsonl(run_dir.path(STAGE, f"{name}-samples.jsonl"), rows)
    run_dir.record_stage(
        f"{STAGE}/{name}", config=config_module.to_dict(config),
        inputs={"model": policy, "dataset": config.dataset, "data_file": config.data_file, "source": loaded.source,
                "problems": len(records)},
        metrics={f"pass@{k}": overall[f"pass@{k}"] for k in ks} | {"mean_reward": payload["mean_reward"]},
    )  # fmt: skip
    console.print(f"wrote {out}", highlight=False, soft_wrap=True)
    return payload
