"""Step time and generated tokens of ``--advantage mc`` against rloo and gae at the same K.

    python benchmarks/mc_cost.py [--model tiny|smollm2-135m] [--prompts 2] [--k 4]
                                 [--new-tokens 48] [--rounds 2] [--configs gae,rloo,mc-fixed8-m2,...]
                                 [--device cpu|cuda] [--dtype fp32|bf16] [--threads 1]

One process builds the PPO stage's models once (actor, reference, reward model, and the critic
for gae; the critic-free estimators share the same actor, reference and reward) and runs the
stage's own ``ppo_step`` for every configuration in turn, round after round, the order rotated
each round, so every configuration sees the machine's load alike: on a shared machine only
the ratios within one run mean anything. Learning rates are 0, so all configurations sample
the same responses in a round (the printed response tokens prove it) and mc's continuations
are the only extra sampling. Round 0 (the first configuration alone) warms up and is not timed.

Configurations: ``gae`` (the critic, fixed 5), ``rloo``, and ``mc-<rule>-m<M>[-b<B>]``.
Reported per configuration: median step time and its phases, step time over rloo's and over
gae's (the median over rounds of the ratio within a round), generated tokens per step
(responses + continuations), their ratio to the first configuration's, and generated tokens
per second of step.

Then, for the first mc configuration, where the continuations' time goes: the prefill (one
forward over every continuation's prompt + response prefix, the sampler's first step) against
the whole continuation phase, and that prefill over the distinct prefixes only (what sharing
one prefix's KV cache among its M continuations would cost instead). That is the most that
reusing the prefix cache could save.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

DEFAULT_CONFIGS = "gae,rloo,mc-fixed8-m2,mc-fixed8-m4,mc-ppl-m2,mc-ppl-m4"


def flags_of(label: str) -> dict:
    """The options of a configuration label."""
    if label in ("gae", "rloo", "grpo"):
        return {"advantage": label, "termination": "fixed", "n": 5}
    parts = label.split("-")
    if parts[0] != "mc" or len(parts) < 3:
        raise SystemExit(f"unknown configuration {label!r}: gae, rloo, grpo or mc-<fixedN|ppl|randomized>-m<M>[-b<B>]")
    rule = parts[1]
    flags = {"advantage": "mc", "mc_rollouts": int(parts[2][1:])}
    if rule.startswith("fixed"):
        flags.update(termination="fixed", n=int(rule[5:]))
    else:
        flags.update(termination=rule)
    if len(parts) > 3:
        flags["mc_max_boundaries"] = int(parts[3][1:])
    return flags


def contexts(args, labels):
    """A Context per configuration over one set of models (the critic only for gae)."""
    from marlhf_cli.train import common, ppo

    data = dict(dataset="hh", data_file=str(H.HH_HELPFUL)) if H.HH_HELPFUL.is_file() else dict(dataset="hh")
    base = dict(policy=args.model, reward_model=args.model, **data, max_records=200, samples_per_prompt=args.k,
                rollout_batch_size=args.prompts, mini_batch_size=args.prompts * args.k, max_new_tokens=args.new_tokens,
                max_prompt_length=args.prompt_tokens, actor_lr=0.0, critic_lr=0.0, dtype=args.dtype, eval_every=0,
                eval_prompts=0, save_every=0, seed=0, max_steps=args.rounds + 1)  # fmt: skip
    run_dir = tempfile.mkdtemp(prefix="marlhf-mc-cost-")
    configs = {label: H.ppo_config(run_dir, **base, **flags_of(label)) for label in labels}
    first = configs.get("gae") or next(iter(configs.values()))
    common.start(first)
    for config in configs.values():
        ppo.check_options(config)
    prompts = common.load_split(first, "ppo", first.max_records, report=False)
    models = ppo.build_models(first, args.model, args.model, None)
    without_critic = dataclasses.replace(models, critic=None)
    out = {}
    for label, config in configs.items():
        out[label] = ppo.make_context(config, models if config.advantage == "gae" else without_critic, prompts.records)
    return out, prompts.source


def prefill_share(ctx, step: int) -> dict:
    """Seconds of mc's continuation phase, of its prefill over every continuation, and of the
    prefill over distinct prefixes only, for one rollout of ``ctx``."""
    import torch

    from marlhf_cli.macro import boundary_plan, cap_segments
    from marlhf_cli.train.forward import position_ids_from_mask
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.continuations import _prefixes, continuation_seed, sample_continuations
    from marlhf_cli.train.ppo.experience import make_experience

    config, models = ctx.config, ctx.models
    torch.manual_seed(step)
    records, numbers = ctx.schedule.for_rank(step, 0, 1, config.samples_per_prompt)
    sampler = models.sampler.model()
    exp = make_experience(models.actor, models.reference, None, models.reward, models.tokenizer,
                          [r["prompt"] for r in records], records, ctx.rollout, device=models.device, sampler=sampler)  # fmt: skip
    ids, _ = credit.segment_responses(exp, ctx.rule, tokenizer=models.tokenizer, sample_seeds=numbers)
    plan = boundary_plan(cap_segments(ids, exp.mask, config.mc_max_boundaries), exp.mask)
    m = config.mc_rollouts
    seeds = [continuation_seed(0, step, numbers[r], p, i) for r, p in zip(plan.rows.tolist(), plan.positions.tolist()) for i in range(m)]
    began = time.perf_counter()
    done = sample_continuations(sampler, models.tokenizer, models.reward, exp, plan, ctx.rollout, rollouts=m, seeds=seeds,
                                rows_per_batch=exp.batch_size * m)  # fmt: skip
    whole = time.perf_counter() - began
    prefix_ids, prefix_mask = _prefixes(exp, plan, models.tokenizer.pad_token_id)

    @torch.no_grad()
    def prefill(rows_ids, rows_mask, chunk):
        began = time.perf_counter()
        for start in range(0, rows_ids.shape[0], chunk):
            part_ids, part_mask = rows_ids[start : start + chunk], rows_mask[start : start + chunk]
            sampler(input_ids=part_ids, attention_mask=part_mask, position_ids=position_ids_from_mask(part_mask),
                    use_cache=True, logits_to_keep=1)  # fmt: skip
        return time.perf_counter() - began

    every = prefill(prefix_ids.repeat_interleave(m, dim=0), prefix_mask.repeat_interleave(m, dim=0), exp.batch_size * m)
    distinct = prefill(prefix_ids, prefix_mask, exp.batch_size * m)
    return {"continuation_s": whole, "prefill_s": every, "distinct_prefill_s": distinct, "continuations": len(plan) * m,
            "tokens": done.tokens, "mean_prefix": float(prefix_mask.sum(1).float().mean())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="policy = reference = critic = reward model base")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--k", type=int, default=4, help="responses per prompt, for every configuration")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up step)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated (default {DEFAULT_CONFIGS})")
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    labels = [label.strip() for label in args.configs.split(",") if label.strip()]
    for label in labels:
        flags_of(label)
    print(H.machine_line(args))
    started = time.perf_counter()
    ctxs, source = contexts(args, labels)
    print(f"# model {args.model}, {args.prompts} prompts x K={args.k} = {args.prompts * args.k} responses per step, "
          f"{args.new_tokens} new tokens, prompts <= {args.prompt_tokens} tokens from {source}; lr 0 (identical "
          f"responses); {args.rounds} timed rounds after 1 warm-up step, order rotated per round", flush=True)  # fmt: skip
    from marlhf_cli.train import ppo

    rows: dict[str, list[dict]] = {label: [] for label in labels}
    for rnd in range(args.rounds + 1):
        shift = rnd % len(labels)
        for label in labels[shift:] + labels[:shift]:
            if rnd == 0 and label != labels[0]:
                continue  # one warm-up step loads and compiles what every configuration uses
            metrics = ppo.ppo_step(ctxs[label], rnd)
            if rnd:
                rows[label].append(metrics)
        print(f"# round {rnd} done ({time.perf_counter() - started:.0f} s)", flush=True)
    report(rows, labels)
    first_mc = next((label for label in labels if label.startswith("mc")), None)
    if first_mc:
        share = prefill_share(ctxs[first_mc], args.rounds + 1)
        print(f"# {first_mc}, one rollout: {share['continuations']} continuations ({share['tokens']} tokens, mean prefix "
              f"{share['mean_prefix']:.0f} tokens) took {share['continuation_s']:.2f} s; their prefill alone "
              f"{share['prefill_s']:.2f} s ({share['prefill_s'] / share['continuation_s']:.0%}); over distinct prefixes "
              f"only {share['distinct_prefill_s']:.2f} s, so sharing a prefix's cache among its M continuations would "
              f"save at most {(share['prefill_s'] - share['distinct_prefill_s']) / share['continuation_s']:.0%}, and "
              f"reusing the rollout's cache at most {share['prefill_s'] / share['continuation_s']:.0%}")  # fmt: skip
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")


def report(rows: dict[str, list[dict]], labels: list[str]) -> None:
    def med(label, key):
        return H.median([row.get(key, 0.0) for row in rows[label]])

    def per_round(label, base):
        """The median over rounds of the step-time ratio within a round (robust to load drift)."""
        return H.median([a["step_time"] / b["step_time"] for a, b in zip(rows[label], rows[base])])

    print(f"{'config':<16}{'gen s':>8}{'cont s':>8}{'score s':>9}{'train s':>9}{'step s':>8}{'x rloo':>8}{'x gae':>7}"
          f"{'resp tok':>10}{'cont tok':>10}{'gen tok':>9}{'gen x':>7}{'tok/s':>8}")  # fmt: skip
    base_tokens = med(labels[0], "generated_tokens")
    for label in labels:
        step = med(label, "step_time")
        ratio = {b: (f"{per_round(label, b):.2f}" if b in rows else "-") for b in ("rloo", "gae")}
        generated = med(label, "generated_tokens")
        print(
            f"{label:<16}{med(label, 'generation_time'):>8.2f}{med(label, 'continuation_time'):>8.2f}"
            f"{med(label, 'scoring_time'):>9.2f}{med(label, 'training_time'):>9.2f}{step:>8.2f}{ratio['rloo']:>8}"
            f"{ratio['gae']:>7}{med(label, 'response_tokens'):>10.0f}{med(label, 'continuation_tokens'):>10.0f}"
            f"{generated:>9.0f}{generated / base_tokens:>7.2f}{generated / step:>8.1f}"
        )  # fmt: skip


if __name__ == "__main__":
    main()
