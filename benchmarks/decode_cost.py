"""The PPO step with the eager and the compiled sampler, on the same models, batches and prompts.

    python benchmarks/decode_cost.py [--model random:smollm2-135m] [--batches 8x64,64x128]
                                     [--generations eager,compiled] [--rounds 2] [--lora-rank 0]
                                     [--device cpu|cuda] [--dtype fp32|bf16] [--threads 1] [--json FILE]

One process builds the PPO stage's models once (policy, reference, critic, reward model from
``--model``; prompts from HH-RLHF in ../shared/data, else the embedded sample) and runs the
stage's own ``ppo_step`` (vanilla PPO) for every batch (``PROMPTSxNEW_TOKENS``) and every
sampler (``--generation eager`` and ``compiled``: marlhf_cli/generation/compiled.py),
round after round, the order rotated each round. Learning rates are 0, so every
configuration of a batch samples from the same weights; round 0 warms up (the compiled
sampler makes and records its buckets there) and is not timed.

Per configuration: the median step time, generation time and its share of the step, real
response tokens per second of step, milliseconds per generated token column (generation time
/ new tokens: a random-init model almost never draws EOS, which the response-length column
confirms; the prefill is counted in), peak GPU memory (on a GPU), and the compiled sampler's
speed-up over the eager one (median over rounds of the ratio within a round). ``--lora-rank R``
trains LoRA adapters instead of every weight (the peak memory of LoRA at a shape).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

MICRO_BATCH = 8  # sequences per forward and backward: a batch of 64 is 8 accumulation steps


def parse_batch(text: str) -> tuple[int, int]:
    prompts, _, tokens = text.partition("x")
    try:
        return int(prompts), int(tokens)
    except ValueError:
        raise SystemExit(f"--batches takes PROMPTSxNEW_TOKENS items such as 8x64, got {text!r}") from None


def contexts(args, batches, generations):
    """A Context per (batch, sampler) over one set of models."""
    from marlhf_cli.train import common, ppo

    data = dict(dataset="hh", data_file=str(H.HH_HELPFUL)) if H.HH_HELPFUL.is_file() else dict(dataset="hh")
    run_dir = tempfile.mkdtemp(prefix="marlhf-decode-cost-")

    def config_of(prompts, tokens, generation):
        micro = min(prompts, MICRO_BATCH)
        return H.ppo_config(
            run_dir, policy=args.model, reward_model=args.model, **data, max_records=400, termination="fixed", n=1,
            rollout_batch_size=prompts, mini_batch_size=prompts, gradient_accumulation_steps=prompts // micro,
            max_new_tokens=tokens, max_prompt_length=args.prompt_tokens, actor_lr=0.0, critic_lr=0.0, dtype=args.dtype,
            eval_every=0, eval_prompts=0, save_every=0, seed=0, max_steps=args.rounds + 1, generation=generation,
            lora_rank=args.lora_rank,
        )  # fmt: skip

    configs = {(p, t, g): config_of(p, t, g) for p, t in batches for g in generations}
    first = next(iter(configs.values()))
    common.start(first)
    plans = {key: ppo.plan_run(config) for key, config in configs.items()}
    prompts = common.load_split(first, "ppo", first.max_records, report=False)
    models = ppo.build_models(first, ppo.plan_run(first), args.model, args.model, None)
    out = {}
    for key, config in configs.items():
        # every context drives the same engines; only the rollout's settings differ
        out[key] = ppo.make_context(config, plans[key], models, prompts.records)
    return out, models, prompts.source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="policy = reference = critic = reward model base")
    parser.add_argument("--batches", default="8x64,64x128", help="comma-separated PROMPTSxNEW_TOKENS (default %(default)s)")
    parser.add_argument("--generations", default="eager,compiled", help="samplers to compare (default %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (plus one warm-up round)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank instead of full fine-tuning")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    import torch

    from marlhf_cli.train import ppo
    from marlhf_cli.generation import compiled as compiled_sampling

    batches = [parse_batch(b.strip()) for b in args.batches.split(",") if b.strip()]
    generations = [g.strip() for g in args.generations.split(",") if g.strip()]
    print(H.machine_line(args))
    started = time.perf_counter()
    ctxs, models, source = contexts(args, batches, generations)
    params = sum(p.numel() for p in models.actor.module.parameters())
    print(f"# model {args.model} ({params / 1e6:.1f}M params), batches {args.batches}, samplers {args.generations}, "
          f"prompts <= {args.prompt_tokens} tokens from {source}; {'LoRA rank ' + str(args.lora_rank) if args.lora_rank else 'full fine-tuning'}; "
          f"{args.rounds} timed rounds + 1 warm-up; lr 0", flush=True)  # fmt: skip
    keys = list(ctxs)
    times: dict[tuple, list[dict]] = {key: [] for key in keys}
    for rnd in range(args.rounds + 1):
        shift = rnd % len(keys)
        for key in keys[shift:] + keys[:shift]:
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            metrics = ppo.ppo_step(ctxs[key], rnd)
            if args.device == "cuda":
                metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if rnd > 0:
                times[key].append(metrics)
        print(f"# round {rnd} done ({time.perf_counter() - started:.0f} s)", flush=True)
    captures = compiled_sampling.captures(models.sampler.module)
    rows = table(times, keys)
    print(f"# compiled sampler: {captures} bucket(s) made{' and recorded as CUDA graphs' if args.device == 'cuda' else ''} "
          f"for {len({(p, t) for p, t, g in keys if g == 'compiled'})} batch shape(s)")  # fmt: skip
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")
    if args.json:
        from marlhf_cli.artifacts import write_json

        write_json(args.json, {"machine": H.machine_line(args), "model": args.model, "params": params, "dtype": args.dtype,
                               "lora_rank": args.lora_rank, "rounds": args.rounds, "captures": captures, "rows": rows})  # fmt: skip
        print(f"# figures written to {args.json}")


def table(times: dict[tuple, list[dict]], keys: list[tuple]) -> list[dict]:
    """Print the table; return its rows."""
    print(f"{'batch':<9}{'sampler':<10}{'step s':>8}{'gen s':>8}{'gen %':>7}{'ms/token':>10}{'tok/s':>9}"
          f"{'resp len':>9}{'peak GiB':>10}{'gen x':>7}{'step x':>8}")  # fmt: skip
    out = []
    for prompts, tokens, generation in keys:
        rows = times[(prompts, tokens, generation)]
        med = {k: H.median([r[k] for r in rows]) for k in ("step_time", "generation_time", "tokens_per_second", "response_length")}
        eager = times.get((prompts, tokens, "eager"))

        def speedup(metric, rows=rows, eager=eager):
            return H.median([e[metric] / max(c[metric], 1e-9) for e, c in zip(eager, rows)]) if eager else None

        peaks = [r["peak_memory_gib"] for r in rows if "peak_memory_gib" in r]
        row = {
            "prompts": prompts, "new_tokens": tokens, "generation": generation, "step_s": med["step_time"],
            "generation_s": med["generation_time"], "generation_share": med["generation_time"] / med["step_time"],
            "ms_per_token": 1000 * med["generation_time"] / tokens, "tokens_per_s": med["tokens_per_second"],
            "response_length": med["response_length"], "peak_memory_gib": max(peaks) if peaks else None,
            "generation_speedup": speedup("generation_time"), "step_speedup": speedup("step_time"),
        }  # fmt: skip
        out.append(row)
        peak = f"{row['peak_memory_gib']:.2f}" if peaks else "n/a"
        gen_x = f"{row['generation_speedup']:.2f}" if row["generation_speedup"] else "-"
        step_x = f"{row['step_speedup']:.2f}" if row["step_speedup"] else "-"
        print(f"{f'{prompts}x{tokens}':<9}{generation:<10}{row['step_s']:>8.3f}{row['generation_s']:>8.3f}"
              f"{100 * row['generation_share']:>6.0f}%{row['ms_per_token']:>10.2f}{row['tokens_per_s']:>9.0f}"
              f"{row['response_length']:>9.1f}{peak:>10}{gen_x:>7}{step_x:>8}")  # fmt: skip
    print("# gen x, step x: eager time / this sampler's time, the median over rounds of the ratio within a round")
    return out


if __name__ == "__main__":
    main()
