"""``marlhf passk``: pass@k of any model on APPS-style problems (the paper's Table 3).

For each problem the model samples ``--n`` programs (batched, with the PPO stage's sampler:
same left padding, mask-derived positions and ``logits / T`` transform as training, so a
PPO policy is evaluated as it was trained); each program is extracted from its response
(markdown fences stripped), run against every test in the sandbox, and counts as correct
when it passes them all. Testing overlaps generation: a batch's programs run in the sandbox
pool while the next batch is sampled. pass@k uses the unbiased estimator
(:func:`.apps.pass_at_k`), averaged per difficulty and overall.

With ``--reward py:FILE.py:FUNCTION`` the tests are the user's function instead
(:mod:`.function`): any prompt dataset, each response scored by it, a response "passing"
when it scores 1.0 or more (full marks, as an APPS program passing every test scores 1.0),
and the table gains the mean score per difficulty (records without one count as
``unknown``). Nothing runs in the sandbox then. With ``--env py:FILE.py:NAME`` each sample
is an episode with the user's environment (:mod:`marlhf_cli.episodes`; the shipped
``program_repair`` gives the sandbox's failures back as the next message), passing when its
return is 1.0 or more: pass@k with feedback turns.

Outputs: ``passk/<name>.json`` (settings, the table, per-problem outcomes, the sandbox's
isolation mode), ``passk/<name>-samples.jsonl`` (every program with its status and reward),
a ``passk/<name>`` entry in ``run.json``, and the table on stdout (progress and notes on stderr).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from .. import artifacts
from .. import config as config_module
from ..artifacts import RunDir
from ..errors import UserError
from ..wording import count
from . import apps
from . import sandbox as sb
from .function import FunctionReward, is_function_spec

STAGE = "passk"


def check(config) -> list[int]:
    """The k values, and a one-line error when --n is too few for the largest (each value
    alone was checked with the options: accepts.ACCEPTS)."""
    from ..accepts import parse_list

    ks = parse_list(config.k, int, "--k")
    if config.n < ks[-1]:
        raise UserError(f"--n {config.n} is too few samples for pass@{ks[-1]}: use --n {ks[-1]} or more")
    return ks


PASS_SCORE = 1.0  # a reward function's score that counts as a pass (an APPS program passing every test scores 1.0)


def load_problems(config) -> tuple[list[dict], Any]:
    """Problems of the chosen split: the hub's test split, or every record of a --data-file
    (with a reward function: records of any kind that hold prompts)."""
    from ..data import load_records
    from ..data.records import PROMPT_KINDS
    from .function import is_function_spec

    split = config.split or ("all" if config.data_file else "eval")
    result = load_records(
        config.dataset, data_file=config.data_file, split=None if split == "all" else split,
        strict=config.strict, limit=config.limit,
    )  # fmt: skip
    if is_function_spec(config.reward):
        result.require(f"{STAGE} --reward {config.reward}", PROMPT_KINDS)
    elif result.records and result.kind != "problem":
        raise UserError(
            f"{result.source}: these are not program-synthesis problems (tests with inputs/outputs); use --dataset apps, "
            "or score the responses with --reward py:FILE.py:FUNCTION"
        )
    if not result.records:
        raise UserError(f"{result.source}: no problems in the '{split}' split (try --split all)")
    return result.records, result


def _difficulty(record: dict) -> Any:
    """A record's difficulty: APPS's field, or a TRL file's column of that name."""
    return record.get("difficulty") or (record.get("columns") or {}).get("difficulty")


def problem_ids(records: Sequence[dict]) -> list[str]:
    ids = [str(r.get("problem_id") or f"problem-{i}") for i, r in enumerate(records)]
    if len(set(ids)) != len(ids):  # repeated ids in a user's file: keep every problem apart
        ids = [f"{pid}#{i}" for i, pid in enumerate(ids)]
    return ids


def sample_responses(model, tokenizer, device, prompts: Sequence[str], config, stop_token_ids: Sequence[int] = ()):
    """Yield (start, responses, token ids of each) per batch of ``config.batch_size`` sequences,
    in order; a response ends at EOS or any of ``stop_token_ids`` (a chat template's end of turn)."""
    import torch

    from ..generation import SamplingParams
    from ..generation.texts import decode_responses, generate

    sampling = SamplingParams(
        config.temperature, config.top_k, config.top_p, config.max_new_tokens, generation=config.generation,
        cache_length=config.max_prompt_length + config.max_new_tokens,
    )  # fmt: skip
    for start in range(0, len(prompts), config.batch_size):
        part = list(prompts[start : start + config.batch_size])
        with torch.no_grad():
            _, _, response_ids, mask, _, _ = generate(
                model, tokenizer, part, sampling, max_prompt_length=config.max_prompt_length,
                stop_token_ids=tuple(stop_token_ids), device=device,
            )  # fmt: skip
        ids = [row[: int(n)].tolist() for row, n in zip(response_ids.cpu(), mask.sum(dim=1).cpu())]
        yield start, decode_responses(tokenizer, response_ids, mask), ids


