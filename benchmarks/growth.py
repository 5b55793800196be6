"""How PPO's throughput grows with response length and batch: marlhf against TRL, one grid.

    python benchmarks/growth.py [--model smollm2-135m] [--dtype bf16] [--lengths 64,128,256]
                                [--batches 8,16,32] [--steps 4] [--warmup 1] [--rounds 1]
                                [--out benchmarks/growth.png]

For each response length at batch 8 and each batch at 64 new tokens (the two lines of a
"+" through the grid, not its every cell), one ``benchmarks/vs_trl.py`` run: marlhf and TRL
1.12's PPOTrainer with its ``gc.collect()`` made a no-op (trl-core), alternately, on the same
models and prompts, both in ``--dtype`` (pick each tool's fastest precision on the machine:
bf16 where ``roofline.py`` shows bf16 matmuls fast). Prints tokens/s of both tools and their
ratio per point, and draws both lines of the grid (two panels) into ``--out``. The responses
are random-init or real-weight samples that may stop early at EOS, so each tool's tokens/s
counts the tokens it really generated.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402
import vs_trl as V  # noqa: E402


def points(lengths: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """(batch, new tokens): every length at the first batch, every batch at the first length."""
    grid = [(batches[0], n) for n in lengths] + [(b, lengths[0]) for b in batches[1:]]
    return list(dict.fromkeys(grid))


def run_point(batch: int, tokens: int, args, work: Path) -> dict:
    out = work / f"vs_trl-b{batch}-t{tokens}.json"
    command = [
        sys.executable, str(H.BENCH_DIR / "vs_trl.py"), "--batch", str(batch), "--new-tokens", str(tokens),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--no-shipped",
        "--dtype", args.dtype, "--threads", str(args.threads), "--json", str(out), "--trl-python", str(args.trl_python),
        *(["--model", args.model] if args.model else []),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        sys.exit(f"vs_trl.py failed at batch {batch}, {tokens} tokens (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    figures = json.loads(out.read_text())
    row = {"batch": batch, "new_tokens": tokens}
    for tool in ("marlhf", "trl-core"):
        entry = figures["tools"][tool]
        row[tool] = entry["tokens_per_step"] / entry["step_median"]
        row[f"{tool}_step"] = entry["step_median"]
    row["ratio"] = row["marlhf"] / row["trl-core"]
    row["ratio_per_round"] = [  # each round's marlhf run against the same round's TRL run
        (V.tokens_of(m) / V.step_median(m, args.warmup)) / (V.tokens_of(t) / V.step_median(t, args.warmup))
        for m, t in zip(figures["tools"]["marlhf"]["runs"], figures["tools"]["trl-core"]["runs"])
    ]
    return row


def draw(rows: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    first_batch, first_length = rows[0]["batch"], rows[0]["new_tokens"]
    panels = (
        ("new_tokens", f"response length (new tokens), batch {first_batch}", [r for r in rows if r["batch"] == first_batch]),
        ("batch", f"batch (responses per step), {first_length} new tokens", [r for r in rows if r["new_tokens"] == first_length]),
    )
    for ax, (key, label, line) in zip(axes, panels):
        line = sorted(line, key=lambda r: r[key])
        for tool, style in (("marlhf", "o-"), ("trl-core", "s--")):
            ax.plot([r[key] for r in line], [r[tool] for r in line], style, label=tool)
        ax.set_xscale("log", base=2)
        ax.set_xticks([r[key] for r in line], [str(r[key]) for r in line])
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("generated tokens per second (PPO step)")
    axes[0].legend()
    fig.suptitle(f"{args.model or 'tiny'}, {args.dtype}: {H.cpu_model()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="as vs_trl.py's --model ('' for the tiny random-init model)")
    parser.add_argument("--lengths", default="64,128,256")
    parser.add_argument("--batches", default="8,16,32")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="alternating runs per tool and point (vs_trl.py's --rounds)")
    parser.add_argument("--trl-python", type=Path, default=H.BENCH_DIR / ".venv-trl" / "bin" / "python")
    parser.add_argument("--out", type=Path, default=H.BENCH_DIR / "growth.png")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    print(H.machine_line(args))
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    work = Path(tempfile.mkdtemp(prefix="marlhf-growth-"))
    rows = []
    print(f"{'batch':>6}{'tokens':>8}{'marlhf s/step':>15}{'TRL s/step':>12}{'marlhf tok/s':>14}{'TRL tok/s':>11}{'ratio':>7}  per round")
    for batch, tokens in points(lengths, batches):
        row = run_point(batch, tokens, args, work)
        rows.append(row)
        print(f"{batch:>6}{tokens:>8}{row['marlhf_step']:>15.2f}{row['trl-core_step']:>12.2f}"
              f"{row['marlhf']:>14.1f}{row['trl-core']:>11.1f}{row['ratio']:>6.2f}x  "
              + ", ".join(f"{x:.2f}" for x in row["ratio_per_round"]), flush=True)  # fmt: skip
    draw(rows, args, args.out)
    print(f"# plot: {args.out}; load average at the end {H.load_average()}")
    if args.json:
        args.json.write_text(json.dumps({"machine": H.machine_line(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
