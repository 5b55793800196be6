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

Then, for the first two mc configurations, what sharing a prefix's KV cache saves: the
continuation phase of one rollout with a boundary's M continuations sharing one forward over
their prompt + response prefix (as the stage does) against every continuation prefilled on
its own, alternately, and the prefill alone over every continuation and over the distinct
prefixes (what is left, and the most that reusing the rollout's own cache could save).
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
    plans = {key: ppo.plan_run(config) for key, config in configs.items()}
    prompts = common.load_split(first, "ppo", first.max_records, report=False)
    models = ppo.build_models(first, ppo.plan_run(first), args.model, args.model, None)
    without_critic = dataclasses.replace(models, critic=None)
    out = {}
    for label, config in configs.items():
        out[label] = ppo.make_context(config, plans[label], models if config.advantage == "gae" else without_critic, prompts.records)
    return out, prompts.source


def prefix_sharing(ctx, step: int, repeats: int = 3) -> dict:
    """mc's continuation phase on one rollout of ``ctx``, alternately with the M continuations
    of a boundary sharing one prefill of their prefix (as the stage does) and with every
    continuation prefilled on its own (the same continuations as a plan of M copies of each
    boundary with M = 1), and the seconds of the prefill alone, over every continuation and
    over distinct prefixes."""
    import torch

    from marlhf_cli.macro import BoundaryPlan, boundary_plan, cap_segments
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
    copies = BoundaryPlan(*(x.repeat_interleave(m) for x in (plan.rows, plan.boundaries, plan.positions)), plan.segments)
    rows = exp.batch_size * m
    timed = {"shared_s": [], "unshared_s": []}
    for _ in range(repeats):
        for key, (which, rollouts) in (("shared_s", (plan, m)), ("unshared_s", (copies, 1))):
            began = time.perf_counter()
            done = sample_continuations(sampler, models.tokenizer, models.reward, exp, which, ctx.rollout, rollouts=rollouts,
                                        seeds=seeds, rows_per_batch=rows)  # fmt: skip
            timed[key].append(time.perf_counter() - began)
    prefix_ids, prefix_mask = _prefixes(exp, plan, models.tokenizer.pad_token_id)

    @torch.no_grad()
    def prefill(rows_ids, rows_mask, chunk):
        began = time.perf_counter()
        for start in range(0, rows_ids.shape[0], chunk):
            part_ids, part_mask = rows_ids[start : start + chunk], rows_mask[start : start + chunk]
            sampler(input_ids=part_ids, attention_mask=part_mask, position_ids=position_ids_from_mask(part_mask),
                    use_cache=True, logits_to_keep=1)  # fmt: skip
        return time.perf_counter() - began

    every = prefill(prefix_ids.repeat_interleave(m, dim=0), prefix_mask.repeat_interleave(m, dim=0), rows)
    distinct = prefill(prefix_ids, prefix_mask, exp.batch_size)
    return {"shared_s": H.median(timed["shared_s"]), "unshared_s": H.median(timed["unshared_s"]),
            "ratios": [a / b for a, b in zip(timed["shared_s"], timed["unshared_s"])], "prefill_s": every,
            "distinct_prefill_s": distinct, "continuations": len(plan) * m, "tokens": done.tokens,
            "mean_prefix": float(prefix_mask.sum(1).float().mean())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="policy = reference = critic = reward model base")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--k", type=int, default=4, help="responses per prompt, for every configuration")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (after one warm-up step)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated (default {DEFAULT_CONFIGS})")
    parser.add_argument("--no-prefix-sharing", action="store_true", help="skip the prefix-sharing measurement at the end")
    parser.add_argument("--json", type=Path, default=None, help="also write the table's figures to this JSON file")
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
    figures = report(rows, labels)
    if args.json:
        from marlhf_cli.artifacts import write_json

        write_json(args.json, {"machine": H.machine_line(args), "model": args.model, "prompts": args.prompts, "k": args.k,
                               "new_tokens": args.new_tokens, "dtype": args.dtype, "configs": figures})  # fmt: skip
    for label in [label for label in labels if label.startswith("mc")][:2 * (not args.no_prefix_sharing)]:
        share = prefix_sharing(ctxs[label], args.rounds + 1)
        print(f"# {label}, one rollout: {share['continuations']} continuations ({share['tokens']} tokens, mean prefix "
              f"{share['mean_prefix']:.0f} tokens): {share['shared_s']:.2f} s with a boundary's M continuations sharing "
              f"one prefill, {share['unshared_s']:.2f} s prefilling each (shared / unshared per repeat: "
              f"{', '.join(f'{r:.2f}' for r in share['ratios'])}); the prefill of every continuation alone "
              f"{share['prefill_s']:.2f} s, of the distinct prefixes {share['distinct_prefill_s']:.2f} s "
              f"({share['distinct_prefill_s'] / share['shared_s']:.0%} of the shared phase: the most that reusing "
              f"the rollout's own cache could still save)")  # fmt: skip
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")


def report(rows: dict[str, list[dict]], labels: list[str]) -> dict[str, dict]:
    """Print the table; return its figures per configuration."""
    def med(label, key):
        return H.median([row.get(key, 0.0) for row in rows[label]])

    def per_round(label, base):
        """The median over rounds of the step-time ratio within a round (robust to load drift)."""
        return H.median([a["step_time"] / b["step_time"] for a, b in zip(rows[label], rows[base])])

    print(f"{'config':<16}{'gen s':>8}{'cont s':>8}{'score s':>9}{'train s':>9}{'step s':>8}{'x rloo':>8}{'x gae':>7}"
          f"{'resp tok':>10}{'cont tok':>10}{'gen tok':>9}{'gen x':>7}{'tok/s':>8}")  # fmt: skip
    base_tokens = med(labels[0], "generated_tokens")
    figures = {}
    for label in labels:
        step = med(label, "step_time")
        ratio = {b: (f"{per_round(label, b):.2f}" if b in rows else "-") for b in ("rloo", "gae")}
        generated = med(label, "generated_tokens")
        figures[label] = {"step_s": step, "generation_s": med(label, "generation_time"),
                          "continuation_s": med(label, "continuation_time"), "generated_tokens": generated,
                          **{f"over_{b}": per_round(label, b) for b in ("rloo", "gae") if b in rows}}  # fmt: skip
        print(
            f"{label:<16}{med(label, 'generation_time'):>8.2f}{med(label, 'continuation_time'):>8.2f}"
            f"{med(label, 'scoring_time'):>9.2f}{med(label, 'training_time'):>9.2f}{step:>8.2f}{ratio['rloo']:>8}"
            f"{ratio['gae']:>7}{med(label, 'response_tokens'):>10.0f}{med(label, 'continuation_tokens'):>10.0f}"
            f"{generated:>9.0f}{generated / base_tokens:>7.2f}{generated / step:>8.1f}"
        )  # fmt: skip
    return figures


if __name__ == "__main__":
    main()
