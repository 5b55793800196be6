"""How far each phase of the PPO step is from what this machine allows: a roofline.

    python benchmarks/roofline.py [--model tiny | --model smollm2-135m | --hidden 512 --layers 8]
                                  [--dtype fp32|bf16] [--batch 8] [--new-tokens 64] [--prompt-tokens 32]
                                  [--steps 3] [--threads 1] [--json FILE]

1. The machine: CPU model and the flags that decide bf16 speed (avx512_bf16: bf16 dot
   products in AVX-512; amx_bf16: Intel's matrix unit), torch threads.
2. Its ceilings, measured here at the step's own shapes and thread count: matmul FLOP/s in
   fp32 and bf16 (the best of ``[rows, h] x [h, i]`` and ``[rows, h] x [h, V]`` with rows the
   step's tokens or, as decoding has them, its batch; a bf16 run's ceiling is never below
   fp32's, since where bf16 is emulated torch computes some of it in fp32), memory bandwidth (a 256 MiB copy: bytes read + written per second), and the rate at
   which a ``[B, h] x [h, i]`` product at the sampling batch streams its weights (what one
   decoding step does per layer).
3. The step: the stage's own ``ppo_step`` (vanilla PPO, learning rates 0 so every step
   samples the same responses), one untimed step under ``torch.utils.flop_counter`` to count
   each phase's executed FLOPs, then ``--steps`` timed steps (the stage's own phase times).
4. Per phase: seconds, executed GFLOP, bytes that must move (analytic: decoding reads the
   sampling model's weights and KV cache once per token; an AdamW step reads and writes
   its fp32 states), achieved GFLOP/s, the ideal time (prefill and forwards at the matmul
   peak, decoding at the larger of its compute and memory time, AdamW at the bandwidth) and
   the fraction of the roofline = ideal / measured. The padding share is the part of the
   scoring and update forwards spent on pad positions (left-padded prompts, responses
   after their EOS): executed but useless work.

Figures are only comparable within one run of this script (the machine line says what else
the machine was doing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags() -> list[str]:
    """The flags of BF16_FLAGS this CPU has (what ``--dtype auto`` reads too)."""
    from marlhf_cli.precision import cpu_flags as all_flags

    return [f for f in BF16_FLAGS if f in all_flags()]


def _best_seconds(fn, repeats: int = 5, min_seconds: float = 0.05) -> float:
    """Best time of one call of ``fn`` over ``repeats`` timings (each of enough calls to last
    ``min_seconds``), after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        calls, began = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - began
            if elapsed >= min_seconds:
                break
        best = min(best, elapsed / calls)
    return best


def matmul_rate(m: int, k: int, n: int, dtype) -> float:
    """FLOP/s of ``[m, k] x [k, n]`` in ``dtype``."""
    import torch

    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / _best_seconds(lambda: a @ b)


def copy_bandwidth(nbytes: int = 256 << 20) -> float:
    """Bytes per second of a large copy, counting the bytes read and the bytes written."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_seconds(lambda: dst.copy_(src), repeats=3)


def weight_stream_rate(batch: int, k: int, n: int, dtype, layers: int = 8) -> float:
    """Weight bytes per second of ``[batch, k] x [k, n]`` over ``layers`` distinct weights
    (so that they do not all stay in cache), as one decoding step reads a model's layers."""
    import torch

    weights = [torch.randn(k, n, dtype=dtype) for _ in range(layers)]
    x = torch.randn(batch, k, dtype=dtype)

    def run():
        for w in weights:
            x @ w

    return layers * k * n * weights[0].element_size() / _best_seconds(run)


@contextmanager
def flops_per_phase(counts: dict[str, float]):
    """Count executed FLOPs per phase of ``ppo_step``: generation (the sampling call),
    scoring (the rest of the rollout: old/ref log-probs, values, reward) and update, by
    reading one FlopCounterMode's total around the functions each phase calls."""
    from torch.utils.flop_counter import FlopCounterMode

    from marlhf_cli.train import ppo
    from marlhf_cli.train.ppo import experience

    _count_cpu_attention()
    counter = FlopCounterMode(display=False)
    originals = {"generate": experience.generate, "experience": ppo.make_experience, "update": ppo.ppo_update}
    shapes: dict[str, tuple] = {}

    def measured(name, fn, keep=None):
        def wrapper(*args, **kwargs):
            before = counter.get_total_flops()
            out = fn(*args, **kwargs)
            counts[name] = counts.get(name, 0) + counter.get_total_flops() - before
            if keep is not None:
                keep(out)
            return out

        return wrapper

    def keep_generated(out):
        prompt_ids, prompt_mask, response_ids, mask = out[:4]
        shapes["generation"] = (tuple(prompt_ids.shape), tuple(response_ids.shape), int(prompt_mask.sum()), int(mask.sum()))

    experience.generate = measured("generation", originals["generate"], keep_generated)
    ppo.make_experience = measured("rollout", originals["experience"])
    ppo.ppo_update = measured("update", originals["update"])
    try:
        with counter:
            yield shapes
    finally:
        experience.generate, ppo.make_experience, ppo.ppo_update = originals.values()
    counts["scoring"] = counts.pop("rollout", 0) - counts.get("generation", 0)


