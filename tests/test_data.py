"""The dataset layer: adapters on the embedded samples and on the real ../shared/data files,
prompt formats, the paper's splits, TRL-format files and the hub code path (faked, never
the network)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import List

import pytest

from marlhf_cli.data import DATASETS, PAPER_FRACTIONS, load_records, split_records
from marlhf_cli.data import hub as hub_module
from marlhf_cli.data.hh import split_transcript
from marlhf_cli.data.local import read_rows
from marlhf_cli.data.splits import APPS_FRACTIONS, assign_splits
from marlhf_cli.errors import UserError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SAMPLES = Path(__file__).resolve().parents[1] / "marlhf_cli" / "data" / "samples"


def shared(*parts: str) -> Path:
    """A file of ../shared/data, or skip the test saying why it cannot run."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: real-data tests need the shared/ folder beside the repository")
    return path


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Tests never touch a hub: the named datasets must fall back to their embedded samples."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def sample_rows(name: str) -> list[dict]:
    return [row for _, row in read_rows(SAMPLES / f"{name}.jsonl")]


# ---------------------------------------------------------------- embedded samples, offline

SAMPLE_SIZES = {"tldr": (48, 48), "hh": (48, 48), "webgpt": (50, 44), "apps": (10, 10)}


@pytest.mark.parametrize("name", sorted(SAMPLE_SIZES))
def test_embedded_sample_is_used_offline_with_a_notice(name):
    result = load_records(name)
    rows, kept = SAMPLE_SIZES[name]
    assert result.source == f"embedded:{name}"
    assert result.report.rows == rows and result.report.kept == kept == len(result.records)
    assert result.report.total_skipped == 0
    assert result.notice is not None and "\n" not in result.notice
    assert f"embedded {name} sample ({kept} records)" in result.notice
    assert DATASETS[name].hub.repo in result.notice


def test_webgpt_ties_are_dropped_and_counted_not_skipped():
    result = load_records("webgpt")
    assert result.report.dropped == {"tied scores": 6}
    assert "dropped 6 by design (6 tied scores)" in result.report.summary()


@pytest.mark.parametrize("name", ["tldr", "hh", "webgpt"])
def test_preference_records_have_the_schema(name):
    for record in load_records(name).records:
        assert set(record) == {"prompt", "chosen", "rejected"}
        assert all(isinstance(record[k], str) and record[k].strip() for k in record)
        assert record["chosen"].strip() != record["rejected"].strip()


def test_samples_are_in_each_hub_datasets_row_format():
    tldr = sample_rows("tldr")[0]
    assert set(tldr) == {"info", "summaries", "choice", "worker", "batch", "split", "extra"}
    assert set(tldr["info"]) == {"id", "post", "title", "subreddit", "site", "article"}
    assert [set(s) for s in tldr["summaries"]] == [{"text", "policy", "note"}] * 2
    assert set(sample_rows("hh")[0]) == {"prompt", "response", "chosen", "rejected"}
    webgpt = sample_rows("webgpt")[0]
    assert set(webgpt) == {f"{k}_{i}" for k in ("quotes", "answer", "tokens", "score") for i in (0, 1)} | {"question"}
    assert set(webgpt["question"]) == {"dataset", "id", "full_text"}
    apps = sample_rows("apps")[0]
    assert set(apps) == {"problem_id", "question", "solutions", "input_output", "difficulty", "url", "starter_code"}
    assert isinstance(apps["solutions"], str) and isinstance(apps["input_output"], str)  # JSON strings, as on the hub


def test_tldr_sample_repeats_posts_like_the_real_data():
    posts = [row["info"]["post"] for row in sample_rows("tldr")]
    assert len(set(posts)) < len(posts)


