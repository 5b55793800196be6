"""Prompts as text in, responses as ids, masks and text out: what ppo's rollouts and
evaluations, bon and passk all sample through.

Prompts are encoded exactly as ``marlhf sft`` encodes them (:func:`marlhf_cli.encode.encode_prompt`:
a long prompt keeps its *end*, where "TL;DR:" or the assistant cue sits), left-padded, and a
response ends at EOS or at any of ``stop_token_ids`` (a chat template's end of turn).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..encode import encode_prompt
from .draw import SamplingParams, response_mask
from .eager import sample


def tokenize_prompts(tokenizer, prompts: Sequence[str], max_length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, each prompt cut to its last ``max_length`` tokens."""
    rows = [encode_prompt(tokenizer, prompt, max_length) for prompt in prompts]
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for index, row in enumerate(rows):
        if row:
            ids[index, longest - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[index, longest - len(row) :] = 1
    return ids.to(device), mask.to(device)


def decode_responses(tokenizer, response_ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [
        tokenizer.decode(row[: int(n)].tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        for row, n in zip(response_ids.cpu(), mask.sum(dim=1).cpu())
    ]


def generate(
    model, tokenizer, prompts: Sequence[str], sampling: SamplingParams, *, max_prompt_length: int,
    stop_token_ids: Sequence[int] = (), device, with_logprobs: bool = False,
):  # fmt: skip
    """Sample one response per prompt: (prompt ids, prompt mask, response ids, response mask,
    has_eos, the drawn tokens' log-probs or None without ``with_logprobs``).

    Prompts that come in equal runs (rloo/grpo/mc's K responses per prompt, bon's samples)
    are read once per run: the sampler copies a prompt's KV cache to its K rows (``repeats``)
    instead of running the same prefill K times; the draws are the same."""
    repeats = run_length(prompts)
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts[::repeats], max_prompt_length, device)
    stop = (tokenizer.eos_token_id, *stop_token_ids)
    sampled = sample(
        model, prompt_ids, prompt_mask, sampling,
        eos_token_id=stop, pad_token_id=tokenizer.pad_token_id, with_logprobs=with_logprobs, repeats=repeats,
    )  # fmt: skip
    if repeats > 1:
        prompt_ids, prompt_mask = prompt_ids.repeat_interleave(repeats, dim=0), prompt_mask.repeat_interleave(repeats, dim=0)
    response_ids, logprobs = sampled if with_logprobs else (sampled, None)
    mask, has_eos = response_mask(response_ids, stop)
    return prompt_ids, prompt_mask, response_ids, mask, has_eos, logprobs


def run_length(prompts: Sequence[str]) -> int:
    """r when ``prompts`` is runs of r equal prompts (r >= 1, each run's prompt may repeat in
    the next run), else 1."""
    run = next((i for i, prompt in enumerate(prompts) if prompt != prompts[0]), len(prompts))
    if run < 2 or len(prompts) % run:
        return 1
    starts = range(0, len(prompts), run)
    return run if all(prompts[j] == prompts[start] for start in starts for j in range(start, start + run)) else 1
