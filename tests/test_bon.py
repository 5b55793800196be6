"""`marlhf bon`: the best-of-N estimator against brute force, option handling, and the command
end to end on the tiny policy and reward model (JSON, PNG, JSONL, resume)."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest
from typer.testing import CliRunner

from marlhf_cli.artifacts import RunDir, read_jsonl
from marlhf_cli.cli import app
from marlhf_cli.errors import UserError
from marlhf_cli.evaluate import bon, estimator


# ---------------------------------------------------------------------------------------
# the estimator


@pytest.mark.parametrize("m", range(1, 8))
def test_estimator_equals_brute_force_over_all_subsets(m):
    rng = random.Random(m)
    for trial in range(5):
        # rounded scores so that ties occur
        scores = [round(rng.gauss(0, 1), 1) for _ in range(m)]
        for n in range(1, m + 1):
            subsets = list(itertools.combinations(scores, n))
            brute = sum(max(s) for s in subsets) / len(subsets)
            assert estimator.expected_best_of(scores, n) == pytest.approx(brute, abs=1e-12)


def test_estimator_edges():
    scores = [3.0, -1.0, 2.0, 0.5]
    assert estimator.expected_best_of(scores, 1) == pytest.approx(statistics.mean(scores))
    assert estimator.expected_best_of(scores, 4) == 3.0
    assert sum(estimator.expected_max_weights(40, 16)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        estimator.expected_max_weights(3, 4)
    curve = estimator.best_of_curve([[0.0, 1.0], [2.0, 2.0]], [1, 2])
    assert curve[1]["mean"] == pytest.approx(1.25) and curve[2]["mean"] == pytest.approx(1.5)
    assert curve[2]["sem"] == pytest.approx(statistics.stdev([1.0, 2.0]) / 2**0.5)


def test_estimator_large_m_is_exact():
    """C(M, N) overflows a float's factorials long before M=400; the integer weights do not."""
    scores = list(range(400))
    # E[max of N from 0..M-1] = N (M + 1) / (N + 1) - 1 for distinct consecutive integers
    for n in (1, 7, 200, 400):
        assert estimator.expected_best_of(scores, n) == pytest.approx(n * 401 / (n + 1) - 1)


# ---------------------------------------------------------------------------------------
# options and policy names


def test_lists_and_checks():
    assert bon.parse_list("16, 4,8,4", int, "--n") == [4, 8, 16]
    assert bon.parse_list("[0.2, 1.0]", float, "--temperature") == [0.2, 1.0]
    for text, kind in (("4,x", int), ("2.5", int), ("", float)):
        with pytest.raises(UserError):
            bon.parse_list(text, kind, "--n")
    result = CliRunner().invoke(app, ["bon", "--n", "0,4", "--policy", "tiny", "--reward-model", "tiny"])
    assert result.exit_code == 2 and "--n must be comma-separated ints, each 1 or more" in result.output
    result = CliRunner().invoke(app, ["bon", "--temperature", "0", "--policy", "tiny", "--reward-model", "tiny"])
    assert result.exit_code == 2 and "--temperature" in result.output