def test_samples_copy_nothing_from_shared_data():
    path = shared("tldr", "comparisons.jsonl")
    real_posts = {row["post"] for _, row in read_rows(path)}
    assert not real_posts & {row["info"]["post"] for row in sample_rows("tldr")}
    real_hh = {row["chosen"] for _, row in read_rows(shared("hh-rlhf", "helpful-base-sample.jsonl"))}
    ours = {row["prompt"] + row["chosen"] for row in sample_rows("hh")}
    assert not real_hh & ours
    real_apps = {row["question"] for _, row in read_rows(shared("apps", "apps-sample.jsonl"))}
    assert not real_apps & {row["question"] for row in sample_rows("apps")}


def _run_solution(program: str, record: dict, test_input):
    if "fn_name" in record:
        scope = {"List": List}
        exec(program, scope)  # our own reference solutions
        fn = getattr(scope["Solution"](), record["fn_name"]) if "Solution" in scope else scope[record["fn_name"]]
        return fn(*test_input)
    out = io.StringIO()
    stdin = io.StringIO(test_input)
    import sys

    saved, sys.stdin = sys.stdin, stdin
    try:
        with contextlib.redirect_stdout(out):
            exec(program, {"__name__": "__main__"})
    finally:
        sys.stdin = saved
    return out.getvalue()


def test_apps_sample_solutions_pass_their_tests():
    records = load_records("apps").records
    assert {r["difficulty"] for r in records} == {"introductory", "interview", "competition"}
    assert sum("fn_name" in r for r in records) >= 2 and sum("fn_name" not in r for r in records) >= 2
    for record in records:
        assert record["solutions"] and len(record["inputs"]) == len(record["outputs"]) >= 3
        for program in record["solutions"]:
            for test_input, expected in zip(record["inputs"], record["outputs"], strict=True):
                got = _run_solution(program, record, test_input)
                # call-based tests follow APPS: an output may be wrapped in a one-element list
                assert got == expected or [got] == expected, (record["problem_id"], test_input)


# ---------------------------------------------------------------- prompt formats

def test_tldr_prompt_is_the_papers_format():
    row = sample_rows("tldr")[0]
    record = load_records("tldr").records[0]
    info = row["info"]
    assert record["prompt"] == f"SUBREDDIT: r/{info['subreddit']}\nTITLE: {info['title']}\nPOST: {info['post']}\nTL;DR:"
    texts = [s["text"] for s in row["summaries"]]
    assert record["chosen"] == texts[row["choice"]] and record["rejected"] == texts[1 - row["choice"]]


def test_hh_prompt_is_the_transcript_ending_with_assistant():
    for record in load_records("hh").records:
        assert record["prompt"].startswith("\n\nHuman: ") and record["prompt"].endswith("\n\nAssistant:")
        assert record["chosen"].startswith(" ")


def test_webgpt_prompt_and_preference_by_score():
    row = next(r for r in sample_rows("webgpt") if r["score_0"] < r["score_1"])
    record = next(r for r in load_records("webgpt").records if row["answer_1"].strip() in r["chosen"])
    assert record["prompt"] == f"Question: {row['question']['full_text']}\nAnswer:"
    assert record["chosen"] == " " + row["answer_1"].strip() and record["rejected"] == " " + row["answer_0"].strip()


def test_apps_prompt_format():
    records = {r["problem_id"]: r for r in load_records("apps").records}
    stdin, call = records[9001], records[9003]
    assert stdin["prompt"] == "QUESTION:\n" + stdin["question"].strip() + "\n\nUse Standard Input format\nANSWER:\n"
    assert "fn_name" not in stdin
    assert call["fn_name"] == "is_palindrome"
    assert call["prompt"].endswith("\n\ndef is_palindrome(s):\n\nUse Call-Based format\nANSWER:\n")


# ---------------------------------------------------------------- HH raw transcripts

MULTI_TURN = (
    "\n\nHuman: Hi, can you help me plan a trip?\n\nAssistant: Of course. Where to?"
    "\n\nHuman: Lisbon, for three days.\n\nAssistant:"
)


