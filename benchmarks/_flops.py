"""Model FLOPs of a PPO step, and the bf16 dense peak of the GPU it ran on.

Not a benchmark itself (the leading underscore). ``step_cost.py`` and ``vs_trl.py`` divide
:func:`ppo_step_flops` by the measured step time to report achieved TFLOP/s, and that by
:func:`bf16_peak` to report the share of the GPU's peak.

The count is of the work PPO needs, the same for every tool, so a ratio of TFLOP/s is a ratio
of speed: per step, one forward of the policy over [prompt | response] for sampling (a
KV-cached sampler does the work of one forward over the sequence), the reference, reward
and value forwards, and per PPO epoch a forward and backward (3 forwards) of the policy and of
the value model. Matrix multiplications only (norms, activations, softmax left out), 2 FLOPs
per multiply-add; attention scores counted causally (token t attends to t tokens); the
policy's vocabulary-wide head counted on the response tokens only (the log-probs PPO needs),
the value and reward models' scalar heads left out. Extra work a tool chooses to do (marlhf's bf16 forward for
the old log-probs, recomputation) is not counted: it lowers the achieved figure.
"""

from __future__ import annotations

import os

# (part of torch.cuda.get_device_name(), dense bf16 tensor TFLOP/s without sparsity, source);
# the first match wins, so longer names come before their prefixes
PEAK_BF16_DENSE = [
    ("H100 PCIe", 756.0, "NVIDIA H100 datasheet, PCIe: 1513 with sparsity"),
    ("H100 NVL", 835.0, "NVIDIA H100 datasheet, NVL: 1671 with sparsity"),
    ("H100", 989.4, "NVIDIA H100 datasheet, SXM5: 1979 with sparsity"),
    ("GH200", 989.4, "NVIDIA GH200 datasheet: 1979 with sparsity"),
    ("H200 NVL", 835.0, "NVIDIA H200 datasheet, NVL: 1671 with sparsity"),
    ("H200", 989.4, "NVIDIA H200 datasheet, SXM: 1979 with sparsity"),
    ("A100", 312.0, "NVIDIA A100 datasheet: 624 with sparsity"),
    ("A10", 125.0, "NVIDIA A10 datasheet: 250 with sparsity"),
    ("L40S", 362.05, "NVIDIA L40S datasheet: 733 with sparsity"),
    ("L40", 181.05, "NVIDIA L40 datasheet: 362.1 with sparsity"),
    ("L4", 121.0, "NVIDIA L4 datasheet: 242 with sparsity"),
    ("RTX 4090", 165.2, "NVIDIA Ada whitepaper, fp32 accumulate: 330.4 with sparsity"),
]  # fmt: skip
PEAK_ENV = "MARLHF_PEAK_TFLOPS"  # a user's own figure for a GPU not listed


def bf16_peak(device_name: str) -> tuple[float | None, str]:
    """(dense bf16 TFLOP/s, where the figure comes from) of a GPU by name; (None, why) if unknown."""
    if os.environ.get(PEAK_ENV):
        return float(os.environ[PEAK_ENV]), f"${PEAK_ENV}"
    for part, tflops, source in PEAK_BF16_DENSE:
        if part in device_name:
            return tflops, source
    return None, f"no bf16 peak known for '{device_name}' (set ${PEAK_ENV})"


def sequence_forward_flops(config, tokens: float, *, head_tokens: float = 0.0) -> float:
    """FLOPs of one forward of a Llama-like ``config`` over one sequence of ``tokens`` tokens,
    with the vocabulary head applied to ``head_tokens`` of them."""
    h, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    projections = layers * (2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * ffn)  # q, o; k, v; MLP
    # causal attention: token t scores and mixes t earlier-or-same tokens, QK^T and AV
    attention = layers * 2 * heads * head_dim * tokens * (tokens + 1) / 2
    return 2 * (projections * tokens + attention + h * config.vocab_size * head_tokens)


def ppo_step_flops(config, *, responses: int, prompt_tokens: float, response_tokens: float,
                   epochs: int = 1, critic: bool = True) -> float:  # fmt: skip
    """Model FLOPs of one PPO step of ``responses`` sequences (policy, reference, value and
    reward models all of ``config``'s shape; ``critic=False`` for RLOO/GRPO)."""
    tokens = prompt_tokens + response_tokens
    policy = responses * sequence_forward_flops(config, tokens, head_tokens=response_tokens)
    scalar = responses * sequence_forward_flops(config, tokens)
    trained_scalar = scalar if critic else 0.0
    sampling, scoring = policy, policy + scalar + trained_scalar  # reference, reward, values
    update = epochs * 3 * (policy + trained_scalar)
    return sampling + scoring + update


def gpu_figures(flops: float, step_seconds: float, device_name: str) -> dict:
    """Achieved TFLOP/s of a step and its share of the device's bf16 peak (None when unknown)."""
    achieved = flops / step_seconds / 1e12 if step_seconds > 0 else float("nan")
    peak, source = bf16_peak(device_name)
    return {"tflops": achieved, "peak_tflops": peak, "peak_source": source,
            "share_of_peak": achieved / peak if peak else None}  # fmt: skip
