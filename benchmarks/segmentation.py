"""Segmentation throughput per termination rule, and vectorised segment GAE vs a loop.

    python benchmarks/segmentation.py [--responses 300] [--repeats 5]

Responses are HH-RLHF assistant turns from ../shared/data when it is there, else the
embedded HH sample. Rules run through `segment_batch`, the path PPO takes; ppl is given
the reference log-probs (in PPO they come free with the experience). The last line is the
headline: how many times faster `macro_advantages` is than a per-sample reference loop at
B=64, T=512 (fixed n=5), both measured in this run.

The second table is the length distribution of each rule's segments (mean, p95, max, share
longer than the rule's C: 5, 10 for code), raw and with whitespace-only tokens at a segment's ends set aside (the
length the parsing rule's bound applies to). It reads only what `segment_batch` returns, so
the same script measures an older checkout (PYTHONPATH=that checkout) for a before/after.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

from marlhf_cli.macro import TerminationRule, macro_advantages, segment_batch
from marlhf_cli.macro.alignment import token_offsets
from marlhf_cli.models import load_tokenizer

SHARED_HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "helpful-base-sample.jsonl"


def load_responses(limit: int) -> tuple[list[str], str]:
    if SHARED_HH.is_file():
        rows = [json.loads(line) for line in SHARED_HH.read_text().splitlines()[:limit]]
        marker = "\n\nAssistant:"
        return [row["chosen"].rsplit(marker, 1)[1].strip() for row in rows], str(SHARED_HH)
    from marlhf_cli.data import load_records

    records = load_records("hh").records[:limit]
    return [r["chosen"].strip() for r in records], "embedded hh sample"


def load_programs(limit: int) -> list[str]:
    """Reference solutions of APPS problems (the code rule's natural input)."""
    from marlhf_cli.data import load_records

    apps = SHARED_HH.parents[1] / "apps" / "apps-sample.jsonl"
    records = load_records("apps", data_file=str(apps) if apps.is_file() else None).records
    programs = [solution for r in records for solution in r.get("solutions", [])]
    return programs[:limit]


def reference_loop(rewards, values, mask, segment_ids, gamma, lam):
    """One sample, one segment at a time, as a straightforward implementation would."""
    advantages = torch.zeros_like(rewards)
    returns = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        real = mask[b].nonzero().flatten().tolist()
        segments: list[list[int]] = []
        for t in real:
            if not segments or segment_ids[b, t] != segment_ids[b, segments[-1][-1]]:
                segments.append([])
            segments[-1].append(t)
        seg_values = [sum(values[b, t].item() for t in s) / len(s) for s in segments]
        seg_rewards = [sum(rewards[b, t].item() for t in s) for s in segments]
        running = 0.0
        for k in reversed(range(len(segments))):
            following = seg_values[k + 1] if k + 1 < len(segments) else 0.0
            running = seg_rewards[k] + gamma * following - seg_values[k] + gamma * lam * running
            for t in segments[k]:
                advantages[b, t] = running
                returns[b, t] = running + seg_values[k]
    return advantages, returns


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)

    tokenizer = load_tokenizer("tiny")
    texts, source = load_responses(args.responses)
    programs = load_programs(args.responses)
    print(f"# {len(texts)} HH responses ({source}) for every rule but code; {len(programs)} APPS solutions for code")
    print(f"# {platform.machine()}, {torch.get_num_threads()} torch threads")
    print(f"{'rule':<12}{'tokens':>8}{'tokens/s':>12}{'mean len':>10}{'fallbacks':>11}")
    distributions = []
    for name in ("fixed", "randomized", "ppl", "parsing", "code"):
        inputs = programs if name == "code" else texts
        rule = TerminationRule(name, n=5)
        tokens, seconds, stats, lengths = time_rule(rule, tokenizer, inputs, args.repeats)
        print(f"{name:<12}{tokens:>8}{tokens / seconds:>12,.0f}{stats.mean_length:>10.2f}{stats.fallbacks:>11}")
        distributions.append((name, rule.cutoff, lengths))
    print_distributions(distributions)
    advantage_speedup(args.repeats)