def test_raw_transcript_is_split_at_the_last_assistant_turn():
    prompt, response = split_transcript(MULTI_TURN + " Day one: Alfama and the castle.")
    assert prompt == MULTI_TURN
    assert response == " Day one: Alfama and the castle."
    assert prompt.count("\n\nAssistant:") == 2


def test_raw_hh_file_loads_by_detection_and_by_name(tmp_path):
    rows = [
        {"chosen": MULTI_TURN + " Day one: Alfama.", "rejected": MULTI_TURN + " Just stay home."},
        {"chosen": MULTI_TURN + " Visit Belem.", "rejected": "\n\nHuman: Something else\n\nAssistant: Belem."},
    ]
    path = write_jsonl(tmp_path / "raw.jsonl", rows)
    for result in (load_records(str(path)), load_records("hh", data_file=path)):
        assert (result.dataset, result.variant) == ("hh", "raw")
        assert result.records == [{"prompt": MULTI_TURN, "chosen": " Day one: Alfama.", "rejected": " Just stay home."}]
        assert result.report.skipped == {"prompt mismatch": 1}
        assert "raw.jsonl:2: field 'rejected'" in result.report.examples["prompt mismatch"][0]


# ---------------------------------------------------------------- the real shared files

def test_shared_tldr_comparisons_load_and_split_by_post():
    path = shared("tldr", "comparisons.jsonl")
    result = load_records(str(path))
    assert (result.dataset, result.variant, result.source) == ("tldr", "flat", str(path))
    assert result.report.kept == result.report.rows == 1494
    assert result.records[0]["prompt"].startswith("SUBREDDIT: r/") and result.records[0]["prompt"].endswith("\nTL;DR:")
    posts = {}
    for split in ("sft", "rm", "ppo", "eval"):
        for record in load_records(str(path), split=split).records:
            post = record["prompt"].split("\nPOST: ", 1)[1]
            posts.setdefault(post, set()).add(split)
    assert all(len(splits) == 1 for splits in posts.values())
    assert len(posts) == 853


@pytest.mark.parametrize("name", ["harmless-base-sample.jsonl", "helpful-base-sample.jsonl"])
def test_shared_hh_transcripts_load(name):
    path = shared("hh-rlhf", name)
    result = load_records("hh", data_file=path)
    assert result.variant == "raw" and result.report.rows in (2000, 2054)
    # Anthropic's files hold a few broken pairs: counted, never silently dropped
    assert result.report.kept + result.report.total_skipped == result.report.rows
    assert 0 < result.report.total_skipped < 20 and "prompt mismatch" in result.report.skipped
    for record in result.records[:200]:
        assert record["prompt"].endswith("\n\nAssistant:") and "\n\nAssistant:" not in record["chosen"]


def test_shared_apps_sample_loads():
    path = shared("apps", "apps-sample.jsonl")
    result = load_records(str(path))
    assert (result.dataset, result.variant, result.kind) == ("apps", "flat", "problem")
    assert len(result.records) == 5
    call_based = [r for r in result.records if "fn_name" in r]
    assert {r["fn_name"] for r in call_based} == {"findKthPositive", "is_prime"}
    assert all("Use Call-Based format" in r["prompt"] for r in call_based)
    assert all(r["prompt"].endswith("ANSWER:\n") and r["solutions"] for r in result.records)


def test_shared_tldr_references_are_demonstrations():
    result = load_records(str(shared("tldr", "posts-with-reference.jsonl")), split="sft")
    assert result.kind == "demonstration" and set(result.records[0]) == {"prompt", "chosen"}


# ---------------------------------------------------------------- splits

def test_split_records_exact_fractions_without_groups():
    records = [{"prompt": f"p{i}"} for i in range(100)]
    parts = split_records(records, PAPER_FRACTIONS, seed=3)
    assert {k: len(v) for k, v in parts.items()} == {"sft": 20, "rm": 40, "ppo": 40}
    assert sorted(r["prompt"] for v in parts.values() for r in v) == sorted(r["prompt"] for r in records)


