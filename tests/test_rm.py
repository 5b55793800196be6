"""``marlhf rm``: where the score is read, the pairwise loss and metrics, and sft -> rm end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from _toy_prefs import sft_then_rm, write_toy_preferences
from marlhf_cli.scoring import heads as scoring
from marlhf_cli.train import rm


@pytest.fixture(scope="module")
def toy_preferences(tmp_path_factory) -> Path:
    return write_toy_preferences(tmp_path_factory.mktemp("toy") / "prefs.jsonl")


@pytest.fixture(scope="module")
def tiny_reward_model():
    from marlhf_cli.models import load_reward_model

    return load_reward_model("tiny").eval()


# ---------------------------------------------------------------------------------------
# the score position


def test_last_token_index_for_right_and_left_padding():
    import torch

    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert scoring.last_token_index(right).tolist() == [2, 4, 0]
    assert scoring.last_token_index(left).tolist() == [4, 4, 4]
    assert scoring.position_ids(left).tolist()[0] == [0, 0, 0, 1, 2]


def _pad(rows, pad_id, side):
    import torch

    longest = max(map(len, rows))
    ids, mask = [], []
    for row in rows:
        fill = [pad_id] * (longest - len(row))
        ids.append(row + fill if side == "right" else fill + row)
        mask.append([1] * len(row) + [0] * len(fill) if side == "right" else [0] * len(fill) + [1] * len(row))
    return torch.tensor(ids), torch.tensor(mask)


def test_score_is_read_at_the_eos_whatever_the_padding(tokenizer, tiny_reward_model):
    """pad == eos here (SmolLM2): the score of prompt + response + EOS must not depend on padding."""
    import torch

    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    rows = [
        tokenizer("Q: hi\nA: hello there friend", add_special_tokens=False)["input_ids"] + [eos],
        tokenizer("Q: a much longer question about rivers\nA: ok", add_special_tokens=False)["input_ids"] + [eos],
        tokenizer("x", add_special_tokens=False)["input_ids"] + [eos],
    ]
    with torch.no_grad():
        alone = torch.stack(
            [scoring.sequence_scores(tiny_reward_model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in rows]
        )
        for side in ("right", "left"):
            ids, mask = _pad(rows, eos, side)
            torch.testing.assert_close(scoring.sequence_scores(tiny_reward_model, ids, mask), alone, rtol=1e-4, atol=1e-5)


def test_transformers_own_pooling_misses_the_eos_when_pad_is_eos(tokenizer, tiny_reward_model):
    """Why marlhf scores from the attention mask: HF's classifier skips every pad-id token,
    so with pad == eos it reads the token *before* the EOS the response ends with."""
    import torch

    eos = tokenizer.eos_token_id
    body = tokenizer("Q: hi\nA: hello there", add_special_tokens=False)["input_ids"]
    with_eos = torch.tensor([body + [eos]])
    with torch.no_grad():
        hf = tiny_reward_model(input_ids=with_eos).logits[0, 0]
        ours_at_eos = scoring.sequence_scores(tiny_reward_model, with_eos, torch.ones_like(with_eos))[0]
        ours_before = scoring.sequence_scores(tiny_reward_model, torch.tensor([body]), torch.ones(1, len(body), dtype=torch.long))[0]
    assert hf.item() == pytest.approx(ours_before.item(), rel=1e-4, abs=1e-5)
    assert hf.item() != pytest.approx(ours_at_eos.item(), rel=1e-3, abs=1e-4)


def test_normalized_score_uses_the_stored_statistics():
    import torch
    from types import SimpleNamespace

    config = SimpleNamespace(**{scoring.MEAN_KEY: 2.0, scoring.STD_KEY: 4.0})
    assert scoring.normalized_score(torch.tensor([2.0, 6.0]), config).tolist() == [0.0, 1.0]
    assert scoring.normalized_score(torch.tensor([3.0]), SimpleNamespace()).tolist() == [3.0]


def test_trainable_layers_freezes_everything_below_the_top_blocks():
    import torch

    from marlhf_cli.models import load_reward_model
    from marlhf_cli.train.freeze import train_top_layers

    model = load_reward_model("tiny")
    trainable, total = train_top_layers(model, 1)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.startswith(("model.layers.1.", "model.norm.", "score.")) for n in names)
    assert "score.weight" in names and "model.norm.weight" in names
    assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad) < total
    # nothing below the first trainable block is recorded by autograd
    ids = torch.tensor([[5, 6, 7]])
    scoring.sequence_scores(model, ids, torch.ones_like(ids)).sum().backward()
    assert model.model.embed_tokens.weight.grad is None and model.model.layers[0].mlp.up_proj.weight.grad is None
    assert model.score.weight.grad is not None


# ---------------------------------------------------------------------------------------
# pairs, loss and metrics


def test_pairs_identical_after_truncation_are_left_out(tokenizer):
    record = {"prompt": "Q:", "chosen": " the same start, then A", "rejected": " the same start, then B"}
    assert rm.encode_pair(tokenizer, record, 16, 3) is None
    pair = rm.encode_pair(tokenizer, record, 16, 32)
    assert pair["chosen"][-1] == pair["rejected"][-1] == tokenizer.eos_token_id
    assert pair["chosen"] != pair["rejected"]


def test_cuts_count_what_the_length_limits_cut(tokenizer):
    """Against a reference: a prompt is cut when it has more tokens than fit, a response
    when it has at least ``max_response`` (its end token is then dropped too)."""
    import random

    from marlhf_cli.encode import Cuts
    from marlhf_cli.train import sft

    rng = random.Random(0)
    words = ["cats", "rain", "a", "long", "sentence,", "indeed", "then", "more"]
    records = [{"prompt": " ".join(rng.choices(words, k=rng.randint(1, 14))),
                "chosen": " ".join(rng.choices(words, k=rng.randint(1, 9))),
                "rejected": " ".join(rng.choices(words, k=rng.randint(1, 9))) + " x"} for _ in range(60)]  # fmt: skip
    n_ids = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    max_prompt, max_response = 8, 5
    pairs = Cuts()
    rm.encode_pairs(tokenizer, records, max_prompt, max_response, cuts=pairs)
    assert pairs.prompts == sum(n_ids(r["prompt"]) > max_prompt for r in records) > 0
    assert pairs.responses == sum(n_ids(r[k]) >= max_response for r in records for k in ("chosen", "rejected")) > 0
    assert (pairs.prompts_seen, pairs.responses_seen) == (60, 120)
    demos = Cuts()
    for r in records:
        sft.encode_record(tokenizer, {"prompt": r["prompt"], "completion": r["chosen"]}, max_prompt, max_response, cuts=demos)
        sft.encode_record(tokenizer, {"text": r["prompt"]}, max_prompt, max_response, cuts=demos)  # a text: a response
    assert demos.prompts == pairs.prompts and demos.prompts_seen == 60
    texts_cut = sum(n_ids(r["prompt"]) >= max_prompt + max_response for r in records)
    assert demos.responses == sum(n_ids(r["chosen"]) >= max_response for r in records) + texts_cut
    assert Cuts().describe(8, 5) == ""
    assert pairs.describe(8, 5).startswith(f"{pairs.prompts} of 60 prompts cut to --max-prompt-length 8 (their start dropped); ")


def test_the_data_report_counts_the_cut_rows(tmp_path):
    """`marlhf sft` says how many prompts and responses it cut, and run.json keeps the counts."""
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    data = write_toy_preferences(tmp_path / "prefs.jsonl", n=40)
    run = CliRunner().invoke(app, ["sft", "--model", "tiny", "--dataset", str(data), "--run-dir", str(tmp_path / "run"),
                                   "--max-prompt-length", "6", "--max-response-length", "4", "--max-steps", "1",
                                   "--batch-size", "2", "--eval-every", "0", "--save-every", "0"], env={"COLUMNS": "200"})  # fmt: skip
    assert run.exit_code == 0, run.output
    cut = json.loads((tmp_path / "run" / "run.json").read_text())["stages"]["sft"]["inputs"]["cut"]
    assert cut["prompts"] == cut["of_prompts"] > 0 and cut["responses"] == cut["of_responses"] == cut["of_prompts"]
    said = " ".join(run.output.split())
    assert f"sft: {cut['prompts']} of {cut['of_prompts']} prompts cut to --max-prompt-length 6 (their start dropped)" in said
    assert f"{cut['responses']} of {cut['of_responses']} responses cut to --max-response-length 4" in said


def test_pairwise_loss_and_metrics():
    import torch
    import torch.nn.functional as F

    class Fixed:
        def __call__(self, input_ids, attention_mask):
            return torch.tensor([2.0, 0.0, -1.0, 1.0, 1.0, 1.0], requires_grad=True)  # chosen 3, rejected 3

    batch = {"input_ids": torch.zeros(6, 2, dtype=torch.long), "attention_mask": torch.ones(6, 2), "pairs": 3}
    sums = rm.pair_sums(Fixed(), batch)
    margins = torch.tensor([1.0, -1.0, -2.0])
    assert sums["loss"].item() == pytest.approx(-F.logsigmoid(margins).sum().item())
    metrics = rm.summarize({k: float(v) for k, v in sums.items()}, 3)
    assert metrics["accuracy"] == pytest.approx(1 / 3)
    assert metrics["margin"] == pytest.approx(-2 / 3)
    scores = torch.tensor([2.0, 0.0, -1.0, 1.0, 1.0, 1.0])
    assert metrics["score_mean"] == pytest.approx(scores.mean().item())
    assert metrics["score_std"] == pytest.approx(scores.std(unbiased=False).item())


def test_rm_without_sft_names_the_command_to_run(tmp_path, toy_preferences):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    result = CliRunner().invoke(app, ["rm", "--dataset", str(toy_preferences), "--run-dir", str(tmp_path / "empty")])
    assert result.exit_code == 2
    message = result.output.strip()
    assert "marlhf sft" in message and len(message.splitlines()) == 1


# ---------------------------------------------------------------------------------------
# end to end: sft then rm through the CLI, then reload with plain transformers


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, toy_preferences, draw_plots) -> Path:
    return sft_then_rm(tmp_path_factory.mktemp("run"), toy_preferences)


@pytest.mark.slow
def test_outputs_reload_with_plain_transformers(pipeline):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    policy = AutoModelForCausalLM.from_pretrained(pipeline / "sft")
    assert policy.config.architectures == ["LlamaForCausalLM"]
    reward = AutoModelForSequenceClassification.from_pretrained(pipeline / "rm", num_labels=1)
    assert reward.config.num_labels == 1
    assert math.isfinite(reward.config.marlhf_reward_mean) and reward.config.marlhf_reward_std > 0
    AutoTokenizer.from_pretrained(pipeline / "rm")
    for name in ("sft", "rm"):
        assert (pipeline / "plots" / f"{name}-loss.png").stat().st_size > 1000
        assert any((pipeline / "tb" / name).iterdir())
    manifest = json.loads((pipeline / "run.json").read_text())["stages"]
    assert manifest["sft"]["status"] == manifest["rm"]["status"] == "finished"
    assert manifest["rm"]["inputs"]["model"] == str(pipeline / "sft")
    assert manifest["rm"]["config"]["lr"] == 2e-3 and "torch" in manifest["rm"]["versions"]


@pytest.mark.slow
def test_reward_model_prefers_chosen_on_held_out_pairs(pipeline, tmp_path):
    """The toy preference ("good" over "bad") is learned, judged on fresh pairs by the reloaded model."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from marlhf_cli.models import load_tokenizer

    rows = [json.loads(x) for x in pipeline.joinpath("metrics", "rm.jsonl").read_text().splitlines()]
    held_out = [r for r in rows if r["split"] == "eval"]
    assert held_out[-1]["accuracy"] >= 0.9 and held_out[-1]["loss"] < held_out[0]["loss"] + 1e-6
    assert json.loads((pipeline / "run.json").read_text())["stages"]["rm"]["metrics"]["eval_accuracy"] >= 0.9

    fresh = write_toy_preferences(tmp_path / "fresh.jsonl", n=16, seed=123)
    records = [json.loads(x) for x in fresh.read_text().splitlines()]
    tokenizer = load_tokenizer(str(pipeline / "rm"))
    model = AutoModelForSequenceClassification.from_pretrained(pipeline / "rm", num_labels=1).eval()
    pairs = [rm.encode_pair(tokenizer, r, 32, 16) for r in records]
    batch = rm.collate(pairs, tokenizer.pad_token_id)
    with torch.no_grad():
        scores = scoring.sequence_scores(model, batch["input_ids"], batch["attention_mask"])
    chosen, rejected = scores[: len(pairs)], scores[len(pairs) :]
    assert (chosen > rejected).float().mean().item() >= 0.9
