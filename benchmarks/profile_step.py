"""Where marlhf's PPO step spends its time: torch profiler's top operators, per phase.

    python benchmarks/profile_step.py [--hidden 256 --layers 4] [--steps 3] [--top 25]

Builds the stage's context exactly as ``vs_trl.py``'s marlhf worker runs it (same random-init
Llama policy and reward model, HH-RLHF prompts, vanilla PPO, batch 8, 64 new tokens at
temperature 0.8, no top-k/top-p, fp32), runs two warm-up steps, then profiles ``--steps``
steps of ``ppo.ppo_step`` and prints the operators with the most self CPU time, and the
share of each phase (generation, scoring, credit, training) in the profiled steps' wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402
import vs_trl  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after 2 warm-up steps)")
    parser.add_argument("--top", type=int, default=25, help="operators listed")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--model", default=None, help="real weights (e.g. smollm2-135m) instead of a random-init Llama")
    parser.add_argument("--hidden", type=int, default=None, help="model width (default: the tiny alias, 64)")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default: the tiny alias, 2)")
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    from torch.profiler import ProfilerActivity, profile

    from marlhf_cli.train import common, ppo

    print(H.machine_line(args))
    work = Path(tempfile.mkdtemp(prefix="marlhf-profile-"))
    info = vs_trl.prepare(work, args)
    config = vs_trl.marlhf_config(work, args, steps=args.steps + 2)
    common.start(config)
    plan = ppo.plan_run(config)
    prompts = common.load_split(config, "ppo", config.max_records, report=False)
    models = ppo.build_models(config, plan, config.policy, config.reward_model, None)
    ctx = ppo.make_context(config, plan, models, prompts.records)
    print(f"# {info['params'] / 1e6:.1f}M params, batch {vs_trl.SETTINGS['batch']}, {vs_trl.SETTINGS['new_tokens']} new tokens")
    for step in range(2):
        ppo.ppo_step(ctx, step)
    rows = []
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(2, 2 + args.steps):
            rows.append(ppo.ppo_step(ctx, step))
    wall = time.perf_counter() - started
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48))
    phases = ("generation_time", "scoring_time", "credit_time", "training_time")
    total = sum(r["step_time"] for r in rows)
    print("# phase shares of the profiled steps: " + ", ".join(
        f"{k.replace('_time', '')} {sum(r[k] for r in rows) / len(rows):.3f} s ({100 * sum(r[k] for r in rows) / total:.0f}%)"
        for k in phases))  # fmt: skip
    print(f"# {args.steps} steps, {total / len(rows):.3f} s/step under the profiler ({wall:.1f} s wall); "
          f"load average {H.load_average()}")  # fmt: skip


if __name__ == "__main__":
    main()
