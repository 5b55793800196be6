"""The speed stage's summary: one table and one figure from the JSON files it wrote.

    python benchmarks/gpu/speed_report.py OUTDIR

Reads OUTDIR/step_cost-<shape>.json and OUTDIR/vs_trl-<shape>.json (``suite.sh speed``),
prints per shape: marlhf's vanilla PPO step (seconds, tokens/s, model TFLOP/s, share of the
bf16 peak, peak GPU memory), the worst MA-PPO / PPO step-time ratio, and marlhf / TRL tokens
per second; writes OUTDIR/speed.json (those rows) and OUTDIR/speed.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(out: Path) -> list[dict]:
    table = []
    for path in sorted(out.glob("step_cost-*.json")):
        shape = path.stem.removeprefix("step_cost-")
        cost = json.loads(path.read_text())
        vanilla = cost["rules"]["vanilla (fixed 1)"]
        row = {"shape": shape, "params": cost["params"], "step_s": vanilla["median"]["step_time"],
               "tokens_per_s": vanilla["median"]["tokens_per_second"],
               "phases_s": {k: vanilla["median"][k] for k in ("generation_time", "scoring_time", "credit_time", "training_time")},
               "tflops": vanilla.get("tflops"), "share_of_peak": vanilla.get("share_of_peak"),
               "peak_memory_gib": vanilla.get("peak_memory_gib"), "worst_rule": cost["worst_rule"],
               "worst_step_ratio": cost["worst_step_ratio"]}  # fmt: skip
        trl = out / f"vs_trl-{shape}.json"
        if trl.is_file():
            tools = json.loads(trl.read_text())["tools"]
            speed = {t: v["tokens_per_step"] / v["step_median"] for t, v in tools.items()}
            row["vs_trl"] = {t: {"tokens_per_s": speed[t], "tflops": v.get("tflops"), "peak_memory_gib": v.get("peak_memory_gib")}
                             for t, v in tools.items()}  # fmt: skip
            row["marlhf_over_trl"] = speed["marlhf"] / speed["trl-core"] if "trl-core" in speed else None
        table.append(row)
    return table


def fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    out = Path(sys.argv[1])
    table = rows(out)
    if not table:
        sys.exit(f"no step_cost-*.json in {out}")
    print(f"{'shape':<14}{'params':>9}{'step s':>8}{'tok/s':>8}{'TFLOP/s':>9}{'% peak':>8}{'peak GiB':>9}"
          f"{'worst MA/PPO':>14}{'marlhf/TRL':>12}")  # fmt: skip
    for r in table:
        share = None if r["share_of_peak"] is None else 100 * r["share_of_peak"]
        print(f"{r['shape']:<14}{r['params'] / 1e6:>8.0f}M{r['step_s']:>8.3f}{r['tokens_per_s']:>8.0f}"
              f"{fmt(r['tflops'], '.2f'):>9}{fmt(share, '.1f'):>8}{fmt(r['peak_memory_gib'], '.2f'):>9}"
              f"{r['worst_step_ratio']:>13.2f}x{fmt(r.get('marlhf_over_trl'), '.2f'):>11}x")  # fmt: skip
    from marlhf_cli.artifacts import write_figure, write_json

    write_json(out / "speed.json", table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=110)
    shapes = [r["shape"] for r in table]
    tools = ["marlhf", "trl-core"]
    for i, tool in enumerate(tools):
        values = [r["vs_trl"][tool]["tokens_per_s"] if tool in r.get("vs_trl", {}) else 0.0 for r in table]
        left.bar([x + 0.4 * i for x in range(len(shapes))], values, width=0.4, label=tool)
    left.set_xticks([x + 0.2 for x in range(len(shapes))], shapes)
    left.set_ylabel("PPO tokens/s (vanilla, batch 8)")
    left.set_title("marlhf vs TRL 1.12, same models and settings", fontsize=9)
    left.legend(fontsize=8)
    phases = ("generation_time", "scoring_time", "credit_time", "training_time")
    bottom = [0.0] * len(table)
    for phase in phases:
        values = [r["phases_s"][phase] for r in table]
        right.bar(shapes, values, bottom=bottom, label=phase.replace("_time", ""))
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_ylabel("seconds per marlhf PPO step")
    right.set_title("marlhf step by phase (step_cost.py, vanilla)", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    write_figure(out / "speed.png", fig)
    print(f"# wrote {out / 'speed.json'} and {out / 'speed.png'}")


if __name__ == "__main__":
    main()
