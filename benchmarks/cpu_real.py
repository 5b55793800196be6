"""The README's third command over seeds, with the control a sceptic asks for first.

    python benchmarks/cpu_real.py [--seeds 0,1,2] [--threads 2] [--out DIR]

Runs ``marlhf ppo --preset cpu-real --seed S`` (SmolLM2-135M-Instruct, MA-PPO fixed 5, 30
steps of 8 responses on the project's 48 posts, the concise-summary reward) once per seed,
each in its own run directory, exactly as the README runs it, then the **control**: the same
command at ``--actor-lr 0`` for the first seed, whose policy never moves, so that its "gain"
is what sampling the same policy twice gives (it should hold 0). Each run's figures are its
run.json's ``eval_gain``: the held-out score before and after on the 24 held-out posts (one
sample each) and the paired gain with its 95% t-interval over prompts. The table gives them
per run, the mean gain over the seeds with a t-interval over seeds (3 seeds: a wide one),
and each run's minutes. The results page is docs/results/cpu-real.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MARLHF = [sys.executable, "-m", "marlhf_cli.cli"]


def run(name: str, flags: list[str], out: Path, threads: int) -> dict:
    """One ``marlhf ppo --preset cpu-real`` run (skipped when its run.json says finished)."""
    run_dir = out / name
    manifest = run_dir / "run.json"

    def finished() -> dict | None:
        if not manifest.is_file():
            return None
        entry = json.loads(manifest.read_text())["stages"].get("ppo/fixed5", {})
        return entry if entry.get("status") == "finished" else None

    if finished() is None:
        argv = ["ppo", "--preset", "cpu-real", "--run-dir", str(run_dir), *flags]
        started = time.perf_counter()
        with open(out / f"{name}.log", "w", encoding="utf-8") as log:
            log.write("$ marlhf " + " ".join(argv) + "\n")
            log.flush()
            code = subprocess.run([*MARLHF, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=H.child_env(threads)).returncode
        if code != 0:
            sys.exit(f"{name} failed (exit {code}): {out / f'{name}.log'}")
        (out / f"{name}.seconds").write_text(f"{time.perf_counter() - started:.1f}\n")
    entry = finished()
    seconds = float((out / f"{name}.seconds").read_text()) if (out / f"{name}.seconds").is_file() else float("nan")
    return {"name": name, "seconds": seconds, **entry["metrics"]["eval_gain"]}


def interval(gain: dict) -> str:
    ci = gain["gain_ci"]
    return f"{gain['gain']:+.3f}" + ("" if ci is None else f" [{ci[0]:+.3f}, {ci[1]:+.3f}]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "cpu-real-seeds")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    print(H.machine_line(), flush=True)
    rows = [run(f"seed{s}", ["--seed", str(s)], args.out, args.threads) for s in seeds]
    control = run(f"seed{seeds[0]}-lr0", ["--seed", str(seeds[0]), "--actor-lr", "0"], args.out, args.threads)
    print("\n| run | held-out prompts | before | after | gain [95% paired t-interval] | minutes |")
    print("|---|---:|---:|---:|---|---:|")
    for row in [*rows, control]:
        label = row["name"] + (" (control: --actor-lr 0)" if row is control else "")
        print(f"| {label} | {row['prompts']} | {row['before']:.3f} | {row['after']:.3f} | {interval(row)} | {row['seconds'] / 60:.1f} |")
    gains = [row["gain"] for row in rows]
    if len(gains) > 1:
        from scipy import stats

        low, high = stats.ttest_1samp(gains, 0.0).confidence_interval(0.95)
        print(f"\nmean gain over {len(gains)} seeds {statistics.mean(gains):+.3f} [95% t-interval over seeds {low:+.3f}, {high:+.3f}]; "
              f"smallest {min(gains):+.3f}; control {control['gain']:+.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
