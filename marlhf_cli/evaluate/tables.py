"""Terminal tables of the evaluations (rich, on stdout so they can be piped and saved)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .stats import fmt_rate
from ..wording import count

console = Console()

JUDGE_ROWS = ("pairs", "win", "tie", "loss", "win rate [95% CI]", "ties as half", "length-controlled (ties half)", "sign test p", "unparsed", "failed")


def bon_table(name: str, curves: dict[float, dict[int, dict[str, float]]], mean_scores: dict[float, float], samples: int, prompts: int,
              scored: str = "reward-model score") -> None:  # fmt: skip
    """One row per temperature, one column per N, each cell the mean best-of-N score over
    its standard error (bold: the best temperature for that N). Where that is wider than
    the terminal (many N), one row per temperature and N instead: figures are never cut."""
    ns = sorted({n for c in curves.values() for n in c})
    temps = sorted(curves)
    best = {n: max(curves, key=lambda t: curves[t][n]["mean"]) for n in ns}

    def figure(temp: float, n: int, joint: str) -> str:
        text = f"{curves[temp][n]['mean']:.4f}{joint}± {curves[temp][n]['sem']:.4f}"
        return f"[bold]{text}[/]" if best[n] == temp else text

    title = f"best of N: {name} ({count(prompts, 'prompt')}, {count(samples, 'sample')} each)"
    caption = f"mean {scored} of the best of N samples, ± its standard error over prompts"
    wide = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for label in ("temperature", "mean (N=1)", *(f"N={n}" for n in ns)):
        wide.add_column(label, justify="right", no_wrap=True)
    for temp in temps:
        wide.add_row(f"{temp:g}", f"{mean_scores[temp]:.4f}", *(figure(temp, n, "\n") for n in ns))
    natural = console.measure(wide, options=console.options.update(max_width=10_000)).maximum  # unclamped
    if natural <= console.width:
        console.print(wide)
        return
    long = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for label in ("temperature", "N", "best of N"):
        long.add_column(label, justify="right", no_wrap=True)
    for temp in temps:
        cells = ([] if 1 in ns else [("1", f"{mean_scores[temp]:.4f}")]) + [(str(n), figure(temp, n, " ")) for n in ns]
        for index, (n, cell) in enumerate(cells):
            long.add_row(f"{temp:g}" if index == 0 else "", n, cell, end_section=index == len(cells) - 1)
    console.print(long)


def judge_table(name: str, summaries: dict[str, dict[str, Any]]) -> None:
    """One row per figure and one column per judge: eleven figures side by side would not
    fit 80 columns, while judges are one or two (an LLM and the reward model)."""
    table = Table(title=f"judge: {name}\n(verdicts for the first file)", title_justify="left")
    table.add_column("")
    for judge in summaries:
        table.add_column(judge, justify="right", overflow="fold")
    rows: dict[str, list[str]] = {label: [] for label in JUDGE_ROWS}
    for s in summaries.values():
        lc = s.get("length_controlled") or {}
        p = s.get("sign_test_p")
        cells = (
            str(s["pairs"]), str(s["win"]), str(s["tie"]), str(s["loss"]),
            fmt_rate(s["win_rate"], s["win_rate_ci"]), fmt_rate(s["win_rate_ties_half"]),
            fmt_rate(lc.get("win_rate")), "-" if p is None else f"{p:.3g}", str(s["unparsed"]), str(s["failed"]),
        )  # fmt: skip
        for label, cell in zip(JUDGE_ROWS, cells):
            rows[label].append(cell)
    for label, cells in rows.items():
        table.add_row(label, *cells)
    console.print(table)
    for judge, s in summaries.items():
        lines = []
        if s.get("mean_words_a") is not None:
            lines.append(f"mean length (words): first {s['mean_words_a']:.1f}, second {s['mean_words_b']:.1f}")
        bias = s.get("position_bias")
        if bias:
            lines.append(
                f"position bias: verdict changed with the order in {bias['inconsistent']}/{count(bias['pairs'], 'pair')} "
                f"({fmt_rate(bias['inconsistent_rate'], bias['inconsistent_rate_ci'])}); same slot chosen twice "
                f"{bias['same_slot']}; first slot chosen {fmt_rate(bias['first_slot_choice_rate'])} of the time"
            )
        for criterion, c in (s.get("criteria") or {}).items():
            lines.append(f"{criterion}: win {fmt_rate(c['win_rate'], c['win_rate_ci'])}, tie {fmt_rate(c['tie_rate'])} ({count(c['decided'], 'pair')})")
        for line in lines:
            console.print(f"  {judge}: {line}", highlight=False)


def agreement_table(first: str, second: str, agreement: dict[str, Any]) -> None:
    table = Table(title=f"agreement ({count(agreement['pairs'], 'pair')}): rows {first}, columns {second}", title_justify="left")
    table.add_column(f"{first} \\ {second}")
    verdicts = ("win", "tie", "loss")
    for v in verdicts:
        table.add_column(v, justify="right")
    for v in verdicts:
        table.add_row(v, *(str(agreement["table"][v][w]) for w in verdicts))
    console.print(table)
    console.print(
        f"  agreement {fmt_rate(agreement['rate'], agreement['rate_ci'])}; without ties "
        f"{fmt_rate(agreement['rate_without_ties'])} of {count(agreement['pairs_without_ties'], 'pair')}",
        highlight=False,
    )


def policies_table(reports: list[dict[str, Any]]) -> None:
    """``bon --policy A,B,...``: each policy's mean score of one sample (N=1) and of the best of
    the largest N, per temperature, with normal 95% intervals over prompts (the paper's Table 7
    at N=1), and its responses' mean length and EOS rate."""
    top = str(max(reports[0]["n"]))
    title = f"policies on the same {count(reports[0]['prompts'], 'prompt')} ({reports[0]['source']})"
    caption = ("score: the reward model's (or --reward function's) on one sample per prompt; mean [95% interval: "
               "+- 1.96 standard errors over prompts]")  # fmt: skip
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    labels = ("policy", "temperature", "score, N=1", *((f"best of {top}",) if top != "1" else ()), "tokens", "EOS rate")
    for label in labels:
        table.add_column(label, justify="left" if label == "policy" else "right", no_wrap=label != "policy")

    def cell(figure: dict[str, float]) -> str:
        half = 1.96 * figure["sem"]
        return f"{figure['mean']:.4f} [{figure['mean'] - half:.4f}, {figure['mean'] + half:.4f}]"

    for report in reports:
        for index, (temperature, result) in enumerate(report["results"].items()):
            one = result["best_of"].get("1")
            first = cell(one) if one else f"{result['mean_score']:.4f}"
            best = (cell(result["best_of"][top]),) if top != "1" else ()
            table.add_row(report["name"] if index == 0 else "", temperature, first, *best, f"{result['mean_tokens']:.1f}",
                          f"{result['eos_rate']:.2f}")  # fmt: skip
    console.print(table)