def test_split_records_keeps_groups_together():
    records = [{"prompt": f"p{i // 3}", "i": i} for i in range(90)]
    for key in ("prompt", lambda r: r["prompt"]):
        parts = split_records(records, PAPER_FRACTIONS, seed=1, group_key=key)
        seen = {}
        for name, rows in parts.items():
            for r in rows:
                assert seen.setdefault(r["prompt"], name) == name


def _split_sizes(dataset, **kw):
    return {s: load_records(dataset, split=s, **kw).records for s in ("sft", "rm", "ppo", "eval")}


@pytest.mark.parametrize("name", ["hh", "webgpt", "tldr"])
def test_embedded_splits_are_20_40_40_disjoint_and_cover_everything(name):
    parts = _split_sizes(name, seed=0)
    total = len(load_records(name).records)
    group = 3 if name == "tldr" else 1  # TL;DR rows come three per post
    train = total - len(parts["eval"])
    assert abs(len(parts["eval"]) - 0.1 * total) <= group
    for split, share in PAPER_FRACTIONS.items():
        assert abs(len(parts[split]) - share * train) <= group + 1, (split, len(parts[split]), train)
    keys = [{(r["prompt"], r["chosen"], r["rejected"]) for r in rows} for rows in parts.values()]
    assert sum(map(len, keys)) == total == len(set().union(*keys))


def test_shared_hh_split_sizes_are_20_40_40():
    path = shared("hh-rlhf", "harmless-base-sample.jsonl")
    parts = {s: load_records("hh", data_file=path, split=s).records for s in ("sft", "rm", "ppo", "eval")}
    train = sum(len(parts[s]) for s in PAPER_FRACTIONS)
    for split, share in PAPER_FRACTIONS.items():
        assert abs(len(parts[split]) / train - share) < 0.01
    prompts = [{r["prompt"] for r in rows} for rows in parts.values()]
    assert all(not (a & b) for i, a in enumerate(prompts) for b in prompts[i + 1 :])


def test_apps_splits_are_20_80_with_no_rm():
    path = shared("codejam", "problems.jsonl")
    parts = {s: load_records(str(path), split=s).records for s in ("sft", "ppo", "eval")}
    train = len(parts["sft"]) + len(parts["ppo"])
    assert abs(len(parts["sft"]) / train - APPS_FRACTIONS["sft"]) < 0.01
    with pytest.raises(UserError, match="no 'rm' split"):
        load_records("apps", split="rm")
    embedded = {s: len(load_records("apps", split=s).records) for s in ("sft", "ppo", "eval")}
    assert embedded == {"sft": 2, "ppo": 7, "eval": 1}


def test_splits_are_deterministic_by_seed():
    first = load_records("hh", split="rm", seed=7).records
    assert load_records("hh", split="rm", seed=7).records == first
    assert load_records("hh", split="rm", seed=8).records != first
    groups = [f"g{i % 17}" for i in range(200)]
    assert assign_splits(groups, PAPER_FRACTIONS, 5) == assign_splits(groups, PAPER_FRACTIONS, 5)
    assert assign_splits(groups, PAPER_FRACTIONS, 5) != assign_splits(groups, PAPER_FRACTIONS, 6)


def test_limit_takes_a_prefix_of_the_split_without_moving_rows():
    full = load_records("hh", split="ppo", seed=2).records
    assert load_records("hh", split="ppo", seed=2, limit=5).records == full[:5]


def test_unknown_split_and_dataset_are_user_errors():
    with pytest.raises(UserError, match="unknown split"):
        load_records("hh", split="train")
    with pytest.raises(UserError, match="unknown dataset 'nope'"):
        load_records("nope")


# ---------------------------------------------------------------- TRL conventions

