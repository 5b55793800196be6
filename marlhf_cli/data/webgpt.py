"""WebGPT comparisons: openai/webgpt_comparisons -> preference records.

Each hub row holds ``question{full_text}``, two answers ``answer_0``/``answer_1`` and their
scores ``score_0``/``score_1`` (in [-1, 1], summing to 0; the preferred answer scores
higher). Ties (equal scores) carry no preference and are dropped, as in the paper.
``question`` may also be a plain string in a local file.

Prompt (a plain QA format; the quotes the WebGPT browser collected are not shown, since the
paper's policy answers from the question alone)::

    Question: {question}
    Answer:

and the answers follow after one space, so ``prompt + chosen`` reads naturally.

The hub has only a train split; the evaluation split is held out of it (see ``splits``).
"""

from __future__ import annotations

from .hub import HubSpec
from .records import (
    TIED,
    WRONG_TYPE,
    Dropped,
    Parsed,
    RowProblem,
    get_field,
    get_number,
    get_text,
    preference,
    type_name,
)

NAME = "webgpt"
DESCRIPTION = "WebGPT long-form QA comparisons (openai/webgpt_comparisons)"
HUB = HubSpec(repo="openai/webgpt_comparisons")
SAMPLE = "webgpt.jsonl"


def format_prompt(question: str) -> str:
    """The QA prompt used for WebGPT."""
    return f"Question: {question.strip()}\nAnswer:"


def as_response(answer: str) -> str:
    """An answer as it follows the prompt: exactly one leading space."""
    return " " + answer.strip()


def detect(row: dict) -> str | None:
    """``"hub"`` for WebGPT comparison rows, else ``None``."""
    return "hub" if {"question", "answer_0", "answer_1", "score_0", "score_1"} <= row.keys() else None


def parse(row: dict, variant: str) -> Parsed:
    """One source row -> record; raises RowProblem / Dropped."""
    question = get_field(row, "question")
    if isinstance(question, dict):
        text = get_text(question, "full_text", parent="question")
    elif isinstance(question, str):
        text = get_text(row, "question")
    else:
        raise RowProblem(WRONG_TYPE, "question", f"expected an object or a string, got {type_name(question)}")
    answers = [get_text(row, "answer_0"), get_text(row, "answer_1")]
    scores = [get_number(row, "score_0"), get_number(row, "score_1")]
    if scores[0] == scores[1]:
        raise Dropped(TIED)
    best = 0 if scores[0] > scores[1] else 1
    record = preference(format_prompt(text), as_response(answers[best]), as_response(answers[1 - best]))
    return Parsed(record, text.strip())
