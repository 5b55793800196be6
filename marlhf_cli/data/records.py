"""The one record schema every adapter produces, and the checks that guard it.

Adapters turn a source row (a hub row, a JSON line) into a plain ``dict`` record:

* preference records (``tldr``, ``hh``, ``webgpt``, TRL preference files):
  ``prompt``, ``chosen``, ``rejected`` -- text, the responses *without* the prompt, so that
  ``prompt + chosen`` is the full sequence a reward model scores. This is TRL's "standard"
  preference format, so a record can go straight into TRL's trainers too.
* demonstration records (TRL ``messages`` / ``prompt``+``completion`` files, the TL;DR
  posts-with-reference file): ``prompt`` and ``chosen`` (the target response), no
  ``rejected``; such data can feed SFT and PPO prompts but not a reward model.
* problem records (``apps``): ``prompt`` (the formatted APPS prompt), ``question``,
  ``starter_code``, ``inputs``, ``outputs``, ``difficulty``, ``solutions`` (reference
  programs, possibly empty), plus ``fn_name`` for call-based problems and ``problem_id`` /
  ``output_validator_flags`` when the source has them.
* prompt records (TRL ``prompt``-only files): ``prompt`` alone, for PPO and best-of-N.
* text records (TRL's language-modelling ``text`` files): ``text`` alone, for SFT only
  (the loss covers every token).

A record from a TRL file may also hold ``columns``: the row's other fields as the user wrote
them (a reference answer, an id), which reward functions receive (``--reward py:...``).

A row that cannot become a record raises :class:`RowProblem` (bad content, counted and
reported, an error under ``strict``) or :class:`Dropped` (excluded on purpose by the
paper's recipe, such as WebGPT ties: counted, never an error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

PREFERENCE_FIELDS = ("prompt", "chosen", "rejected")
DEMONSTRATION_FIELDS = ("prompt", "chosen")
PROBLEM_FIELDS = ("prompt", "question", "starter_code", "inputs", "outputs", "difficulty", "solutions")

# Why a row was skipped. Row-level content problems: skipped and counted, or an error in strict mode.
MISSING = "missing field"
WRONG_TYPE = "wrong type"
EMPTY = "empty text"
IDENTICAL = "chosen identical to rejected"
INVALID = "invalid value"
PROMPT_MISMATCH = "prompt mismatch"
MALFORMED_TRANSCRIPT = "malformed transcript"
NOT_AN_OBJECT = "not a JSON object"

# Why a row was dropped on purpose (the paper's recipe), never an error.
TIED = "tied scores"
NOT_REDDIT = "not a Reddit post"
NO_TESTS = "no tests"


class RowProblem(Exception):
    """A row whose content is unusable: skipped and counted, or raised under ``strict``."""

    def __init__(self, reason: str, field: str | None, detail: str | None = None):
        self.reason = reason
        self.field = field
        self.detail = detail or reason
        super().__init__(self.detail)


class Dropped(Exception):
    """A well-formed row the recipe excludes on purpose (a tie, a non-Reddit article)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", int: "an integer", float: "a number"}


def type_name(value: Any) -> str:
    """The JSON name of a value's type, for messages such as 'expected a string, got a list'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in _TYPE_NAMES.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__


def get_field(row: dict, name: str, *, parent: str | None = None) -> Any:
    """``row[name]``, or a :class:`RowProblem` naming the (dotted) field when it is absent."""
    label = f"{parent}.{name}" if parent else name
    if not isinstance(row, dict):
        raise RowProblem(WRONG_TYPE, parent, f"expected an object, got {type_name(row)}")
    if name not in row or row[name] is None:
        raise RowProblem(MISSING, label, "missing field" if name not in row else "field is null")
    return row[name]


def get_text(row: dict, name: str, *, parent: str | None = None, allow_empty: bool = False) -> str:
    """A string field that must be present and, unless ``allow_empty``, not blank."""
    label = f"{parent}.{name}" if parent else name
    value = get_field(row, name, parent=parent)
    return check_text(value, label, allow_empty=allow_empty)


def check_text(value: Any, label: str, *, allow_empty: bool = False) -> str:
    """``value`` if it is a string with some non-blank text, else a :class:`RowProblem`."""
    if not isinstance(value, str):
        raise RowProblem(WRONG_TYPE, label, f"expected a string, got {type_name(value)}")
    if not allow_empty and not value.strip():
        raise RowProblem(EMPTY, label, "empty text")
    return value


def get_number(row: dict, name: str) -> float:
    """A finite int or float field (booleans are not numbers here)."""
    value = get_field(row, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RowProblem(WRONG_TYPE, name, f"expected a number, got {type_name(value)}")
    if not math.isfinite(value):
        raise RowProblem(INVALID, name, f"expected a finite number, got {value}")
    return float(value)


def get_list(row: dict, name: str) -> list:
    """A list field."""
    value = get_field(row, name)
    if not isinstance(value, list):
        raise RowProblem(WRONG_TYPE, name, f"expected a list, got {type_name(value)}")
    return value


def preference(prompt: str, chosen: str, rejected: str, *, allow_empty_prompt: bool = False) -> dict:
    """A preference record, refusing a pair whose two responses say the same thing.

    ``allow_empty_prompt`` is for TRL's implicit-prompt rows, whose shared prefix may be empty.
    """
    check_text(prompt, "prompt", allow_empty=allow_empty_prompt)
    check_text(chosen, "chosen")
    check_text(rejected, "rejected")
    if chosen.strip() == rejected.strip():
        raise RowProblem(IDENTICAL, "rejected", "chosen and rejected are identical")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


# what each kind of record is, in the words of an error message
KIND_NAMES = {
    "preference": "preference pairs (prompt/chosen/rejected)",
    "demonstration": "demonstrations (prompt and a target response)",
    "problem": "program-synthesis problems (prompt and tests)",
    "prompt": "prompts alone (TRL's prompt-only rows)",
    "text": "plain text rows (TRL's language-modelling format, {\"text\": ...})",
}


# the kinds that hold prompts, what ppo and bon sample from (text rows have none)
PROMPT_KINDS = ("preference", "demonstration", "problem", "prompt")


def record_kind(record: dict) -> str:
    """'preference', 'demonstration', 'problem', 'prompt' or 'text': which stages a record can feed."""
    if "inputs" in record:
        return "problem"
    if "rejected" in record:
        return "preference"
    if "chosen" in record:
        return "demonstration"
    if "prompt" in record:
        return "prompt"
    return "text"


@dataclass(frozen=True)
class Parsed:
    """A record and the key that keeps related rows in the same split (TL;DR: the post)."""

    record: dict
    group: str


def one_per_prompt(records: Iterable[dict]) -> list[dict]:
    """The first record of each distinct prompt, in order: evaluations sample per prompt,
    and a source may hold several records of one prompt (TL;DR: several pairs per post)."""
    seen: set[str] = set()
    return [r for r in records if not (r["prompt"] in seen or seen.add(r["prompt"]))]
