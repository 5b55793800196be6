"""Which bf16 to train in, and can the bf16 sampling pass give PPO's old log-probs?

    python benchmarks/precision.py [--model smollm2-135m] [--batch 8] [--tokens 64] [--threads 1]

Two questions of issue 26, on one model, in one process (the machine line says which CPU):

1. Speed of the two ways to compute in bf16 with fp32 kept where it matters: torch.autocast
   over fp32 weights, against bf16 weights as DeepSpeed's bf16 mode holds them (its optimizer
   keeps fp32 master copies): a forward + backward over [batch, prompt + tokens] with the
   log-softmax in fp32, and KV-cached sampling of ``--tokens`` tokens. fp32 is the baseline.
2. How far the sampling pass's log-probs (KV cache, one token at a time) are from a full
   forward's over [prompt | response], which PPO's training forward is: in fp32 they agree to
   float rounding, so the rollout takes the old log-probs from sampling; in bf16 the question
   is whether an fp32 LM head (the logits' rounding) closes the gap, or autocast does.
   Reported over the real response tokens: mean and largest |difference| and the mean
   |ratio - 1| a first PPO update would see if the old log-probs came from sampling.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

PROMPTS = [
    "Human: How do I bake bread at home?\n\nAssistant:",
    "Human: What is the capital of France, and why is it the capital?\n\nAssistant:",
    "Human: Tell me a short story about a cat.\n\nAssistant:",
    "Human: Explain gravity simply.\n\nAssistant:",
]


class Fp32Head:
    """Swap a model's LM head for one computing in fp32 (outside autocast) from the same
    weights, and back: the logits then carry no bf16 rounding."""

    def __init__(self, model):
        import torch

        self.model, self.head = model, model.lm_head
        weight = self.head.weight

        class Head(torch.nn.Module):
            def forward(self, hidden):
                with torch.autocast(hidden.device.type, enabled=False):
                    return torch.nn.functional.linear(hidden.float(), weight.float())

        self.replacement = Head()

    def __enter__(self):
        self.model.lm_head = self.replacement

    def __exit__(self, *exc):
        self.model.lm_head = self.head


def autocast():
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)


def best_time(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    H.add_device_args(parser)
    args = parser.parse_args()
    H.apply_device_args(args)
    import torch

    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.train.forward import policy_forward
    from marlhf_cli.generation import SamplingParams, response_mask, sample

    print(H.machine_line(args))
    tokenizer = load_tokenizer(args.model, padding_side="left")
    prompts = (PROMPTS * args.batch)[: args.batch]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    fp32 = load_causal_lm(args.model).eval()
    bf16 = load_causal_lm(args.model, dtype="bf16").eval()
    params = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=args.tokens)
    eos = tokenizer.eos_token_id

    def sampled(model, context):
        torch.manual_seed(0)
        with context():
            return sample(model, encoded.input_ids, encoded.attention_mask, params, eos_token_id=-1,
                          pad_token_id=tokenizer.pad_token_id, with_logprobs=True)  # fmt: skip

    sequences = torch.cat([encoded.input_ids, sampled(fp32, contextlib.nullcontext)[0]], dim=1)
    mask = torch.cat([encoded.attention_mask, torch.ones_like(sequences[:, encoded.input_ids.shape[1] :])], dim=1)

    def forward_backward(model, context):
        model.zero_grad(set_to_none=True)
        with context():
            logp, _ = policy_forward(model, sequences, mask, encoded.input_ids.shape[1], 0.8)
        logp.float().sum().backward()

    print(f"# {args.model}, batch {args.batch}, prompts of {encoded.input_ids.shape[1]} tokens, {args.tokens} new tokens")
    print(f"{'precision':<34}{'fwd+bwd s':>10}{'sampling s':>11}")
    rows = (("fp32", fp32, contextlib.nullcontext), ("autocast bf16 (fp32 weights)", fp32, autocast),
            ("bf16 weights (DeepSpeed's bf16)", bf16, contextlib.nullcontext))  # fmt: skip
    for label, model, context in rows:
        train = best_time(lambda: forward_backward(model, context))
        sampling = best_time(lambda: sampled(model, context), repeats=2)
        print(f"{label:<34}{train:>10.2f}{sampling:>11.2f}", flush=True)
    for model in (fp32, bf16):
        model.zero_grad(set_to_none=True)

    print("\n# the sampling pass's log-probs against a full forward's, over the real response tokens")
    print(f"{'computation':<40}{'mean |diff|':>12}{'max |diff|':>11}{'mean |ratio-1|':>15}")
    cases = (("fp32", fp32, contextlib.nullcontext, False), ("bf16 weights", bf16, contextlib.nullcontext, False),
             ("bf16 weights, fp32 LM head", bf16, contextlib.nullcontext, True), ("autocast", fp32, autocast, False),
             ("autocast, fp32 LM head", fp32, autocast, True))  # fmt: skip
    for label, model, context, fp32_head in cases:
        with Fp32Head(model) if fp32_head else contextlib.nullcontext():
            ids, sampled_logp = sampled(model, context)
            real = response_mask(ids, eos)[0].bool()
            full = torch.cat([encoded.input_ids, ids], dim=1)
            attention = torch.cat([encoded.attention_mask, torch.ones_like(ids)], dim=1)
            with torch.no_grad(), context():
                forward_logp, _ = policy_forward(model, full, attention, encoded.input_ids.shape[1], 0.8)
        diff = (sampled_logp.float() - forward_logp.float())[real]
        ratio = (diff.exp() - 1).abs()
        print(f"{label:<40}{diff.abs().mean():>12.4f}{diff.abs().max():>11.4f}{ratio.mean():>15.4f}", flush=True)
    print(f"# {int(real.sum())} real tokens; load average at the end {H.load_average()}; "
          f"median token log-prob {statistics.median(forward_logp[real].tolist()):.2f}")


if __name__ == "__main__":
    main()
