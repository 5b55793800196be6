"""TRL's prompt-only and plain-text ({"text": ...}) files: how they load, what each stage
makes of them (sft trains on every token of a text; rm, ppo and bon say in one line what
they need), and the extra columns that travel with a record to reward functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.data import load_records
from marlhf_cli.errors import UserError
from marlhf_cli.train import sft
from marlhf_cli.encode import IGNORE

TEXTS = [f"Line {i}: the quick brown fox jumps over {i} lazy dogs." for i in range(30)]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def text_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "text.jsonl", [{"text": t} for t in TEXTS])


# ---------------------------------------------------------------------------------------
# loading


def test_text_rows_become_text_records(text_file):
    result = load_records(str(text_file))
    assert (result.dataset, result.variant, result.kind) == ("trl", "text", "text")
    assert sorted(r["text"] for r in result.records) == sorted(TEXTS)
    assert all(set(r) == {"text"} for r in result.records)


def test_prompt_only_rows_keep_their_other_columns(tmp_path):
    rows = [{"prompt": "What is 2+2?", "answer": "4", "id": 7}, {"prompt": [{"role": "user", "content": "Hi"}], "answer": "hello"}]
    result = load_records(str(write_jsonl(tmp_path / "p.jsonl", rows)))
    assert (result.variant, result.kind) == ("prompt-only", "prompt")
    assert result.records == [
        {"prompt": "What is 2+2?", "columns": {"answer": "4", "id": 7}},
        # a conversation keeps its turns too, for the chat template (marlhf_cli.chat)
        {"prompt": "\n\nHuman: Hi\n\nAssistant:", "conversation": {"prompt": [{"role": "user", "content": "Hi"}]},
         "columns": {"answer": "hello"}},
    ]


def test_other_shapes_keep_their_extra_columns_too(tmp_path):
    rows = [{"prompt": "Q?", "chosen": " yes", "rejected": " no", "source": "web"}]
    assert load_records(str(write_jsonl(tmp_path / "s.jsonl", rows))).records == [
        {"prompt": "Q?", "chosen": " yes", "rejected": " no", "columns": {"source": "web"}}
    ]
    rows = [{"prompt": "Q?", "completion": " A.", "answer": "A"}]
    record = load_records(str(write_jsonl(tmp_path / "pc.jsonl", rows))).records[0]
    assert record == {"prompt": "Q?", "chosen": " A.", "columns": {"answer": "A"}}


def test_empty_text_is_a_bad_row_counted_or_strict(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "fine"}, {"text": "  "}, {"text": 3}])
    result = load_records(str(path))
    assert [r["text"] for r in result.records] == ["fine"] and result.report.total_skipped == 2
    with pytest.raises(UserError, match=r"t.jsonl:2: field 'text': empty text"):
        load_records(str(path), strict=True)


def test_require_names_what_the_file_holds_and_what_the_stage_needs(text_file):
    result = load_records(str(text_file))
    with pytest.raises(UserError) as caught:
        result.require("rm", ("preference",))
    message = str(caught.value)
    assert message == (
        f"{text_file} holds plain text rows (TRL's language-modelling format, {{\"text\": ...}}): "
        "rm needs preference pairs (prompt/chosen/rejected)"
    )
    assert result.require("sft", sft.KINDS) is result
    # a demonstrations file given to rm used to end in a KeyError ('rejected') traceback
    messages = write_jsonl(text_file.parent / "m.jsonl", [{"messages": [{"role": "user", "content": "Hi"},
                                                                        {"role": "assistant", "content": "Hello"}]}])  # fmt: skip
    with pytest.raises(UserError, match=r"holds demonstrations \(prompt and a target response\): rm needs preference pairs"):
        load_records(str(messages)).require("rm", ("preference",))
    prompts = write_jsonl(text_file.parent / "p.jsonl", [{"prompt": "Q?"}])
    with pytest.raises(UserError, match=r"holds prompts alone \(TRL's prompt-only rows\): sft needs preference pairs"):
        load_records(str(prompts)).require("sft", sft.KINDS)


# ---------------------------------------------------------------------------------------
# sft on text: the loss covers every token


def test_text_example_labels_every_token_and_the_eos(tokenizer):
    example = sft.encode_record(tokenizer, {"text": "The quick brown fox."}, 8, 8)
    ids = tokenizer("The quick brown fox.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert example["input_ids"][-len(ids):] == ids
    prefix = len(example["input_ids"]) - len(ids)  # a BOS for tokenizers that add one
    assert example["labels"] == [IGNORE] * prefix + ids
    long = sft.encode_record(tokenizer, {"text": " ".join(["word"] * 50)}, 4, 4)
    assert len(long["input_ids"]) == 8 and long["input_ids"][-1] != tokenizer.eos_token_id  # cut: no EOS
    demo = sft.encode_record(tokenizer, {"prompt": "Q:", "chosen": " A."}, 8, 8)
    assert demo == sft.encode_example(tokenizer, "Q:", " A.", 8, 8)


@pytest.mark.slow
def test_sft_trains_on_a_text_file_end_to_end(tmp_path, text_file):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "sft", "--model", "tiny", "--dataset", str(text_file), "--run-dir", str(run_dir), "--max-steps", "2",
        "--batch-size", "2", "--eval-every", "1", "--save-every", "0", "--max-prompt-length", "16",
        "--max-response-length", "16",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (run_dir / "sft" / "config.json").is_file()
    stage = json.loads((run_dir / "run.json").read_text())["stages"]["sft"]
    assert stage["status"] == "finished" and stage["inputs"]["train_records"] > 0
    # run.json shows a text record as it is trained: no template applies to it
    assert set(stage["inputs"]["chat_template"]) == {"template", "text"}
    evals = [r for r in read_jsonl(run_dir / "metrics" / "sft.jsonl") if r["split"] == "eval"]
    held_out = load_records(str(text_file), split="eval").records
    from marlhf_cli.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    # every token of every held-out text and its EOS is a target, except the sequence's first
    # token (a BOS, or the text's first token), which nothing precedes
    expected = sum(len(sft.encode_record(tokenizer, r, 16, 16)["input_ids"]) - 1 for r in held_out)
    assert evals and all(r["tokens"] == expected for r in evals)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["rm", "ppo", "bon"])
def test_stages_that_need_prompts_or_pairs_refuse_a_text_file_in_one_line(tmp_path, text_file, command):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    extra = {"rm": ["--model", "tiny"], "ppo": ["--policy", "tiny", "--reward-model", "tiny"],
             "bon": ["--policy", "tiny", "--reward-model", "tiny"]}[command]  # fmt: skip
    result = CliRunner().invoke(app, [command, "--dataset", str(text_file), "--run-dir", str(tmp_path), *extra],
                                env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    needs = "preference pairs" if command == "rm" else "preference pairs (prompt/chosen/rejected) or demonstrations"
    assert lines[-1].startswith(f"error: {text_file} holds plain text rows") and f"{command} needs {needs}" in lines[-1]
    assert not (tmp_path / command).exists()