def test_trl_standard_and_implicit_prompt(tmp_path):
    standard = write_jsonl(tmp_path / "std.jsonl", [{"prompt": "Q?", "chosen": " yes", "rejected": " no"}])
    result = load_records(str(standard))
    assert (result.dataset, result.variant) == ("trl", "standard")
    assert result.records == [{"prompt": "Q?", "chosen": " yes", "rejected": " no"}]
    implicit = write_jsonl(tmp_path / "imp.jsonl", [{"chosen": "The sky is blue.", "rejected": "The sky is green."}])
    assert load_records(str(implicit)).records == [{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}]


def test_trl_conversational_formats(tmp_path):
    user = {"role": "user", "content": "Hi"}
    good, bad = {"role": "assistant", "content": "Hello!"}, {"role": "assistant", "content": "Go away."}
    # the transcript text (--chat-template none), and the turns a chat template renders
    turns = {"prompt": [user], "chosen": [good], "rejected": [bad]}
    expected = {"prompt": "\n\nHuman: Hi\n\nAssistant:", "chosen": " Hello!", "rejected": " Go away.", "conversation": turns}
    explicit = write_jsonl(tmp_path / "c.jsonl", [{"prompt": [user], "chosen": [good], "rejected": [bad]}])
    assert load_records(str(explicit)).records == [expected]
    implicit = write_jsonl(tmp_path / "ic.jsonl", [{"chosen": [user, good], "rejected": [user, bad]}])
    assert load_records(str(implicit)).records == [expected]
    messages = write_jsonl(tmp_path / "m.jsonl", [{"messages": [user, good]}])
    result = load_records(str(messages))
    assert result.kind == "demonstration"
    assert result.records == [{"prompt": expected["prompt"], "chosen": " Hello!",
                               "conversation": {"prompt": [user], "chosen": [good], "all_assistant_turns": True}}]  # fmt: skip
    # ShareGPT-style role names become the template's (human -> user, gpt -> assistant)
    sharegpt = write_jsonl(tmp_path / "g.jsonl", [{"messages": [{"role": "human", "content": "Hi"}, {"role": "gpt", "content": "Hello!"}]}])
    assert load_records(str(sharegpt)).records == result.records


def test_json_array_and_parquet_files(tmp_path):
    rows = [{"prompt": f"P{i}", "chosen": " a", "rejected": " b"} for i in range(4)]
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    assert load_records(str(array)).records == rows
    assert [line for line, _ in read_rows(array)] == [2, 7, 12, 17]
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert load_records(str(parquet)).records == rows


# ---------------------------------------------------------------- the hub code path (faked)

def test_hub_rows_go_through_the_same_adapter(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        rows = sample_rows("tldr")
        return datasets.Dataset.from_list(rows[:30] if split == "train" else rows[30:])

    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub_module, "probe_endpoint", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    result = load_records("tldr", split="eval")
    assert result.source == "hub:openai/summarize_from_feedback" and result.notice is None
    assert calls == [("openai/summarize_from_feedback", "comparisons", "validation")]
    assert len(result.records) == 18
    sft = load_records("tldr", split="sft").records
    assert calls[-1][2] == "train" and abs(len(sft) - 6) <= 3
    everything = load_records("tldr")  # train pool then the validation split
    assert everything.report.kept == everything.report.rows == len(everything.records) == 48


def test_hub_errors_other_than_unreachable_propagate(monkeypatch):
    import datasets

    def broken(*args, **kwargs):
        raise ValueError("schema changed")

    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub_module, "probe_endpoint", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", broken)
    with pytest.raises(ValueError, match="schema changed"):
        load_records("hh")


def test_connection_errors_anywhere_in_the_chain_mean_unreachable():
    try:
        try:
            raise OSError("Name or service not known")
        except OSError as inner:
            raise ConnectionError("Couldn't reach the Hub") from inner
    except ConnectionError as err:
        assert hub_module.is_unreachable(err)
    assert not hub_module.is_unreachable(ValueError("bad"))