def time_rule(rule, tokenizer, texts, repeats):
    """Tokens, best wall time of segment_batch over the texts, and its stats."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    decoded = [token_offsets(tokenizer, i) for i in ids]
    lengths = [len(i) for i in ids]
    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    ref_logprobs = [(-torch.rand(n) * 4).tolist() for n in lengths]
    kwargs = dict(texts=[d[0] for d in decoded], offsets=[d[1] for d in decoded], ref_logprobs=ref_logprobs)
    ids, stats = segment_batch(rule, mask, **kwargs)  # also loads a parser before the clock starts
    seconds = best_of(repeats if rule.name != "parsing" else 1, lambda: segment_batch(rule, mask, **kwargs))
    segments = []  # (raw length, length without the whitespace at its ends) of every segment
    for row, n, (text, offsets) in zip(ids, lengths, decoded):
        per_segment = torch.bincount(row[:n]).tolist()
        blank = [not text[a:b].strip() for a, b in offsets]
        first = 0
        for size in per_segment:
            inside = [i for i in range(first, first + size) if not blank[i]]
            segments.append((size, inside[-1] - inside[0] + 1 if inside else 0))
            first += size
    return sum(lengths), seconds, stats, segments


def print_distributions(distributions) -> None:
    """Per rule: mean, p95 and max segment length, the share of segments longer than C and the
    share of tokens in them; raw, then (*) whitespace at a segment's ends aside."""
    print("# segment lengths; * = whitespace-only tokens at a segment's ends aside")
    print(f"{'rule':<12}{'segments':>9}{'mean':>7}{'p95':>5}{'max':>5}{'C':>4}{'> C':>8}{'tok > C':>9}"
          f"{'max*':>6}{'> C*':>8}")
    for name, cutoff, segments in distributions:
        raw = sorted(size for size, _ in segments)
        text = [core for _, core in segments]
        over = [size for size, _ in segments if size > cutoff]
        p95 = raw[max(0, math.ceil(0.95 * len(raw)) - 1)]
        print(f"{name:<12}{len(raw):>9}{sum(raw) / len(raw):>7.2f}{p95:>5}{raw[-1]:>5}{cutoff:>4}"
              f"{len(over) / len(raw):>8.1%}{sum(over) / sum(raw):>9.1%}"
              f"{max(text):>6}{sum(1 for n in text if n > cutoff) / len(text):>8.1%}")


def advantage_speedup(repeats: int) -> None:
    batch, length = 64, 512
    real_lengths = torch.randint(length // 4, length + 1, (batch,))
    adv_mask = (torch.arange(length)[None] < real_lengths[:, None]).long()
    segment_ids = (torch.arange(length)[None].expand(batch, length) // 5).contiguous()
    rewards, values = torch.randn(batch, length), torch.randn(batch, length)
    vectorised = best_of(repeats, lambda: macro_advantages(rewards, values, adv_mask, segment_ids, 1.0, 0.95))
    looped = best_of(1, lambda: reference_loop(rewards, values, adv_mask, segment_ids, 1.0, 0.95))
    fast, slow = macro_advantages(rewards, values, adv_mask, segment_ids, 1.0, 0.95), reference_loop(
        rewards, values, adv_mask, segment_ids, 1.0, 0.95
    )
    assert torch.allclose(fast[0], slow[0], atol=1e-4), "vectorised and loop disagree"
    print(f"macro_advantages B={batch} T={length}: vectorised {vectorised * 1e3:.2f} ms, "
          f"per-sample loop {looped * 1e3:.0f} ms")
    print(f"speed-up of macro_advantages over the per-sample loop: {looped / vectorised:.0f}x")


if __name__ == "__main__":
    main()