def play_episodes(model, chat, device, records: Sequence[dict], owners: Sequence[int], config):
    """``--env``: yield (start, transcripts, returns, [{"episode", "turns"}]) per batch of
    ``config.batch_size`` episodes, sample i of problem ``owners[i]`` seeded by (seed, i)."""
    from ..episodes import from_config
    from ..episodes.rollout import transcript_text
    from ..generation import SamplingParams
    from ..seeding import derived_seed

    episodes = from_config(config)
    sampling = SamplingParams(config.temperature, config.top_k, config.top_p, config.max_new_tokens, generation=config.generation)
    for start in range(0, len(owners), config.batch_size):
        part = [records[i] for i in owners[start : start + config.batch_size]]
        seeds = [derived_seed(config.seed, STAGE, "env", start + j) for j in range(len(part))]
        drawn = episodes.play(model, chat, part, seeds, sampling=sampling, max_prompt_length=config.max_prompt_length, device=device)
        played = [{"episode": t, "turns": int(n)} for t, n in zip(drawn.transcripts, drawn.turns.tolist())]
        yield start, [transcript_text(t) for t in drawn.transcripts], drawn.returns().tolist(), played


def print_table(name: str, rows: list[dict], ks: Sequence[int], console) -> None:
    from rich.table import Table

    scored = any("mean_score" in row for row in rows)
    table = Table(title=f"pass@k: {name}", title_justify="left")
    table.add_column("difficulty")
    table.add_column("problems", justify="right")
    for k in ks:
        table.add_column(f"pass@{k} (%)", justify="right")
    if scored:
        table.add_column("mean score", justify="right")
    for row in rows:
        if not row["problems"] and row["difficulty"] != "all":
            continue
        cells = ["-" if row[f"pass@{k}"] is None else f"{100 * row[f'pass@{k}']:.1f}" for k in ks]
        if scored:
            cells.append("-" if row.get("mean_score") is None else f"{row['mean_score']:.4f}")
        table.add_row(row["difficulty"], str(row["problems"]), *cells, style="bold" if row["difficulty"] == "all" else None)
    console.print(table)


def add_mean_scores(table: list[dict], scores: dict[str, list[float]], difficulties: dict[str, Any]) -> None:
    """Each row of the pass@k table gets the mean score of its problems' samples."""
    for row in table:
        problems = [p for p in scores if row["difficulty"] == "all" or str(difficulties.get(p) or "unknown") == row["difficulty"]]
        values = [s for p in problems for s in scores[p]]
        row["mean_score"] = sum(values) / len(values) if values else None


