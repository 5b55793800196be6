"""APPS program synthesis: codeparrot/apps -> problem records (no preference pairs).

Prompt: the format of the APPS paper (Hendrycks et al., 2021) used by CodeRL and PPOCoder,
without its leading newline::

    QUESTION:
    {question}

    {starter_code}                  (only when there is one)

    Use Call-Based format           (or: Use Standard Input format, when there is no fn_name)
    ANSWER:

The policy writes the program after ``ANSWER:\\n``. Record fields: ``prompt``, ``question``,
``starter_code``, ``inputs``, ``outputs`` (parallel lists: stdin/stdout strings, or argument
lists and return values for call-based problems), ``difficulty``, ``solutions`` (reference
programs, for SFT; may be empty), plus ``fn_name`` for call-based problems and
``problem_id`` / ``output_validator_flags`` when the source has them (the Code Jam file in
../shared/data carries float tolerances there).

Row shapes understood (one per file):

* ``hub``: codeparrot/apps -- ``input_output`` and ``solutions`` are JSON *strings*
  (``{"inputs": [...], "outputs": [...], "fn_name": "..."}``); the hub ships them empty for
  a few problems, which are dropped as "no tests".
* ``flat``: ``inputs``, ``outputs``, ``fn_name`` and ``solutions`` as real JSON values
  (../shared/data/apps/apps-sample.jsonl, the Code Jam problems). ``starter_code`` and
  ``solutions`` may be absent (empty); ``difficulty`` is required.

APPS is split SFT 20% / PPO 80% with no reward-model split (the reward is the tests).
"""

from __future__ import annotations

import json
from typing import Any

from .hub import HubSpec
from .records import (
    INVALID,
    MISSING,
    NO_TESTS,
    WRONG_TYPE,
    Dropped,
    Parsed,
    RowProblem,
    check_text,
    get_field,
    get_list,
    get_text,
    type_name,
)

NAME = "apps"
DESCRIPTION = "APPS program synthesis (codeparrot/apps)"
# codeparrot/apps ships a loading script (unsupported by datasets >= 4) beside its JSON Lines files
HUB = HubSpec(repo="codeparrot/apps", eval_split="test", data_files={"train": "train.jsonl", "test": "test.jsonl"})
SAMPLE = "apps.jsonl"
PASSED_THROUGH = ("problem_id", "output_validator_flags")


def format_prompt(question: str, starter_code: str = "", fn_name: str | None = None) -> str:
    """The APPS prompt (see module doc)."""
    parts = ["QUESTION:\n" + question.strip()]
    if starter_code.strip():
        parts.append(starter_code.rstrip())
    parts.append("Use Call-Based format" if fn_name else "Use Standard Input format")
    return "\n\n".join(parts) + "\nANSWER:\n"


def detect(row: dict) -> str | None:
    """The row shape (see module doc), or ``None`` when the row is not an APPS-like problem."""
    if "question" not in row:
        return None
    if "input_output" in row:
        return "hub"
    if {"inputs", "outputs"} <= row.keys():
        return "flat"
    return None


def parse(row: dict, variant: str) -> Parsed:
    """One source row -> record; raises RowProblem / Dropped."""
    question = get_text(row, "question")
    difficulty = get_text(row, "difficulty")
    starter = row.get("starter_code")
    starter = "" if starter is None else check_text(starter, "starter_code", allow_empty=True)
    if variant == "hub":
        tests = _json_field(row, "input_output", default=None)
        if tests is None:
            raise Dropped(NO_TESTS)
        if not isinstance(tests, dict):
            raise RowProblem(WRONG_TYPE, "input_output", f"expected a JSON object, got {type_name(tests)}")
        inputs, outputs, fn_name = tests.get("inputs"), tests.get("outputs"), tests.get("fn_name")
        solutions = _json_field(row, "solutions", default=[])
        label = "input_output"
    else:
        inputs, outputs, fn_name = get_list(row, "inputs"), get_list(row, "outputs"), row.get("fn_name")
        solutions = row.get("solutions") or []
        label = None
    record = {
        "prompt": "",
        "question": question,
        "starter_code": starter,
        "inputs": _tests(inputs, f"{label}.inputs" if label else "inputs"),
        "outputs": _tests(outputs, f"{label}.outputs" if label else "outputs"),
        "difficulty": difficulty,
        "solutions": _solutions(solutions),
    }
    if not record["inputs"] and not record["outputs"]:
        raise Dropped(NO_TESTS)
    if len(record["inputs"]) != len(record["outputs"]):
        counts = f"{len(record['inputs'])} inputs but {len(record['outputs'])} outputs"
        raise RowProblem(INVALID, label or "outputs", counts)
    if fn_name is not None:
        record["fn_name"] = check_text(fn_name, f"{label}.fn_name" if label else "fn_name")
    record["prompt"] = format_prompt(question, starter, record.get("fn_name"))
    for name in PASSED_THROUGH:
        if row.get(name) is not None:
            record[name] = row[name]
    return Parsed(record, question.strip())


def _json_field(row: dict, name: str, default: Any) -> Any:
    """A field holding JSON text (the hub's style); empty text means ``default``."""
    text = get_field(row, name)
    if not isinstance(text, str):
        raise RowProblem(WRONG_TYPE, name, f"expected a JSON string, got {type_name(text)}")
    if not text.strip():
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise RowProblem(INVALID, name, f"malformed JSON inside the string: {err.msg}") from None


def _tests(value: Any, label: str) -> list:
    if value is None:
        raise RowProblem(MISSING, label, "missing field")
    if not isinstance(value, list):
        raise RowProblem(WRONG_TYPE, label, f"expected a list, got {type_name(value)}")
    return value


def _solutions(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise RowProblem(WRONG_TYPE, "solutions", f"expected a list, got {type_name(value)}")
    for index, program in enumerate(value):
        check_text(program, f"solutions[{index}]")
    return list(value)