def _count_cpu_attention() -> None:
    """torch's FLOP counter knows the CUDA attention kernels; teach it the CPU one (same
    FLOPs as any exact attention: 4 * B * heads * Lq * Lk * d forward, 2.5x that backward)."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None and forward.default not in fc.flop_registry:
        fc.register_flop_formula(forward)(
            lambda q, k, v, *args, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v)
        )
    if backward is not None and backward.default not in fc.flop_registry:
        fc.register_flop_formula(backward)(
            lambda grad, q, k, v, *args, out_shape=None, **kw: fc.sdpa_backward_flop_count(grad, q, k, v)
        )


def model_sizes(module) -> dict[str, int]:
    """Parameter counts: every parameter, and the part a decoding step reads in full (all but
    the input embedding's table, of which it gathers B rows; a tied head is read as the head)."""
    net = getattr(module, "module", module)
    total = sum(p.numel() for p in net.parameters())
    embedding = net.get_input_embeddings().weight
    head = net.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embedding.data_ptr()
    streamed = total - (0 if tied else embedding.numel())
    return {"total": total, "streamed": streamed, "element_size": embedding.element_size()}


def roofline(phase_seconds, flops, shapes, sizes, config, peak, bandwidth, optimizer_params, padding):
    """Rows of the table: per phase, what moved, what it achieved and the ideal time."""
    cfg = config
    (batch, prompt_len), (_, steps), _, _ = shapes
    bpe = sizes["element_size"]
    kv_width = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    # decoding: each step after the prefill reads the streamed weights once and the KV cache so far
    kv_bytes = sum(2 * cfg.num_hidden_layers * kv_width * (prompt_len + t) * batch * bpe for t in range(1, steps))
    decode_bytes = (steps - 1) * sizes["streamed"] * bpe + kv_bytes
    prefill_flops = 2 * (sizes["streamed"] - cfg.vocab_size * cfg.hidden_size) * batch * prompt_len
    decode_flops = max(flops["generation"] - prefill_flops, 0.0)
    adam_bytes = optimizer_params * 4 * 7  # fp32: read param, grad, two moments; write param, two moments
    ideal = {
        "generation": prefill_flops / peak + max(decode_flops / peak, decode_bytes / bandwidth),
        "scoring": flops["scoring"] / peak,
        "update": flops["update"] / peak + adam_bytes / bandwidth,
    }
    moved = {"generation": decode_bytes, "scoring": 0.0, "update": adam_bytes}
    rows = []
    for phase in ("generation", "scoring", "update"):
        seconds = phase_seconds[phase]
        rows.append({
            "phase": phase, "seconds": seconds, "gflop": flops[phase] / 1e9, "gbytes": moved[phase] / 1e9,
            "gflops_per_s": flops[phase] / seconds / 1e9, "ideal_seconds": ideal[phase],
            "roofline_fraction": ideal[phase] / seconds,
            "bound": "memory" if phase == "generation" and decode_bytes / bandwidth > decode_flops / peak else "compute",
            "padding_share": padding if phase != "generation" else None,
        })  # fmt: skip
    return rows


def build_models(work: Path, args) -> tuple[str, str]:
    """Policy and reward-model paths: an alias, or random-init Llama folders of the given shape."""
    if not (args.hidden or args.layers):
        return args.model, args.model
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    from marlhf_cli.models import TINY_SEED, load_tokenizer, tiny_config

    tokenizer = load_tokenizer("tiny")
    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    if args.hidden:
        overrides.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 128))  # fmt: skip
    for name, cls, extra in (("policy", LlamaForCausalLM, {}), ("reward", LlamaForSequenceClassification, {"num_labels": 1})):
        torch.manual_seed(TINY_SEED)
        cls(tiny_config(tokenizer, **overrides, **extra)).save_pretrained(work / name)
        tokenizer.save_pretrained(work / name)
    return str(work / "policy"), str(work / "reward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="policy = reference = critic = reward model base (an alias or path)")
    parser.add_argument("--hidden", type=int, default=None, help="random-init Llama of this width instead of --model")
    parser.add_argument("--layers", type=int, default=None, help="... and this many layers")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one counted, untimed step)")
    parser.add_argument("--advantage", default="gae", help="gae (vanilla PPO), rloo, grpo or mc")
    parser.add_argument("--samples-per-prompt", type=int, default=None, help="K: --batch responses = batch/K prompts x K")
    parser.add_argument("--prefill-per-copy", action="store_true",
                        help="read a group's prompt K times (as before the shared prefill), for the A/B comparison")
    parser.add_argument("--zero-stage", type=int, default=0, help="the engines' ZeRO stage (one process)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    import torch

    from step_cost import build_context
    from marlhf_cli.train import ppo

    print(H.machine_line(args))
    flags = cpu_flags()
    print(f"# cpu flags: {' '.join(flags) or 'none of ' + ', '.join(BF16_FLAGS)}")
    work = Path(tempfile.mkdtemp(prefix="marlhf-roofline-"))
    policy, reward = build_models(work, args)
    data = dict(dataset="hh", data_file=str(H.HH_HELPFUL)) if H.HH_HELPFUL.is_file() else dict(dataset="hh")
    k = args.samples_per_prompt or 1
    group = {"samples_per_prompt": k} if args.samples_per_prompt else {}
    rule = {"termination": "fixed", "n": 1} if args.advantage == "gae" else {}
    config = H.ppo_config(
        work / "run", policy=policy, reward_model=reward, **data, max_records=200, advantage=args.advantage, **group, **rule,
        rollout_batch_size=args.batch // k, mini_batch_size=args.batch, max_new_tokens=args.new_tokens,
        max_prompt_length=args.prompt_tokens, actor_lr=0.0, critic_lr=0.0, dtype=args.dtype,
        eval_every=0, eval_prompts=0, save_every=0, seed=0, max_steps=args.steps + 1, zero_stage=args.zero_stage,
    )  # fmt: skip
    if args.prefill_per_copy:
        from marlhf_cli.generation import texts

        texts.run_length = lambda prompts: 1
    ctx, source = build_context(config)
    net = ctx.models.actor.module
    sizes = model_sizes(net)
    cfg = net.config
    tokens = args.batch * (args.prompt_tokens + args.new_tokens)
    run_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    peaks = {}
    # the best rate at any of the step's matmul shapes: whole sequences (scoring, update, the
    # prefill) and one token per row (decoding). Where bf16 is emulated (no avx512_bf16 or
    # AMX) its rate depends on the shape, and one shape alone was beaten by the phases
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        peaks[name] = max(matmul_rate(rows, cfg.hidden_size, width, dtype)
                          for rows in (tokens, args.batch) for width in (cfg.intermediate_size, cfg.vocab_size))
    bandwidth = copy_bandwidth()
    stream = weight_stream_rate(args.batch, cfg.hidden_size, cfg.intermediate_size, run_dtype)
    print(f"# model {policy} ({sizes['total'] / 1e6:.1f}M params x 4), {args.dtype}, batch {args.batch}, "
          f"prompts <= {args.prompt_tokens} tokens from {source}, {args.new_tokens} new tokens")  # fmt: skip
    print(f"# ceilings ({torch.get_num_threads()} thread(s)): matmul fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s; copy bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"[{args.batch}, h] x [h, i] streams weights at {stream / 1e9:.1f} GB/s")  # fmt: skip

    flops: dict[str, float] = {}
    with flops_per_phase(flops) as shapes:
        ppo.ppo_step(ctx, 0)
    rows = [ppo.ppo_step(ctx, 0) for _ in range(args.steps)]  # the same step: identical samples
    phase_seconds = {
        "generation": statistics.median(r["generation_time"] for r in rows),
        "scoring": statistics.median(r["scoring_time"] for r in rows),
        "update": statistics.median(r["training_time"] for r in rows),
    }
    seq_total = args.batch * (shapes["generation"][0][1] + shapes["generation"][1][1])
    padding = 1 - (shapes["generation"][2] + shapes["generation"][3]) / seq_total
    optimizer_params = sum(p.numel() for e in (ctx.models.actor, ctx.models.critic) if e is not None
                           for p in e.module.parameters() if p.requires_grad)  # fmt: skip
    # a bf16 step is never bound by less than fp32's ceiling: where bf16 is emulated, torch's
    # kernels (attention, small matmuls) compute it in fp32, and the phases beat the bf16 GEMM rate
    ceiling = max(peaks[args.dtype], peaks["fp32"])
    table = roofline(phase_seconds, flops, shapes["generation"], sizes, cfg, ceiling, bandwidth,
                     optimizer_params, padding)  # fmt: skip
    step = statistics.median(r["step_time"] for r in rows)
    print(f"{'phase':<11}{'s':>7}{'GFLOP':>8}{'GB':>7}{'GFLOP/s':>9}{'bound':>8}{'ideal s':>9}{'roofline':>9}{'padding':>8}")
    for r in table:
        pad = "-" if r["padding_share"] is None else f"{r['padding_share']:.0%}"
        print(f"{r['phase']:<11}{r['seconds']:>7.2f}{r['gflop']:>8.1f}{r['gbytes']:>7.2f}{r['gflops_per_s']:>9.1f}"
              f"{r['bound']:>8}{r['ideal_seconds']:>9.3f}{r['roofline_fraction']:>9.0%}{pad:>8}")  # fmt: skip
    ideal = sum(r["ideal_seconds"] for r in table)
    print(f"step {step:.2f} s (phases {sum(phase_seconds.values()):.2f} s); the three phases at their roofline: "
          f"{ideal:.2f} s, {ideal / step:.0%} of the step")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": H.machine_line(args), "cpu_flags": flags, "model": policy, "params": sizes["total"],
            "dtype": args.dtype, "batch": args.batch, "peaks_flops": peaks, "bandwidth": bandwidth,
            "weight_stream": stream, "step_seconds": step, "phases": table,
        }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
