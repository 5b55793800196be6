"""`marlhf segment` end to end: every rule, both formats, stats, and bad input."""

import json

import pytest
from typer.testing import CliRunner

from marlhf_cli.cli import app

RESPONSE = "I don't know (really). The cat sat on the mat.\nIt was a good day, wasn't it?"
CODE = "def queue_time(customers, n):\n    tills = [0] * n\n    for c in customers:\n        tills[tills.index(min(tills))] += c\n    return max(tills)\n"
RULES = ["fixed", "randomized", "ppl", "parsing", "code"]
# ppl uses the tiny random model: the rule only needs log-probs, and it keeps the test fast
COMMON = ["--tokenizer", "tiny", "--model", "tiny"]


def invoke(*args, input=None):
    return CliRunner().invoke(app, ["segment", *args, *COMMON], input=input)


@pytest.fixture
def texts(tmp_path):
    plain = tmp_path / "response.txt"
    plain.write_text(RESPONSE)
    code = tmp_path / "solution.py"
    code.write_text(CODE)
    jsonl = tmp_path / "samples.jsonl"
    jsonl.write_text(json.dumps({"response": RESPONSE}) + "\n\n" + json.dumps({"text": CODE}) + "\n")
    return {"plain": plain, "code": code, "jsonl": jsonl}


@pytest.mark.parametrize("rule", RULES)
def test_json_output_partitions_each_response(texts, tokenizer, rule):
    source = texts["code"] if rule == "code" else texts["plain"]
    result = invoke(str(source), "--rule", rule, "--format", "json")
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.strip().splitlines()
    out = json.loads(line)
    assert out["rule"] == rule and out["fallback"] is False
    text = source.read_text()
    assert "".join(seg["text"] for seg in out["segments"]) == text
    assert sum(seg["tokens"] for seg in out["segments"]) == len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert all(seg["tokens"] >= 1 for seg in out["segments"])
    if rule == "fixed":
        assert [seg["tokens"] for seg in out["segments"]][:-1] == [5] * (len(out["segments"]) - 1)
    if rule == "code":
        # statement boundaries: every line's code ends a segment (newline + indent join the
        # previous segment), and no segment spans two statements
        assert all(seg["text"].count("\n") <= 1 for seg in out["segments"])
        assert out["segments"][-1]["text"].rstrip().endswith("return max(tills)")


@pytest.mark.parametrize("rule", RULES)
def test_text_output_marks_every_segment_with_at_at(texts, rule):
    source = texts["code"] if rule == "code" else texts["plain"]
    as_json = json.loads(invoke(str(source), "--rule", rule, "--format", "json").stdout)
    result = invoke(str(source), "--rule", rule)
    assert result.exit_code == 0, result.output
    # '@@' follows each segment's last visible character; its trailing whitespace follows '@@'
    expected = "".join(seg["text"].rstrip() + "@@" + seg["text"][len(seg["text"].rstrip()):] for seg in as_json["segments"])
    assert result.stdout.rstrip("\n") == expected.rstrip("\n")
    assert result.stdout.count("@@") == len(as_json["segments"])


def test_paper_example_code_header_is_one_segment(texts):
    out = json.loads(invoke(str(texts["code"]), "--rule", "code", "--format", "json", "--cutoff", "12").stdout)
    assert out["segments"][0]["text"].rstrip() == "def queue_time(customers, n):"
    shown = invoke(str(texts["code"]), "--rule", "code", "--cutoff", "12").stdout
    assert shown.startswith("def queue_time(customers, n):@@\n")


def test_jsonl_stdin_and_several_rules(texts):
    result = invoke("-", "--rule", "fixed,code", "--format", "json", input=texts["jsonl"].read_text())
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["rule"] for r in rows] == ["fixed", "code", "fixed", "code"]
    # the prose response does not compile: the code rule falls back to fixed and says so
    assert rows[1]["fallback"] is True and rows[1]["segments"] == rows[0]["segments"]
    assert rows[3]["fallback"] is False


def test_fixed_n_inf_is_one_segment(texts):
    out = json.loads(invoke(str(texts["plain"]), "--n", "inf", "--format", "json").stdout)
    assert len(out["segments"]) == 1 and out["segments"][0]["text"] == RESPONSE


def test_stats_compare_rules(texts, tokenizer):
    result = invoke(str(texts["jsonl"]), "--rule", "all", "--stats", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {r["rule"]: r for r in map(json.loads, result.stdout.strip().splitlines())}
    assert set(rows) == set(RULES)
    total = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (RESPONSE, CODE))
    for row in rows.values():
        assert row["responses"] == 2 and row["tokens"] == total
        assert sum(row["histogram"].values()) == row["segments"]
        assert row["mean"] == pytest.approx(total / row["segments"])
    assert rows["code"]["fallbacks"] == 1  # the prose response
    # the bound: C per rule, the largest segment and the share longer than C
    assert [rows[r]["cutoff"] for r in RULES] == [5, 5, 5, 5, 10]
    assert rows["parsing"]["max_without_whitespace"] <= 5 and rows["parsing"]["over_cutoff"] == 0
    assert rows["parsing"]["fallbacks"] == 0
    assert rows["fixed"]["max"] == 5 and rows["fixed"]["over_cutoff"] == 0
    # --cutoff 2 on fixed 5: every full segment of 5 is longer than C
    result = invoke(str(texts["plain"]), "--rule", "fixed", "--cutoff", "2", "--stats", "--format", "json")
    fixed = json.loads(result.stdout)
    full = fixed["tokens"] // 5 + (fixed["tokens"] % 5 > 2)  # the last one counts when longer than 2
    assert fixed["cutoff"] == 2 and fixed["over_cutoff"] == pytest.approx(full / fixed["segments"])
    table = invoke(str(texts["jsonl"]), "--rule", "fixed,parsing", "--stats")
    assert table.exit_code == 0 and "segments per length" in table.stdout and "parsing" in table.stdout
    from marlhf_cli.macro.parsing import resolve_backend

    # which parser cut the text is said (stanza and spaCy cut differently)
    expected = "parsing: stanza's English constituency parser" if resolve_backend() == "stanza" else "parsing: spaCy en_core_web_sm"
    assert expected in table.stderr
    assert "largest*" in table.stdout and "> C*" in table.stdout


