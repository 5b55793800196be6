"""Cost per PPO step of every termination rule, against vanilla PPO, on the same model and batch.

    python benchmarks/step_cost.py [--model smollm2-135m] [--batch 8] [--new-tokens 48] [--rounds 2]
                                   [--device cpu|cuda] [--dtype fp32|bf16] [--threads 1] [--json FILE]

One process builds the PPO stage's models once (policy, reference, critic and reward model
from ``--model``; prompts from HH-RLHF in ../shared/data, else the embedded sample) and runs
the stage's own ``ppo_step`` for every rule in turn, round after round, with the rule order
rotated each round. The learning rates are 0, so the weights never move and every rule of a
round samples exactly the same responses to the same prompts (the step's seed is the
round's); the update still runs in full (forward, backward, AdamW step). Round 0 is a
warm-up, not counted, of vanilla PPO and the text rules (it loads the parsers, in this
process and in the pool's worker). Defaults fit ~15 minutes on a 2-core CPU.

Times are the stage's own per-step metrics: generation, scoring (old/ref log-probs, values,
reward), credit (segmentation + segment GAE), training (the PPO update). The ratio of a rule
is the median over rounds of step_time(rule) / step_time(vanilla) of the same round.

Does parsing overlap model work? With ``--parse-workers 0`` the text rules parse inline,
after the scoring forwards, in the step's critical path. With ``--parse-workers N`` the stage
hands the parse to its process pool as soon as the responses are sampled and collects the
segments at credit assignment, so the parser runs while the reference, critic and reward
forwards do; the ``credit s`` column is then only what is left to wait for. The rows marked
``--parse-workers 1`` measure that. The last line is the headline: the worst rule's
step-time ratio, each text rule counted in its faster setting.

On a GPU (``--device cuda``; e.g. ``--model random:smollm2-1.7b --dtype bf16``, a random-init
model of SmolLM2-1.7B's shape) a second table gives per rule the peak GPU memory of its timed
steps (``torch.cuda.max_memory_allocated``) and the achieved model TFLOP/s (``_flops.py``: the
matrix work PPO needs over the step time) with its share of the GPU's dense bf16 peak.
``--json FILE`` writes every figure of both tables.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

# (label, termination, n, how): how = "inline" (--parse-workers 0) or "pool" (--parse-workers 1)
RULES = [
    ("vanilla (fixed 1)", "fixed", 1, "inline"),
    ("fixed 5", "fixed", 5, "inline"),
    ("fixed inf", "fixed", math.inf, "inline"),
    ("randomized", "randomized", 5, "inline"),
    ("ppl", "ppl", 5, "inline"),
    ("parsing", "parsing", 5, "inline"),
    ("code", "code", 10, "inline"),
    ("parsing --parse-workers 1", "parsing", 5, "pool"),
    ("code --parse-workers 1", "code", 10, "pool"),
]


def build_context(config):
    """The stage's Context, as ``ppo.run`` builds it (models, prompt schedule, settings)."""
    from marlhf_cli.train import common, ppo

    common.start(config)
    plan = ppo.plan_run(config)
    prompts = common.load_split(config, "ppo", config.max_records, report=False)
    models = ppo.build_models(config, plan, config.policy, config.reward_model, None)
    return ppo.make_context(config, plan, models, prompts.records), prompts.source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="policy = reference = critic = reward model base")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (plus one warm-up round)")
    parser.add_argument("--rules", default=None, help="comma-separated rules to run, by label (default: all; vanilla always runs)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--flops", action="store_true", help="the TFLOP/s table on a CPU too (always shown on a GPU)")
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    import torch

    from marlhf_cli.train import ppo

    data = dict(dataset="hh", data_file=str(H.HH_HELPFUL)) if H.HH_HELPFUL.is_file() else dict(dataset="hh")
    run_dir = tempfile.mkdtemp(prefix="marlhf-step-cost-")
    config = H.ppo_config(
        run_dir, policy=args.model, reward_model=args.model, **data, max_records=200,
        rollout_batch_size=args.batch, mini_batch_size=args.batch, max_new_tokens=args.new_tokens,
        max_prompt_length=args.prompt_tokens, actor_lr=0.0, critic_lr=0.0, dtype=args.dtype,
        eval_every=0, eval_prompts=0, save_every=0, seed=0, max_steps=args.rounds + 1,
    )  # fmt: skip
    print(H.machine_line(args))
    started = time.perf_counter()
    ctx, source = build_context(config)
    wanted = None if args.rules is None else {w.strip() for w in args.rules.split(",")}
    rules = [r for i, r in enumerate(RULES) if wanted is None or i == 0 or r[0] in wanted]
    params = sum(p.numel() for p in ctx.models.actor.module.parameters())
    print(f"# model {args.model} ({params / 1e6:.1f}M params x 4: actor, reference, critic, reward), "
          f"batch {args.batch}, {args.new_tokens} new tokens, prompts <= {args.prompt_tokens} tokens from {source}; "
          f"{args.rounds} timed rounds + 1 warm-up; lr 0 (identical samples for every rule)")  # fmt: skip
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))  # as the stage makes it
    times: dict[str, list[dict]] = {label: [] for label, *_ in rules}
    try:
        for rnd in range(args.rounds + 1):
            shift = rnd % len(rules)
            for label, termination, n, how in rules[shift:] + rules[:shift]:
                if rnd == 0 and not (label == rules[0][0] or termination in ("parsing", "code")):
                    continue
                config.termination, config.n = termination, n
                ctx.plan = ppo.plan_run(config)
                ctx.executor = pool if how == "pool" else None
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                metrics = ppo.ppo_step(ctx, rnd)
                if args.device == "cuda":
                    metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
                if rnd > 0:
                    times[label].append(metrics)
            print(f"# round {rnd} done ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        pool.shutdown()
    report(rules, times)
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")
    best = {}  # per rule name, the faster of its settings
    for label, termination, *_ in rules[1:]:
        name = label.split(" --")[0]
        if name not in best or ratio(times, label, "step_time")[0] < ratio(times, best[name], "step_time")[0]:
            best[name] = label
    worst = max(best.values(), key=lambda label: ratio(times, label, "step_time")[0])
    value, low, high = ratio(times, worst, "step_time")
    gpu = gpu_report(rules, times, ctx.models.actor.module.config, args) if args.device == "cuda" or args.flops else None
    print(f"worst rule: {worst}, MA-PPO / PPO step time = {value:.2f}x (rounds {low:.2f}-{high:.2f})")
    if args.json:
        from marlhf_cli.artifacts import write_json

        write_json(args.json, {
            "machine": H.machine_line(args), "model": args.model, "params": params, "batch": args.batch,
            "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "rounds": args.rounds, "dtype": args.dtype,
            "rules": {label: {"median": {k: H.median([r[k] for r in times[label]]) for k in times[label][0]},
                              "step_ratio": ratio(times, label, "step_time"), **((gpu or {}).get(label, {}))}
                      for label, *_ in rules},
            "worst_rule": worst, "worst_step_ratio": value,
        })  # fmt: skip
        print(f"# figures written to {args.json}")


def gpu_report(rules, times, model_config, args) -> dict[str, dict]:
    """Per rule: peak GPU memory, achieved model TFLOP/s and its share of the bf16 peak."""
    import torch

    from _flops import gpu_figures, ppo_step_flops

    name = torch.cuda.get_device_name(0) if args.device == "cuda" else H.cpu_model()
    out = {}
    print(f"{'rule':<28}{'step s':>8}{'tok/s':>8}{'TFLOP/s':>9}{'% peak':>8}{'peak GiB':>10}")
    for label, *_ in rules:
        rows = times[label]
        step = H.median([r["step_time"] for r in rows])
        flops = ppo_step_flops(model_config, responses=args.batch, prompt_tokens=args.prompt_tokens,
                               response_tokens=H.median([r["response_length"] for r in rows]))  # fmt: skip
        figures = gpu_figures(flops, step, name)
        peaks = [r["peak_memory_gib"] for r in rows if "peak_memory_gib" in r]  # on a GPU only
        figures["peak_memory_gib"] = max(peaks) if peaks else None
        share = f"{100 * figures['share_of_peak']:.1f}" if figures["share_of_peak"] is not None else "n/a"
        memory = f"{figures['peak_memory_gib']:.2f}" if peaks else "n/a"
        print(f"{label:<28}{step:>8.3f}{H.median([r['tokens_per_second'] for r in rows]):>8.0f}"
              f"{figures['tflops']:>9.3f}{share:>8}{memory:>10}")  # fmt: skip
        out[label] = figures
    print(f"# TFLOP/s: model FLOPs of the step (benchmarks/_flops.py, prompts counted at {args.prompt_tokens} tokens) "
          f"/ median step time; peak: {out[rules[0][0]]['peak_source']}")  # fmt: skip
    return out


def ratio(times, label, key):
    """(median, min, max) over rounds of key(rule) / key(vanilla) in the same round."""
    base = times[RULES[0][0]]
    values = sorted(row[key] / max(ref[key], 1e-9) for row, ref in zip(times[label], base))
    return H.median(values), values[0], values[-1]


def report(rules, times) -> None:
    print(f"{'rule':<28}{'gen s':>8}{'score s':>9}{'credit s':>10}{'train s':>9}{'step s':>8}"
          f"{'tok/s':>8}{'gen x':>7}{'train x':>8}{'credit %':>9}{'step x':>7}{'  step x range':<15}{'seg len':>8}{'fallbk':>7}")  # fmt: skip
    for label, *_ in rules:
        rows = times[label]
        med = {k: H.median([r[k] for r in rows]) for k in rows[0]}
        step, low, high = ratio(times, label, "step_time")
        share = 100 * H.median([r["credit_time"] / r["step_time"] for r in rows])
        print(
            f"{label:<28}{med['generation_time']:>8.2f}{med['scoring_time']:>9.2f}{med['credit_time']:>10.3f}"
            f"{med['training_time']:>9.2f}{med['step_time']:>8.2f}{med['tokens_per_second']:>8.0f}"
            f"{ratio(times, label, 'generation_time')[0]:>7.2f}{ratio(times, label, 'training_time')[0]:>8.2f}"
            f"{share:>9.1f}{step:>7.2f}  {low:.2f}-{high:.2f}     {med['segment_length']:>8.2f}{sum(r['parse_fallbacks'] for r in rows):>7.0f}"
        )  # fmt: skip
    lengths = {round(H.median([r["response_length"] for r in times[label]]), 2) for label, *_ in rules}
    print(f"# median response length per rule: {sorted(lengths)} tokens (one value = every rule saw the same responses)")


if __name__ == "__main__":
    main()