def test_policy_names_resolve_in_the_run_directory(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(UserError, match="marlhf sft"):
        run.policy(None)
    for folder in ("sft", "ppo/fixed5", "ppo/vanilla"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text("{}")
    assert run.policy(None) == (str(tmp_path / "sft"), "sft")
    assert run.policy("ppo/fixed5") == (str(tmp_path / "ppo" / "fixed5"), "ppo-fixed5")
    with pytest.raises(UserError, match="ambiguous.*ppo/fixed5, ppo/vanilla"):
        run.policy("ppo")
    with pytest.raises(UserError, match="marlhf ppo --name missing"):
        run.policy("ppo/missing")
    assert run.policy("tiny") == ("tiny", "tiny")
    assert run.policy("org/some-model") == ("org/some-model", "some-model")


# ---------------------------------------------------------------------------------------
# end to end on the tiny models

ARGS = ["--policy", "tiny", "--reward-model", "tiny", "--dataset", "tldr", "--max-records", "3", "--n", "2,4",
        "--max-new-tokens", "6", "--max-prompt-length", "48", "--batch-size", "8"]  # fmt: skip


def invoke(run_dir, *extra):
    return CliRunner().invoke(app, ["bon", *ARGS, "--run-dir", str(run_dir), *extra], env={"COLUMNS": "160"})


@pytest.mark.slow
def test_bon_end_to_end_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    run = tmp_path / "run"
    result = invoke(run, "--temperature", "0.5,1.0")
    assert result.exit_code == 0, result.output
    report = json.loads((run / "bon" / "tiny.json").read_text())
    assert report["samples_per_prompt"] == 4 and report["n"] == [2, 4] and report["temperatures"] == [0.5, 1.0]
    prompts = report["prompts"]
    assert 2 <= prompts <= 3
    for temp in ("0.5", "1"):
        cached = json.loads((run / "bon" / "tiny" / f"t{temp}.json").read_text())["rows"]
        scores = [[s["score"] for s in row["samples"]] for row in cached]
        assert len(scores) == prompts and all(len(s) == 4 for s in scores)
        figures = report["results"][temp]
        # N = M is the plain maximum; N = 2 is the estimator; the mean is N = 1
        assert figures["best_of"]["4"]["mean"] == pytest.approx(statistics.mean(max(s) for s in scores))
        assert figures["best_of"]["2"]["mean"] == pytest.approx(statistics.mean(estimator.expected_best_of(s, 2) for s in scores))
        assert figures["mean_score"] == pytest.approx(statistics.mean(x for s in scores for x in s))
        assert figures["mean_score"] <= figures["best_of"]["2"]["mean"] <= figures["best_of"]["4"]["mean"]
    best = read_jsonl(run / "bon" / "tiny-best.jsonl")
    assert len(best) == 2 * prompts and {r["temperature"] for r in best} == {0.5, 1.0}
    assert all(set(r) >= {"prompt", "response", "score"} for r in best)
    png = (run / "plots" / "bon-tiny.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "N=4" in result.output and "wrote" in result.output
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["stages"]["bon/tiny"]["metrics"]["best_of_4"] == pytest.approx(
        max(report["results"][t]["best_of"]["4"]["mean"] for t in ("0.5", "1"))
    )

    # a rerun skips every finished temperature: no model is even loaded
    def no_models(*args, **kwargs):
        raise AssertionError("a finished temperature was sampled again")

    monkeypatch.setattr(bon, "load_models", no_models)
    again = invoke(run, "--temperature", "0.5,1.0")
    assert again.exit_code == 0, again.output
    assert "2 already done" in again.output
    assert json.loads((run / "bon" / "tiny.json").read_text())["results"] == report["results"]
    monkeypatch.undo()

    # a new temperature is sampled alone; the sweep equals one run from scratch (seeded per T)
    sampled = []
    original = bon.sample_temperature
    monkeypatch.setattr(bon, "sample_temperature", lambda m, p, t, *a: sampled.append(t) or original(m, p, t, *a))
    grown = invoke(run, "--temperature", "0.5,0.8,1.0")
    assert grown.exit_code == 0, grown.output
    assert sampled == [0.8]
    fresh = invoke(tmp_path / "fresh", "--temperature", "1.0")
    assert fresh.exit_code == 0, fresh.output
    rows = lambda root: json.loads((root / "bon" / "tiny" / "t1.json").read_text())["rows"]  # noqa: E731
    assert rows(tmp_path / "fresh") == rows(run)
    # a changed setting samples again instead of reusing stale scores
    changed = invoke(run, "--temperature", "1.0", "--max-new-tokens", "4")
    assert changed.exit_code == 0, changed.output
    assert sampled[-1] == 1.0 and all(s["tokens"] <= 4 for r in rows(run) for s in r["samples"])


@pytest.mark.slow
def test_reward_model_with_its_own_tokenizer_scores_the_text(tmp_path):
    """A reward model whose vocabulary differs from the policy's gets the texts re-tokenized."""
    pytest.importorskip("gguf")
    from transformers import LlamaForSequenceClassification

    from marlhf_cli.models import load_reward_model, load_tokenizer, tiny_config
    from marlhf_cli.evaluate.rm_judge import score_texts

    tokenizer = load_tokenizer("tiny")
    tokenizer.add_tokens(["<only-in-the-reward-model>"])
    folder = tmp_path / "other-rm"
    LlamaForSequenceClassification(tiny_config(tokenizer, num_labels=1)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    run = tmp_path / "run"
    args = list(ARGS)
    args[args.index("--reward-model") + 1] = str(folder)
    result = CliRunner().invoke(app, ["bon", *args, "--run-dir", str(run), "--temperature", "1.0", "--n", "2"])
    assert result.exit_code == 0, result.output
    rows = json.loads((run / "bon" / "tiny" / "t1.json").read_text())["rows"]
    model, rm_tokenizer = load_reward_model(str(folder)), load_tokenizer(str(folder))
    model.eval()
    samples = [(r["prompt"], s) for r in rows for s in r["samples"]]
    expected = score_texts(model, rm_tokenizer, [p for p, _ in samples], [s["response"] for _, s in samples],
                           max_prompt=48, max_response=7, batch_size=8)  # fmt: skip
    assert [s["score"] for _, s in samples] == pytest.approx(expected, abs=1e-5)
