"""The speed stage's summary: one table and one figure from the JSON files the stage wrote.

    python benchmarks/gpu/speed_report.py OUTDIR

Reads what ``suite.sh speed`` wrote to OUTDIR:

* ``decode-<shape>.json`` (benchmarks/decode_cost.py): the PPO step with the eager and the
  compiled sampler per batch: milliseconds per generated token, generation's share of the
  step, response tokens per second;
* ``vs_trl-<shape>.json`` (benchmarks/vs_trl.py): marlhf's tokens per second over TRL-core's;
* ``mc_cost-<shape>.json`` (benchmarks/mc_cost.py): the ``mc`` step over the ``rloo`` step;
* ``decode-<shape>-lora<R>.json``: the peak GPU memory of a LoRA run;
* ``dpo-<shape>.json`` (benchmarks/vs_trl_dpo.py): marlhf's DPO step and its peak GPU memory,
  and its tokens per second over TRL's DPOTrainer where TRL ran.

and prints one table, each figure with the issue's goal where it set one (issue 33), then
writes OUTDIR/speed.json (the rows) and OUTDIR/speed.png (milliseconds per token and
generation's share, eager against compiled). A file that is missing leaves its rows out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOALS = {  # issue 33's table
    "ms_per_token:smollm2-135m:8x64": ("<= 2", lambda v: v <= 2),
    "generation_share:64x128": ("<= 30%", lambda v: v <= 0.30),
    "vs_trl": (">= 3x", lambda v: v >= 3),
    "mc_over_rloo": ("<= 2x", lambda v: v <= 2),
    "lora_peak": ("<= 24 GiB", lambda v: v <= 24),
}


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _shape(path: Path, prefix: str) -> str:
    return path.stem.removeprefix(prefix)


def rows(out: Path) -> list[dict]:
    """Every figure as {figure, eager, compiled, goal, met}: eager is None where there is no
    eager counterpart."""
    table = []
    for path in sorted(out.glob("decode-*.json")):
        data = _load(path)
        if data.get("lora_rank"):
            continue
        shape = _shape(path, "decode-")
        by = {(r["prompts"], r["new_tokens"], r["generation"]): r for r in data["rows"]}
        for prompts, tokens in sorted({(p, t) for p, t, _ in by}):
            eager, compiled = by.get((prompts, tokens, "eager")), by.get((prompts, tokens, "compiled"))
            batch = f"{prompts}x{tokens}"
            for key, label, scale in (("ms_per_token", "ms per generated token", 1), ("generation_share", "generation's share of the step", 100),
                                      ("tokens_per_s", "response tokens per second", 1)):  # fmt: skip
                goal = GOALS.get(f"{key}:{shape}:{batch}") or (GOALS.get(f"{key}:{batch}") if key == "generation_share" else None)
                value = compiled[key] if compiled else None
                table.append({
                    "figure": f"{shape} {batch}: {label}", "eager": eager[key] * scale if eager else None,
                    "compiled": value * scale if value is not None else None, "goal": goal[0] if goal else "",
                    "met": goal[1](value) if goal and value is not None else None, "unit": "%" if scale == 100 else "",
                })  # fmt: skip
    for path in sorted(out.glob("vs_trl-*.json")):
        data = _load(path)
        tools, settings = data["tools"], data["settings"]
        if "trl-core" in tools:
            speed = {t: v["tokens_per_step"] / v["step_median"] for t, v in tools.items()}
            ratio = speed["marlhf"] / speed["trl-core"]
            goal = GOALS["vs_trl"]
            batch = f"{settings['batch']}x{settings['new_tokens']}"
            table.append({"figure": f"{_shape(path, 'vs_trl-')} {batch}: marlhf / TRL-core tokens per second", "eager": None,
                          "compiled": ratio, "goal": goal[0], "met": goal[1](ratio), "unit": "x"})  # fmt: skip
    for path in sorted(out.glob("mc_cost-*.json")):
        data = _load(path)
        mc = next((v for k, v in data["configs"].items() if k.startswith("mc")), None)
        if mc and "over_rloo" in mc:
            goal = GOALS["mc_over_rloo"]
            table.append({"figure": f"{_shape(path, 'mc_cost-')} {data['prompts']} prompts x K={data['k']}: mc (ppl, M=2) step / rloo step",
                          "eager": None, "compiled": mc["over_rloo"], "goal": goal[0], "met": goal[1](mc["over_rloo"]), "unit": "x"})  # fmt: skip
    for path in sorted(out.glob("decode-*-lora*.json")):
        data = _load(path)
        peak = max((r["peak_memory_gib"] for r in data["rows"] if r["peak_memory_gib"] is not None), default=None)
        goal = GOALS["lora_peak"]
        table.append({"figure": f"{_shape(path, 'decode-')}: LoRA rank {data['lora_rank']} PPO peak GPU memory (GiB)", "eager": None,
                      "compiled": peak, "goal": goal[0], "met": goal[1](peak) if peak is not None else None, "unit": ""})  # fmt: skip
    for path in sorted(out.glob("dpo-*.json")):
        shape, data = _shape(path, "dpo-"), _load(path)
        for model in data["models"].values():
            medians, tokens = model["medians"], model["tokens_per_step"]
            peak = max((r["peak_memory_gib"] for r in model["runs"]["marlhf"] if "peak_memory_gib" in r), default=None)
            table.append({"figure": f"{shape}: DPO step, {data['settings']['batch']} pairs (s)", "eager": None,
                          "compiled": medians["marlhf"], "goal": "", "met": None, "unit": ""})  # fmt: skip
            table.append({"figure": f"{shape}: DPO peak GPU memory (GiB)", "eager": None, "compiled": peak, "goal": "",
                          "met": None, "unit": ""})  # fmt: skip
            if "trl" in medians:
                table.append({"figure": f"{shape}: DPO marlhf / TRL tokens per second", "eager": None,
                              "compiled": (tokens / medians["marlhf"]) / (tokens / medians["trl"]), "goal": ">= 1x",
                              "met": medians["trl"] >= medians["marlhf"], "unit": "x"})  # fmt: skip
    return table


def fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}%" if unit == "%" else f"{value:.2f}{unit}"


def main() -> None:
    out = Path(sys.argv[1])
    table = rows(out)
    if not table:
        sys.exit(f"no decode-*.json, vs_trl-*.json or mc_cost-*.json in {out}")
    width = max(len(r["figure"]) for r in table) + 2
    print(f"{'figure':<{width}}{'eager':>10}{'compiled':>10}{'goal':>12}  met")
    for r in table:
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"{r['figure']:<{width}}{fmt(r['eager'], r['unit']):>10}{fmt(r['compiled'], r['unit']):>10}{r['goal']:>12}  {met}")
    from marlhf_cli.artifacts import write_figure, write_json

    write_json(out / "speed.json", table)
    figure(table, out / "speed.png", write_figure)
    print(f"# wrote {out / 'speed.json'} and {out / 'speed.png'}")


def figure(table: list[dict], path: Path, write_figure) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), dpi=110)
    for axis, key, ylabel in ((axes[0], "ms per generated token", "ms per token (log)"),
                              (axes[1], "generation's share of the step", "% of the PPO step")):  # fmt: skip
        chosen = [r for r in table if r["figure"].endswith(key)]
        labels = [r["figure"].split(":")[0] for r in chosen]
        for offset, mode in ((0.0, "eager"), (0.4, "compiled")):
            axis.bar([x + offset for x in range(len(chosen))], [r[mode] or 0.0 for r in chosen], width=0.4, label=mode)
        axis.set_xticks([x + 0.2 for x in range(len(chosen))], labels, fontsize=7, rotation=15)
        axis.set_ylabel(ylabel)
        axis.legend(fontsize=8)
        if "log" in ylabel and chosen:
            axis.set_yscale("log")
    axes[0].set_title("decoding: eager token loop vs compiled (on CUDA: one graph per token)", fontsize=9)
    axes[1].set_title("generation's share of a vanilla PPO step", fontsize=9)
    fig.tight_layout()
    write_figure(path, fig)


if __name__ == "__main__":
    main()
