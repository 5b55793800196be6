"""Records -> token ids, and token ids -> padded batches, for the SFT and reward stages.

Prompt and response are tokenized separately and concatenated, so the boundary between
them is exact in tokens (the response's labels start precisely at its first token) and a
response is the same token sequence whatever prompt precedes it. A prompt longer than
``max_prompt_length`` keeps its *end* (the instruction and the "TL;DR:" / "Assistant:" cue
sit there); a response longer than ``max_response_length`` keeps its beginning and gets no
EOS, because an EOS at a cut would teach the model to stop mid-sentence.
"""

from __future__ import annotations

from typing import Sequence

IGNORE = -100


def special_prefix(tokenizer) -> tuple[int, ...]:
    """Tokens the tokenizer puts before any text (a BOS for Llama-2-style tokenizers, else none)."""
    cached = getattr(tokenizer, "_marlhf_prefix", None)
    if cached is None:
        with_special = tokenizer("x", add_special_tokens=True)["input_ids"]
        without = tokenizer("x", add_special_tokens=False)["input_ids"]
        cut = len(with_special) - len(without)
        cached = tuple(with_special[:cut]) if cut > 0 and with_special[cut:] == without else ()
        tokenizer._marlhf_prefix = cached
    return cached


def encode_prompt(tokenizer, prompt: str, max_length: int) -> list[int]:
    """Prompt ids: special prefix + the last tokens of the prompt, ``max_length`` in all."""
    prefix = list(special_prefix(tokenizer))
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    room = max(0, max_length - len(prefix))
    return prefix + (ids[-room:] if room else [])


def encode_response(tokenizer, response: str, max_length: int) -> list[int]:
    """Response ids followed by EOS, or the first ``max_length`` ids with no EOS when cut."""
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    if len(ids) < max_length:
        return ids + [tokenizer.eos_token_id]
    return ids[:max_length]


def pad_right(rows: Sequence[Sequence[int]], value: int):
    """A LongTensor [len(rows), longest] with every row padded on the right by ``value``."""
    import torch

    longest = max(len(row) for row in rows)
    out = torch.full((len(rows), longest), value, dtype=torch.long)
    for index, row in enumerate(rows):
        out[index, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def attention_mask(rows: Sequence[Sequence[int]]):
    import torch

    longest = max(len(row) for row in rows)
    out = torch.zeros((len(rows), longest), dtype=torch.long)
    for index, row in enumerate(rows):
        out[index, : len(row)] = 1
    return out
