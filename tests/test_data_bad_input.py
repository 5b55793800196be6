"""Bad input gives one line naming file, line and field (exit code 2); bad rows are counted.

File-level problems (missing file, invalid UTF-8, malformed JSON) always raise. Row-level
content problems are skipped and counted in the report, or raise under ``strict=True``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marlhf_cli.data import load_records
from marlhf_cli.errors import UserError

GOOD = {"prompt": "Q?", "chosen": " yes", "rejected": " no"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_lines(path: Path, lines: list) -> str:
    path.write_bytes(b"".join((ln if isinstance(ln, bytes) else json.dumps(ln).encode()) + b"\n" for ln in lines))
    return str(path)


def user_error(path: str, **kw) -> str:
    with pytest.raises(UserError) as caught:
        load_records(path, **kw)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    return message


ROW_PROBLEMS = [
    # (bad row, reason counted, field named, words in the message)
    ({"prompt": "Q?", "chosen": " yes"}, "missing field", "rejected", "missing field"),
    ({"prompt": "Q?", "chosen": 5, "rejected": " no"}, "wrong type", "chosen", "expected a string, got an integer"),
    ({"prompt": "Q?", "chosen": "   ", "rejected": " no"}, "empty text", "chosen", "empty text"),
    ({"prompt": "Q?", "chosen": " same", "rejected": "same "}, "chosen identical to rejected", "rejected", "identical"),
]


@pytest.mark.parametrize("bad, reason, field, words", ROW_PROBLEMS, ids=[p[1] for p in ROW_PROBLEMS])
def test_row_problem_is_counted_leniently(tmp_path, bad, reason, field, words):
    path = write_lines(tmp_path / "rows.jsonl", [GOOD, bad, GOOD, bad])
    result = load_records(path)
    assert len(result.records) == 2
    assert result.report.skipped == {reason: 2}
    assert result.report.rows == 4 and result.report.kept == 2
    assert len(result.report.examples[reason]) == 2
    first = result.report.examples[reason][0]
    assert first.startswith(f"{path}:2: field '{field}': ") and words in first
    assert result.report.examples[reason][1].startswith(f"{path}:4: ")
    assert f"skipped 2 bad (2 {reason}" in result.report.summary()


@pytest.mark.parametrize("bad, reason, field, words", ROW_PROBLEMS, ids=[p[1] for p in ROW_PROBLEMS])
def test_row_problem_is_an_error_in_strict_mode(tmp_path, bad, reason, field, words):
    path = write_lines(tmp_path / "rows.jsonl", [GOOD, bad])
    message = user_error(path, strict=True)
    assert message.startswith(f"{path}:2: field '{field}': ") and words in message


def test_nested_hub_field_is_named_with_its_path(tmp_path):
    row = {"info": {"title": "t", "subreddit": "s"}, "summaries": [{"text": " a"}, {"text": " b"}], "choice": 0}
    path = write_lines(tmp_path / "tldr.jsonl", [row])
    assert user_error(path, strict=True).startswith(f"{path}:1: field 'info.post': missing field")


def test_malformed_json_line_always_raises(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [GOOD, GOOD, b'{"prompt": "Q?", "chosen": " yes",'])
    for strict in (False, True):
        message = user_error(path, strict=strict)
        assert message.startswith(f"{path}:3: malformed JSON")


def test_invalid_utf8_names_line_and_field(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [GOOD, b'{"prompt": "Q?", "chosen": " caf\xe9", "rejected": " no"}'])
    message = user_error(path)
    assert message.startswith(f"{path}:2: field 'chosen': invalid UTF-8 (byte 0xe9")


def test_missing_file(tmp_path):
    path = str(tmp_path / "absent.jsonl")
    assert user_error(path) == f"{path}: file not found"
    assert user_error("hh", data_file=path) == f"{path}: file not found"


def test_malformed_json_file_names_the_line(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"prompt": "Q?", "chosen": " a", "rejected": " b"},\n  {"prompt": }\n]\n', encoding="utf-8")
    assert user_error(str(path)).startswith(f"{path}:3: malformed JSON")


def test_rows_that_are_not_objects_are_counted(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [GOOD, ["not", "an", "object"]])
    result = load_records(path)
    assert result.report.skipped == {"not a JSON object": 1}
    assert user_error(path, strict=True).startswith(f"{path}:2: expected a JSON object, got a list")


def test_a_file_with_no_usable_rows_is_an_error(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [{"prompt": "Q?", "chosen": "", "rejected": " no"}])
    message = user_error(path)
    assert message.startswith(f"{path}: no usable rows") and "1 empty text" in message


def test_unrecognised_format_names_the_fields(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [{"question": "q", "answer": "a"}])
    message = user_error(path)
    assert message.startswith(f"{path}:1: cannot tell the format") and "answer, question" in message


def test_forced_adapter_rejects_other_formats(tmp_path):
    row = {"post": "p", "title": "t", "subreddit": "s", "chosen": " a", "rejected": " b"}
    path = write_lines(tmp_path / "rows.jsonl", [row])
    message = user_error("webgpt", data_file=path)
    assert message.startswith(f"{path}:1: does not look like webgpt data")


def test_unsupported_suffix(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("prompt,chosen,rejected\n", encoding="utf-8")
    assert "unsupported file type '.csv'" in user_error("auto", data_file=path)


def test_hh_prompt_mismatch_and_missing_assistant_turn(tmp_path):
    base = "\n\nHuman: Hi\n\nAssistant:"
    rows = [
        {"chosen": base + " Hello.", "rejected": base + " Hey."},
        {"chosen": base + " Hello.", "rejected": "\n\nHuman: Other\n\nAssistant: Hey."},
        {"chosen": base + " Hello.", "rejected": "\n\nHuman: no assistant here"},
        {"chosen": base + " ", "rejected": base + " Hey."},
    ]
    path = write_lines(tmp_path / "hh.jsonl", rows)
    result = load_records("hh", data_file=path)
    assert len(result.records) == 1
    assert result.report.skipped == {"prompt mismatch": 1, "malformed transcript": 1, "empty text": 1}
    assert user_error("hh", data_file=path, strict=True).startswith(f"{path}:2: field 'rejected': ")


def test_webgpt_wrong_score_type(tmp_path):
    row = {"question": {"full_text": "Why?"}, "answer_0": "a", "answer_1": "b", "score_0": "high", "score_1": -1.0}
    path = write_lines(tmp_path / "w.jsonl", [row])
    assert user_error("webgpt", data_file=path, strict=True).startswith(
        f"{path}:1: field 'score_0': expected a number, got a string"
    )


def test_apps_mismatched_tests_and_missing_difficulty(tmp_path):
    rows = [
        {"question": "Add.", "inputs": ["1 2\n"], "outputs": [], "difficulty": "introductory"},
        {"question": "Add.", "inputs": ["1 2\n"], "outputs": ["3\n"]},
        {"question": "Add.", "inputs": ["1 2\n"], "outputs": ["3\n"], "difficulty": "introductory"},
    ]
    path = write_lines(tmp_path / "apps.jsonl", rows)
    result = load_records(path)
    assert len(result.records) == 1
    assert result.report.skipped == {"invalid value": 1, "missing field": 1}
    assert result.report.examples["missing field"][0].startswith(f"{path}:2: field 'difficulty'")