def test_lengths_without_whitespace_set_aside_blank_tokens_at_the_ends():
    from marlhf_cli.segment import lengths_without_whitespace

    text = "\n\nOne two.\n\nThree"
    offsets = [(0, 2), (2, 5), (5, 9), (9, 10), (10, 12), (12, 18), (18, 18)]  # EOS: empty span
    assert lengths_without_whitespace(text, offsets, [5, 2]) == [3, 1]
    assert lengths_without_whitespace(text, offsets, [1, 6]) == [0, 5]


def test_dry_run_prints_resolved_config(texts):
    result = CliRunner().invoke(app, ["segment", str(texts["plain"]), "--rule", "ppl", "--n", "3", "--dry-run"])
    assert result.exit_code == 0
    assert "rule: ppl" in result.stdout and "n: 3.0" in result.stdout


@pytest.mark.parametrize(
    "content, args, message",
    [
        (None, [], "file not found"),
        (b'{"response": "ok"}\n{"response": \n', [], ":2: malformed JSON"),
        (b'{"response": "ok"}\n{"other": 1}\n', [], ":2: field 'response': missing"),
        (b'{"response": 3}\n', [], ":1: field 'response': expected a string"),
        (b"caf\xe9 au lait", [], ":1: invalid UTF-8"),
        (b"hello", ["--rule", "sentences"], "--rule must be fixed, randomized"),
        (b"hello", ["--format", "xml"], "--format must be one of text, json"),
        (b"hello", ["--n", "many"], "config key 'n'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, content, args, message):
    path = tmp_path / "in.jsonl" if content and content.startswith(b"{") else tmp_path / "in.txt"
    if content is not None:
        path.write_bytes(content)
    result = invoke(str(path), *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("content", ["", "\n  \n", "\n\n"])
def test_empty_input_says_so(tmp_path, content):
    """Empty input is one line and exit code 2, whether piped or a (JSONL) file."""
    piped = invoke("-", input=content)
    assert piped.exit_code == 2 and piped.output.strip() == "error: <stdin>: empty input: no text to segment"
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    from_file = invoke(str(path))
    assert from_file.exit_code == 2 and from_file.output.strip() == f"error: {path}: empty input: no text to segment"


def test_text_output_reports_a_fallback_to_fixed(texts):
    """Text mode hid it (only --format json said 'fallback'); the segments on stdout are unchanged."""
    one = invoke(str(texts["plain"]), "--rule", "code")
    assert one.exit_code == 0, one.output
    assert one.stderr.strip() == "note: code: the response could not be parsed, so fixed (n=5) cut it"
    assert "note" not in one.stdout and one.stdout.count("@@") >= 1
    several = invoke(str(texts["jsonl"]), "--rule", "code")
    assert several.stderr.strip() == "note: code: 1 of 2 responses could not be parsed, so fixed (n=5) cut it (response 1)"
    clean = invoke(str(texts["code"]), "--rule", "code")
    assert clean.exit_code == 0 and clean.stderr == ""


def test_a_directory_is_not_a_missing_file(tmp_path):
    result = invoke(str(tmp_path))
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert result.output.strip() == f"error: {tmp_path}: is a folder: give a text or JSONL file, or - to read stdin"


def test_the_rules_that_need_no_model_run_without_torch(tmp_path):
    """fixed, randomized and code need a tokenizer only: the real command in a fresh process
    segments without importing torch (its import alone took ~2 s on a quiet CPU)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    source = tmp_path / "in.txt"
    source.write_text(RESPONSE)
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from marlhf_cli.cli import main\n"
        f"sys.argv = ['marlhf', 'segment', {str(source)!r}, '--rule', 'fixed,randomized,code', '--format', 'json']\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["rule"] for row in rows] == ["fixed", "randomized", "code"]
    assert all("".join(piece["text"] for piece in row["segments"]) == RESPONSE for row in rows)
    assert done.stderr.splitlines()[-1] == "torch loaded: False"


def test_the_shipped_tokenizer_loads_as_auto_tokenizer_loads_it():
    """The torch-free path (PreTrainedTokenizerFast on a generic tokenizer.json) gives the
    class, ids and offsets AutoTokenizer gives."""
    from transformers import AutoTokenizer

    from marlhf_cli import models

    light = models.load_tokenizer("tiny")
    auto = AutoTokenizer.from_pretrained(models.SHIPPED_TOKENIZER)
    assert type(light) is type(auto) and light.pad_token is not None
    for text in (RESPONSE, CODE, "<|im_start|>user\nhé, 日本語 ok?<|im_end|>", "  two  spaces\t\ttabs"):
        for special in (False, True):
            ours = light(text, add_special_tokens=special, return_offsets_mapping=True)
            theirs = auto(text, add_special_tokens=special, return_offsets_mapping=True)
            assert ours["input_ids"] == theirs["input_ids"] and ours["offset_mapping"] == theirs["offset_mapping"]
