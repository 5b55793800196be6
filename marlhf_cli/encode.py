"""Records -> token ids, and token ids -> padded batches, for the SFT and reward stages.

Prompt and response are tokenized separately and concatenated, so the boundary between
them is exact in tokens (the response's labels start precisely at its first token) and a
response is the same token sequence whatever prompt precedes it. A prompt longer than
``max_prompt_length`` keeps its *end* (the instruction and the "TL;DR:" / "Assistant:" cue
sit there); a response longer than ``max_response_length`` keeps its beginning and gets no
EOS, because an EOS at a cut would teach the model to stop mid-sentence. Under a chat
template (:mod:`marlhf_cli.chat`) the template's end-of-turn token takes the EOS's place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

IGNORE = -100


@dataclass
class Cuts:
    """What the length limits cut, counted while encoding (the data report's line and
    run.json's ``inputs.cut``): prompts that lost their start, responses their end."""

    prompts: int = 0
    prompts_seen: int = 0
    responses: int = 0
    responses_seen: int = 0

    def add_prompt(self, cut: bool) -> None:
        self.prompts += cut
        self.prompts_seen += 1

    def add_response(self, cut: bool) -> None:
        self.responses += cut
        self.responses_seen += 1

    def as_dict(self) -> dict[str, int]:
        return {"prompts": self.prompts, "of_prompts": self.prompts_seen, "responses": self.responses, "of_responses": self.responses_seen}

    def describe(self, max_prompt: int, max_response: int) -> str:
        """One line, or "" when nothing was cut."""
        parts = []
        if self.prompts:
            parts.append(f"{self.prompts:,} of {self.prompts_seen:,} prompts cut to --max-prompt-length {max_prompt} (their start dropped)")
        if self.responses:
            parts.append(f"{self.responses:,} of {self.responses_seen:,} responses cut to --max-response-length {max_response} (their end dropped, no end token)")
        return "; ".join(parts)


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


def encode_prompt(tokenizer, prompt: str, max_length: int, cuts: Cuts | None = None) -> list[int]:
    """Prompt ids: special prefix + the last tokens of the prompt, ``max_length`` in all."""
    prefix = list(special_prefix(tokenizer))
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    room = max(0, max_length - len(prefix))
    if cuts is not None:
        cuts.add_prompt(len(ids) > room)
    return prefix + (ids[-room:] if room else [])


def encode_response(tokenizer, response: str, max_length: int, end_id: int | None = None, cuts: Cuts | None = None) -> list[int]:
    """Response ids followed by ``end_id`` (EOS unless a chat template's end-of-turn token is
    given), or the first ``max_length`` ids with no end token when cut."""
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    if cuts is not None:
        cuts.add_response(len(ids) >= max_length)
    if len(ids) < max_length:
        return ids + [tokenizer.eos_token_id if end_id is None else end_id]
    return ids[:max_length]


def encode_prompt_labels(tokenizer, pieces: Sequence[tuple[str, bool]], max_length: int, cuts: Cuts | None = None) -> tuple[list[int], list[int]]:
    """Prompt ids as :func:`encode_prompt` gives them, and SFT labels: -100, except on pieces
    marked True (earlier assistant turns a chat template renders, see marlhf_cli.chat).

    One piece is :func:`encode_prompt` exactly; several are tokenized one by one (each
    boundary sits at a turn's start or after its end-of-turn token) and cut as one prompt.
    """
    if len(pieces) == 1:
        ids = encode_prompt(tokenizer, pieces[0][0], max_length, cuts)
        return ids, [IGNORE] * len(ids)
    ids, labels = [], []
    for text, trained in pieces:
        part = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += part
        labels += part if trained else [IGNORE] * len(part)
    prefix = list(special_prefix(tokenizer))
    room = max(0, max_length - len(prefix))
    if cuts is not None:
        cuts.add_prompt(len(ids) > room)
    keep = slice(-room, None) if room else slice(0, 0)  # the end, as encode_prompt keeps it
    return prefix + ids[keep], [IGNORE] * len(prefix) + labels[keep]


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