def run(config) -> dict[str, Any]:
    """Sample, test, tabulate and write the results (module doc); returns the JSON payload."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import precision
    from ..chat import ChatFormat
    from ..seeding import derived_seed
    from ..models import load_causal_lm, load_tokenizer

    console = Console(stderr=True)
    ks = check(config)
    run_dir = RunDir(config.run_dir)
    policy, default_name = run_dir.policy(config.model)
    name = config.name or default_name
    records, loaded = load_problems(config)
    if loaded.notice:
        console.print(loaded.notice, highlight=False, soft_wrap=True)
    ids = problem_ids(records)
    function = FunctionReward(config.reward) if is_function_spec(config.reward) else None
    if function is not None:
        function.check_records(records, f"the records of {loaded.source}")
    if config.env and function is not None:
        raise UserError("--reward does not apply with --env: an episode's score is its return")
    iso = sb.isolation() if function is None and not config.env else None
    judged_by = (f"sandbox {iso.describe()}" if iso else f"episodes with {config.env} (a sample passes at a return of {PASS_SCORE:g} or more)"
                 if config.env else f"scored by {config.reward} (passes at {PASS_SCORE:g} or more)")  # fmt: skip
    problems = count(len(records), "problem") if len(records) == loaded.available else f"{len(records)} of the {loaded.available} problems"
    console.print(f"passk '{name}': {policy}, {problems} x {count(config.n, 'sample')} from {loaded.source}; {judged_by}",
                  highlight=False, soft_wrap=True)  # fmt: skip

    import torch  # after every check of the options, files and run directory (~2 s)

    from ..generation import compiled
    from ..train.forward import disable_dropout

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(policy, padding_side="left")
    config.dtype, why = precision.resolve(config.dtype)
    if why is not None:
        console.print(f"precision: {config.dtype} (--dtype auto: {why})", highlight=False, soft_wrap=True)
    model = load_causal_lm(policy, dtype=config.dtype)
    disable_dropout(model)
    model.eval().requires_grad_(False).to(device)
    model.config.pad_token_id = tokenizer.pad_token_id
    compiled.settle(config, model, rows=config.batch_size, device=device,
                             say=lambda line: console.print(line, highlight=False, soft_wrap=True))  # fmt: skip

    chat = ChatFormat(tokenizer, config.chat_template)  # APPS prompts are plain text: only a template FILE applies
    owners = [i for i in range(len(records)) for _ in range(config.n)]
    prompts = [chat.prompt(records[i]) for i in owners]
    responses: list[str] = [""] * len(prompts)
    results: list[apps.ProgramResult | None] = [None] * len(prompts)
    scores: list[float] = [0.0] * len(prompts)  # a reward function's, or an episode's return, when it judges
    episodes: list[dict] = [{} for _ in prompts]  # --env: each sample's messages and turns
    scored = function is not None or bool(config.env)
    judge = None if scored else apps.Judge(
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
                if config.env:
                    for start, texts, returns, played in play_episodes(model, chat, device, records, owners, config):
                        responses[start : start + len(texts)], scores[start : start + len(texts)] = texts, returns
                        episodes[start : start + len(texts)] = played
                        passed[0] += sum(score >= PASS_SCORE for score in returns)
                        progress.update(sampling, advance=len(texts))
                        progress.update(testing, advance=len(texts), note=f"{passed[0]} passed")
                for start, texts, token_ids in ([] if config.env else sample_responses(model, tokenizer, device, prompts, config, chat.stop_ids)):
                    responses[start : start + len(texts)] = texts
                    if function is not None:  # here, in order: the user's function need not be thread-safe
                        end = start + len(texts)
                        scores[start:end] = function.score(prompts[start:end], texts, token_ids, [records[owners[i]] for i in range(start, end)])
                        passed[0] += sum(score >= PASS_SCORE for score in scores[start:end])
                        progress.update(testing, advance=len(texts), note=f"{passed[0]} passed")
                    else:
                        pending.append(tester.submit(test, start, [apps.extract_program(t) for t in texts]))
                    progress.update(sampling, advance=len(texts))
            for future in pending:
                future.result()
    finally:
        if judge is not None:
            judge.close()
    seconds = time.monotonic() - began

    per_problem: dict[str, list[bool]] = {pid: [] for pid in ids}
    per_problem_scores: dict[str, list[float]] = {pid: [] for pid in ids}
    rows = []
    for index, (owner, response, result) in enumerate(zip(owners, responses, results)):
        row = {"problem_id": ids[owner], "difficulty": _difficulty(records[owner]), "sample": index % config.n}
        if scored:
            passes = scores[index] >= PASS_SCORE
            per_problem_scores[ids[owner]].append(scores[index])
            row |= {"status": "passed" if passes else "failed", "reward": scores[index], "response": response, **episodes[index]}
        else:
            assert result is not None
            passes = result.all_passed
            row |= {
                "status": result.status, "reward": result.reward, "passed_tests": result.passed,
                "failed_tests": result.failed, "error_tests": result.errors, "program": apps.extract_program(response),
                "response": response,
            }  # fmt: skip
        per_problem[ids[owner]].append(passes)
        rows.append(row)
    difficulties = {ids[i]: _difficulty(records[i]) for i in range(len(records))}
    table = apps.passk_table(per_problem, difficulties, ks)
    if scored:
        add_mean_scores(table, per_problem_scores, difficulties)
    print_table(name, table, ks, Console(highlight=False))  # stdout, as every command's table
    overall = next(row for row in table if row["difficulty"] == "all")
    payload = {
        "name": name, "model": policy, "dataset": config.dataset, "data_file": config.data_file,
        "source": loaded.source, "problems": len(records), "n": config.n, "k": ks,
        "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens, "time_limit": config.time_limit, "seconds": round(seconds, 2),
        "reward": f"env {config.env}" if config.env else config.reward or "apps", "sandbox": iso.describe() if iso else None,
        "table": table,
        "mean_reward": sum(r["reward"] for r in rows) / len(rows),
        "per_problem": [{"problem_id": pid, "difficulty": difficulties[pid], "passed": per_problem[pid]} for pid in ids],
    }  # fmt: skip
    out = run_dir.path(STAGE, f"{name}.json")
    artifacts.write_json(out, payload)
    artifacts.write_jsonl(run_dir.path(STAGE, f"{name}-samples.jsonl"), rows)
    run_dir.record_stage(
        f"{STAGE}/{name}", config=config_module.to_dict(config),
        inputs={"model": policy, "dataset": config.dataset, "data_file": config.data_file, "source": loaded.source,
                "problems": len(records), "chat_template": chat.example(records)},
        metrics={f"pass@{k}": overall[f"pass@{k}"] for k in ks} | {"mean_reward": payload["mean_reward"]},
    )  # fmt: skip
    console.print(f"wrote {out}", highlight=False, soft_wrap=True)
    return payload
