"""``marlhf judge A.jsonl B.jsonl``: which file's responses are better, prompt by prompt.

Judges: an LLM through the official ``openai`` client (``--gpt4`` = the paper's
gpt-4o-2024-05-13, ``--model`` any other, ``--base-url`` any OpenAI-compatible server) and/or
the reward model (``--rm``). Verdicts are stated for the first file (A): win, tie, loss.

Order: the response shown first is chosen per pair from (seed, prompt); ``--both-orders``
judges every pair twice, once each way, and combines the two (:func:`.stats.combine_orders`),
which cancels the judge's preference for a slot and measures it (position bias). Identical
responses are a tie without a request. A pair's verdict needs every one of its judgements:
one unparsed or failed reply makes the pair unparsed or failed, never half a verdict.

Outputs: ``judge/<name>.json`` (LLM) and ``judge/<name>-rm.json`` (reward model), each with
every pair, reply and verdict plus the statistics of :mod:`.stats`; an agreement table when
both exist for the same pairs (computed against the other file on disk, so the two judges
may run at different times); ``plots/judge-<name>.png`` with one bar per judge of this
comparison, and ``plots/judge.png``, redrawn each time, with one bar per comparison and
judge in the run directory (from the result files on disk, so no comparison is lost); a
``judge/<name>`` entry in ``run.json``. Judgements that still failed
after the retries are listed, left out of the rates, and the command exits with code 1;
rerunning it asks only for those (everything answered is cached, see :mod:`.client`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from .. import artifacts
from .. import config as config_module
from ..artifacts import RunDir
from ..errors import UserError
from ..wording import count
from . import pairs as pairs_module
from . import plots, prompts, stats, tables
from .client import PAPER_MODEL, Fatal, Job, JudgeClient, Outcome, api_key
from .judge_parse import parse
from .pairs import Pair

IDENTICAL = {"first": "a", "choice": "E", "verdict": "tie", "how": "identical responses: a tie, not sent", "attempts": 0, "cached": False}
LETTER_VERDICT = {("A", True): "win", ("B", True): "loss", ("A", False): "loss", ("B", False): "win"}


def to_verdict(choice: str, a_shown_first: bool) -> str:
    """A position letter (A = shown first) -> the verdict for file A."""
    return "tie" if choice == "E" else LETTER_VERDICT[(choice, a_shown_first)]


def default_name(path_a: str, path_b: str) -> str:
    a, b = Path(path_a).stem, Path(path_b).stem
    if a == b:
        a, b = f"{Path(path_a).parent.name}-{a}", f"{Path(path_b).parent.name}-{b}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{a}-vs-{b}")


def check(config) -> None:
    """A judge must be chosen (each option's value was checked with the options: accepts.ACCEPTS)."""
    if not (config.gpt4 or config.judge_model or config.rm_judge):
        raise UserError("choose a judge: --gpt4 (the paper's GPT-4o), --model NAME (any OpenAI-compatible model) or --rm (the reward model)")


# ---------------------------------------------------------------------------------------
# the LLM judge


def _orders(pair: Pair, both: bool, seed: int) -> list[bool]:
    """For each judgement of the pair: is file A's response shown first?"""
    return [True, False] if both else [pairs_module.a_first(pair, seed)]


def _order_row(outcome: Outcome, a_shown_first: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"first": "a" if a_shown_first else "b", "attempts": outcome.attempts, "cached": outcome.cached}
    if outcome.error is not None:
        return {**row, "choice": None, "verdict": "failed", "error": outcome.error}
    parsed = parse(outcome.reply)
    row.update(choice=parsed.choice, how=parsed.how, reply=outcome.reply)
    row["verdict"] = to_verdict(parsed.choice, a_shown_first) if parsed.ok else "unparsed"
    if parsed.criteria:
        row["criteria"] = {name: to_verdict(c, a_shown_first) for name, c in parsed.criteria.items()}
    return row


def _pair_row(pair: Pair, orders: list[dict]) -> dict[str, Any]:
    verdicts = [o["verdict"] for o in orders]
    if "failed" in verdicts:
        verdict = "failed"
    elif "unparsed" in verdicts:
        verdict = "unparsed"
    else:
        verdict = stats.combine_orders(verdicts)
    row = {"key": pair.key, "prompt": pair.prompt, "response_a": pair.response_a, "response_b": pair.response_b, "verdict": verdict, "orders": orders}
    names = set.intersection(*(set(o.get("criteria", {})) for o in orders)) if orders else set()
    if names and verdict in stats.SCORE:
        row["criteria"] = {n: stats.combine_orders([o["criteria"][n] for o in orders]) for n in sorted(names)}
    return row


def judge_llm(config, chosen: Sequence[Pair], template: prompts.Template, run: RunDir, progress) -> tuple[list[dict], dict]:
    """Per-pair rows of the LLM judge and a description of the judge for the result file."""
    model = config.judge_model or PAPER_MODEL
    client = JudgeClient(
        model=model, key=api_key(config.api_key_env, config.base_url), base_url=config.base_url,
        timeout=config.timeout, max_retries=config.max_retries, retry_wait=config.retry_wait,
        max_tokens=config.max_tokens, cache_dir=run.path("judge", "cache"),
    )  # fmt: skip
    jobs = []
    for pair in chosen:
        if pair.response_a == pair.response_b:
            continue  # a tie whatever the judge says: not worth a request
        for shown_first in _orders(pair, config.both_orders, config.seed):
            first, second = (pair.response_a, pair.response_b) if shown_first else (pair.response_b, pair.response_a)
            key = client.cache_key(template.sha, pair.prompt, first, second)
            jobs.append(Job((pair.key, shown_first), template.render(pair.prompt, first, second), key))
    tally = Counter()
    task = progress.add_task(f"judge {model}", total=len(jobs), live="")

    def done(outcome: Outcome) -> None:
        tally["cached" if outcome.cached else "failed" if outcome.error else "asked"] += 1
        progress.update(task, advance=1, live=" ".join(f"{k} {v}" for k, v in sorted(tally.items())))

    outcomes = {o.tag: o for o in client.run(jobs, config.concurrency, done)}
    rows = []
    for pair in chosen:
        if pair.response_a == pair.response_b:
            rows.append(_pair_row(pair, [dict(IDENTICAL)]))
            continue
        orders = [_order_row(outcomes[(pair.key, s)], s) for s in _orders(pair, config.both_orders, config.seed)]
        rows.append(_pair_row(pair, orders))
    failures = [o for o in outcomes.values() if o.error]
    info = {
        "kind": "llm", "model": model, "base_url": config.base_url, "template": template.name,
        "template_sha": template.sha, "asked": tally["asked"] + tally["failed"], "cached": tally["cached"],
        "http_requests": sum(o.attempts for o in outcomes.values()),
        "failures": dict(Counter(client.redact(o.error) for o in failures)),
    }  # fmt: skip
    return rows, info


# ---------------------------------------------------------------------------------------
# outputs


def _result_path(run: RunDir, name: str, kind: str) -> Path:
    return run.path("judge", f"{name}{'-rm' if kind == 'rm' else ''}.json")


def _verdicts_on_disk(path: Path) -> dict[str, str] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return {p["key"]: p["verdict"] for p in data.get("pairs", [])}


def _bars(run: RunDir, name: str | None = None) -> list[dict]:
    """Win/tie/loss bars of every result file in the run directory (or of comparison ``name``)."""
    bars = []
    for path in sorted(run.path("judge").glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            s = data["stats"]
            judge = data["judge"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if name is not None and data.get("name") != name:
            continue
        label = f"{data['name']} ({_label(judge)})"
        bars.append({"label": label, "win": s["win"], "tie": s["tie"], "loss": s["loss"], "order": (data["name"], judge.get("kind") != "llm")})
    return sorted(bars, key=lambda bar: bar.pop("order"))


def _label(info: dict) -> str:
    return info.get("model") if info.get("kind") == "llm" else "reward model"


def run(config, file_a: str, file_b: str) -> dict[str, Any]:
    """Judge, write, print; returns {"failed": count of judgements with no reply, ...}."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    check(config)
    run_dir = RunDir(config.run_dir)
    err = Console(stderr=True)
    matched = pairs_module.match(file_a, file_b, strict=config.strict)
    for note in matched.notes():
        err.print(f"note: {note}", highlight=False, soft_wrap=True)
    chosen = pairs_module.sample(matched.pairs, config.sample, config.seed)
    name = config.name or default_name(file_a, file_b)
    llm = bool(config.gpt4 or config.judge_model)
    template = prompts.load_template(config.task, config.template, [p.prompt for p in chosen]) if llm else None
    results: dict[str, tuple[list[dict], dict]] = {}
    progress = Progress(
        TextColumn("[bold]{task.description}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[live]}"), console=err,
    )  # fmt: skip
    with progress:
        if llm:
            try:
                results["llm"] = judge_llm(config, chosen, template, run_dir, progress)
            except Fatal:
                progress.live.transient = True  # the refusal is one line: no half-drawn bar above it
                raise
        if config.rm_judge:
            from . import rm_judge

            reward_model = config.reward_model or str(run_dir.require("rm"))
            from ..models import check_heads

            for note in check_heads(reward_model=reward_model, allow=config.allow_new_head):
                err.print(note, highlight=False, soft_wrap=True)
            task = progress.add_task("judge reward model", total=2 * len(chosen), live="")
            rows, rendered = rm_judge.judge(
                chosen, reward_model, max_prompt=config.max_prompt_length, max_response=config.max_response_length,
                batch_size=config.batch_size, chat_template=config.chat_template, conversations=matched.conversations,
                advance=lambda n: progress.update(task, advance=n),
            )  # fmt: skip
            results["rm"] = (rows, {"kind": "rm", "reward_model": reward_model, "chat_template": rendered})

    failed = sum(1 for rows, _ in results.values() for r in rows for o in r.get("orders", []) if o["verdict"] == "failed")
    unparsed = sum(1 for rows, _ in results.values() for r in rows for o in r.get("orders", []) if o["verdict"] == "unparsed")
    reasons = "; ".join(f"{n} x {why}" for why, n in results["llm"][1]["failures"].items()) if "llm" in results else ""
    # a judge that decided no pair reports nothing: no result file, no bar, no run.json entry
    results = {kind: result for kind, result in results.items() if any(r["verdict"] in stats.SCORE for r in result[0])}
    if not results:
        why = [f"{count(failed, 'judgement')} got no reply" + (f" ({reasons})" if reasons else "")] if failed else []
        why += [f"{count(unparsed, 'reply')} could not be parsed"] if unparsed else []
        err.print(
            f"[bold red]no pair of {name} was judged[/]: {'; '.join(why) or 'no judgement'}; nothing written. Rerun the "
            f"same command once the judge answers: every answered judgement is cached in {run_dir.path('judge', 'cache')}.",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        return {"failed": failed, "unparsed": unparsed, "files": {}, "plot": None}
    summaries, written = {}, {}
    base = {
        "name": name, "a": str(file_a), "b": str(file_b), "seed": config.seed, "both_orders": config.both_orders,
        "sample": config.sample, "pairs_matched": len(matched.pairs), "notes": matched.notes(),
    }  # fmt: skip
    verdicts = {kind: {r["key"]: r["verdict"] for r in rows} for kind, (rows, _) in results.items()}
    for kind in ("llm", "rm"):
        if kind not in verdicts:
            verdicts[kind] = _verdicts_on_disk(_result_path(run_dir, name, kind))
    # rows: the LLM's verdict, columns: the reward model's, in both result files
    agreement = stats.agreement(verdicts["llm"], verdicts["rm"]) if verdicts["llm"] and verdicts["rm"] else None
    for kind, (rows, info) in results.items():
        summary = stats.summarize(rows)
        summaries[kind] = summary
        data = {**base, "judge": info, "stats": summary, "agreement": agreement, "config": config_module.to_dict(config), "pairs": rows}
        written[kind] = artifacts.write_json(_result_path(run_dir, name, kind), data)
    if agreement:
        tables.agreement_table("llm", "rm", agreement)
    tables.judge_table(name, {_label(results[k][1]): v for k, v in summaries.items()})
    plot = plots.win_tie_loss(_bars(run_dir, name), run_dir.plot_path(f"judge-{name}"), title=f"pairwise judgements: {name}")
    overview = plots.win_tie_loss(_bars(run_dir), run_dir.plot_path("judge"), title=f"pairwise judgements in {run_dir.root}")
    if unparsed:
        err.print(f"[yellow]{unparsed} repl{'y' if unparsed == 1 else 'ies'} could not be parsed[/]: kept in the result file "
                  "(how: 'unparsed: ...'), counted, and left out of the rates", highlight=False)  # fmt: skip
    if failed:
        err.print(
            f"[bold red]{count(failed, 'judgement')} got no reply[/] ({reasons}; transient errors were retried up to {config.max_retries} times); their pairs "
            "are left out of the rates. Rerun the same command to ask only for those: every answered judgement is "
            f"cached in {run_dir.path('judge', 'cache')}.", highlight=False, soft_wrap=True,
        )  # fmt: skip
    for path in [*written.values(), plot, overview]:
        err.print(f"wrote {path}", highlight=False)
    keys = ("pairs", "win", "tie", "loss", "win_rate", "unparsed", "failed")
    metrics = {kind: {k: summary[k] for k in keys} for kind, summary in summaries.items()}
    run_dir.record_stage(
        f"judge/{name}", config=config_module.to_dict(config), inputs={"a": str(file_a), "b": str(file_b), "pairs": len(chosen)},
        metrics=metrics, status="finished" if not failed else "incomplete",
    )  # fmt: skip
    return {"failed": failed, "unparsed": unparsed, "files": {k: str(v) for k, v in written.items()}, "plot": str(plot)}
