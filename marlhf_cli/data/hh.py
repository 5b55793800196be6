"""Anthropic HH-RLHF dialogue -> preference records.

The prompt is the dialogue transcript up to and including the final ``"\\n\\nAssistant:"``,
and ``chosen``/``rejected`` are the two final assistant turns (starting with a space), so
``prompt + chosen`` is the chosen transcript again.

Row shapes understood (one is picked per file from its first row):

* ``dahoas``: Dahoas/full-hh-rlhf on the hub -- ``prompt``, ``chosen``, ``rejected`` (and a
  ``response`` copy of ``chosen``, ignored).
* ``raw``: Anthropic's own files (../shared/data/hh-rlhf) -- ``chosen`` and ``rejected`` full
  transcripts starting with ``"\\n\\nHuman:"``. Each is split at its **last**
  ``"\\n\\nAssistant:"``. When the two prefixes differ (a handful of Anthropic's rows diverge
  earlier in the dialogue) the row is skipped as "prompt mismatch": taking either prefix
  would pair a response with a dialogue it never answered.
"""

from __future__ import annotations

from .hub import HubSpec
from .records import (
    EMPTY,
    MALFORMED_TRANSCRIPT,
    PROMPT_MISMATCH,
    Parsed,
    RowProblem,
    get_text,
    preference,
)

NAME = "hh"
DESCRIPTION = "Anthropic HH-RLHF dialogue (Dahoas/full-hh-rlhf, or Anthropic's raw transcripts)"
HUB = HubSpec(repo="Dahoas/full-hh-rlhf", eval_split="test")
SAMPLE = "hh.jsonl"

HUMAN = "\n\nHuman:"
ASSISTANT = "\n\nAssistant:"


def split_transcript(transcript: str) -> tuple[str, str]:
    """``(prompt, response)`` at the last ``"\\n\\nAssistant:"``; the prompt keeps the marker.

    Raises ValueError when the transcript has no assistant turn.
    """
    cut = transcript.rfind(ASSISTANT)
    if cut < 0:
        raise ValueError("no '\\n\\nAssistant:' turn")
    end = cut + len(ASSISTANT)
    return transcript[:end], transcript[end:]


def is_raw_transcript(text: object) -> bool:
    """Whether a value looks like one of Anthropic's raw HH transcripts."""
    return isinstance(text, str) and text.lstrip().startswith(HUMAN.strip("\n")) and ASSISTANT in text


def detect(row: dict) -> str | None:
    """The row shape (see module doc), or ``None`` when the row is not HH data."""
    if {"prompt", "chosen", "rejected"} <= row.keys():
        prompt = row["prompt"]
        if isinstance(prompt, str) and ASSISTANT.strip("\n") in prompt and HUMAN.strip("\n") in prompt:
            return "dahoas"
        return None
    if {"chosen", "rejected"} <= row.keys() and is_raw_transcript(row["chosen"]) and is_raw_transcript(row["rejected"]):
        return "raw"
    return None


def parse(row: dict, variant: str) -> Parsed:
    """One source row -> record; raises RowProblem."""
    if variant == "dahoas":
        prompt = get_text(row, "prompt")
        return Parsed(preference(prompt, get_text(row, "chosen"), get_text(row, "rejected")), prompt)
    prompt, chosen = _split_field(get_text(row, "chosen"), "chosen")
    other_prompt, rejected = _split_field(get_text(row, "rejected"), "rejected")
    if other_prompt != prompt:
        detail = "chosen and rejected transcripts differ before the last Assistant turn"
        raise RowProblem(PROMPT_MISMATCH, "rejected", detail)
    for name, text in (("chosen", chosen), ("rejected", rejected)):
        if not text.strip():
            raise RowProblem(EMPTY, name, "empty text (the last Assistant turn is empty)")
    return Parsed(preference(prompt, chosen, rejected), prompt)


def _split_field(transcript: str, name: str) -> tuple[str, str]:
    try:
        return split_transcript(transcript)
    except ValueError as err:
        raise RowProblem(MALFORMED_TRANSCRIPT, name, str(err)) from None
