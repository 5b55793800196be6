"""Extending a finished run (``--resume`` with a larger ``--max-steps``, train/extending.py):
the extension starts from the export's weights at the step where the run ended, on that
step's data, with fresh AdamW moments and the new length's learning-rate schedule, and says
so; sft, rm (LoRA) and ppo (with and without a critic); refusals stay one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from _toy_prefs import write_toy_preferences
from marlhf_cli import engine as eng
from marlhf_cli.artifacts import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

LR = 1e-3
SFT = ["--model", "tiny", "--batch-size", "2", "--max-prompt-length", "16", "--max-response-length", "8",
       "--save-every", "0", "--eval-records", "4", "--lr", str(LR), "--warmup-ratio", "0.25"]  # fmt: skip


def invoke(*args):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


@pytest.fixture
def data(tmp_path) -> Path:
    return write_toy_preferences(tmp_path / "prefs.jsonl", n=60)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from marlhf_cli.models import load_causal_lm

    return {name: p.detach().clone() for name, p in load_causal_lm(str(folder), dtype="fp32").named_parameters()}


def _step_from(folder: Path, run: Path, data: Path, step: int) -> tuple[float, dict[str, torch.Tensor]]:
    """By hand, what 0-based ``step`` of an sft run does from the model in ``folder``: its loss
    on that step's global batch, and the gradient, clipped to norm 1 as the engine does."""
    from marlhf_cli import config as config_module
    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.train import common, loop, sft

    config = config_module.resolve("sft", flags={"model": "tiny", "dataset": str(data), "run_dir": str(run), "batch_size": 2,
                                                  "max_prompt_length": 16, "max_response_length": 8, "eval_records": 4})  # fmt: skip
    tokenizer = load_tokenizer("tiny", padding_side="right")
    train = common.load_split(config, "sft", None, report=False)
    task = sft.build_task(config, tokenizer, train.records, [])
    batch = task.collate([task.train[i] for i in loop.global_batch(len(task.train), 2, config.seed, step)])
    model = load_causal_lm(str(folder), dtype="fp32")
    model.train()  # as the engine trains (the tiny model has no dropout)
    loss = task.sums(model, batch)["loss"] / task.count(batch)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).item()
    scale = min(1.0, config.max_grad_norm / (norm + 1e-6))
    return float(loss.detach()), {name: g * scale for name, g in grads.items()}


def test_an_sft_extension_starts_from_the_export_with_fresh_moments_and_the_new_schedule(tmp_path, data):
    run = tmp_path / "run"
    first = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 3)
    assert first.exit_code == 0, first.output
    ended = _weights(run / "sft")
    shutil.copytree(run / "sft", tmp_path / "sft-3", ignore=shutil.ignore_patterns("checkpoints"))

    extended = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 4, "--resume")
    assert extended.exit_code == 0, extended.output
    line = next(text for text in extended.output.splitlines() if "extending" in text)
    assert line.startswith(f"--resume: extending sft from 3 to 4 steps, from the weights of {run / 'sft'} with fresh AdamW moments")
    rate = LR * eng.WarmupDecay(4, 1, "cosine")(3)  # the 4-step schedule (one warmup step) at step 3
    assert f"the 4-step cosine schedule from step 3: {rate:.3g}" in line
    rows = read_jsonl(run / "metrics" / "sft.jsonl")
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4]
    step4 = next(r for r in rows if r["split"] == "train" and r["step"] == 4)
    assert step4["lr"] == pytest.approx(rate, rel=1e-6)
    # it starts from the export, on step 3's batch: its loss is the export's there
    loss, grads = _step_from(tmp_path / "sft-3", run, data, 3)
    assert step4["loss"] == pytest.approx(loss, rel=1e-5)
    # fresh moments: AdamW's first step (bias-corrected, no weight decay) moves each weight by
    # -lr * g / (|g| + eps); moments carried over would give another step
    compared = 0
    for name, weights in _weights(run / "sft").items():
        expected = ended[name] - rate * grads[name] / (grads[name].abs() + 1e-8)
        torch.testing.assert_close(weights, expected, rtol=0, atol=rate * 1e-3, msg=name)
        compared += int((grads[name] != 0).sum())
    assert compared > 1000
    entry = json.loads((run / "run.json").read_text())["stages"]["sft"]
    assert entry["status"] == "finished" and entry["metrics"]["steps"] == 4 and entry["metrics"]["extended_from_step"] == 3


def test_a_finished_run_not_made_longer_changed_options_or_a_lost_export_are_refused(tmp_path, data):
    run = tmp_path / "run"
    assert invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 2).exit_code == 0
    same = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 2, "--resume")
    assert same.exit_code == 2
    assert "finished all its 2 steps; nothing to resume" in same.output and "a larger --max-steps to extend it" in same.output
    changed = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 4, "--lr", "1e-4", "--resume")
    assert changed.exit_code == 2 and "--lr was 0.001, now 0.0001" in changed.output
    assert "--max-steps" not in changed.output.split("other options")[-1]  # the length may change
    (run / "sft" / "config.json").unlink()
    lost = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 4, "--resume")
    assert lost.exit_code == 2 and f"{run / 'sft'}, where they ended, is gone" in lost.output


def test_an_interrupted_extension_resumes_and_a_finished_one_extends_again(tmp_path, data):
    run = tmp_path / "run"
    assert invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 2).exit_code == 0
    longer = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 5, "--save-every", 1, "--resume")
    assert longer.exit_code == 0, longer.output
    again = invoke("sft", *SFT, "--dataset", data, "--run-dir", run, "--max-steps", 6, "--resume")
    assert again.exit_code == 0 and "extending sft from 5 to 6 steps" in again.output
    assert [r["step"] for r in read_jsonl(run / "metrics" / "sft.jsonl") if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_a_lora_reward_model_extends_from_its_adapter(tmp_path, data):
    run = tmp_path / "run"
    args = ["rm", "--model", "tiny", "--dataset", data, "--run-dir", run, "--batch-size", "2", "--max-prompt-length", "16",
            "--max-response-length", "8", "--save-every", "0", "--eval-records", "4", "--lora-rank", "4", "--lr", "1e-2"]  # fmt: skip
    assert invoke(*args, "--max-steps", 2).exit_code == 0
    from safetensors.torch import load_file

    before = load_file(str(run / "rm" / "adapter" / "adapter_model.safetensors"))
    extended = invoke(*args, "--max-steps", 3, "--resume")
    assert extended.exit_code == 0, extended.output
    assert "extending rm from 2 to 3 steps" in extended.output
    after = load_file(str(run / "rm" / "adapter" / "adapter_model.safetensors"))
    assert before.keys() == after.keys()
    # one fresh-Adam step away from the 2-step adapter (not from a fresh one, whose B is 0)
    rate = 1e-2 * eng.WarmupDecay(3, 0, "cosine")(2)
    for name in before:
        assert float((after[name] - before[name]).abs().max()) <= rate * (1 + 1e-3), name
    assert any(float(before[name].abs().max()) > 2 * rate for name in before if "lora_B" in name)


@pytest.mark.parametrize("advantage, name", [("gae", "fixed5"), ("grpo", "grpo")])
def test_a_ppo_extension_starts_from_its_actor_and_critic(tmp_path, data, advantage, name):
    run = tmp_path / "run"
    args = ["ppo", "--preset", "cpu-tiny", "--policy", "tiny", "--reward-model", "tiny", "--dataset", data, "--run-dir", run,
            "--advantage", advantage, "--save-every", "0", "--rollout-batch-size", "2", "--mini-batch-size", "2",
            "--eval-prompts", "2", "--actor-lr", "1e-3"]  # fmt: skip
    first = invoke(*args, "--max-steps", 2)
    assert first.exit_code == 0, first.output
    extended = invoke(*args, "--max-steps", 3, "--resume")
    assert extended.exit_code == 0, extended.output
    exports = f"{run / 'ppo' / name}" + (f", {run / 'ppo' / name / 'critic'}" if advantage == "gae" else "")
    assert f"--resume: extending ppo/{name} from 2 to 3 steps, from the weights of {exports} with fresh" in extended.output
    rows = read_jsonl(run / "metrics" / f"ppo-{name}.jsonl")
    train = {r["step"]: r for r in rows if r["split"] == "train"}
    assert sorted(train) == [1, 2, 3] and [r["step"] for r in rows if r["split"] == "eval"] == [0, 2, 3]
    # the actor starts where the run ended, not at the reference: step 3's sampling policy is
    # already away from it, as step 1's is not
    assert abs(train[1]["kl_k3"]) < 1e-6 < train[3]["kl_k3"]
    metrics = json.loads((run / "run.json").read_text())["stages"][f"ppo/{name}"]["metrics"]
    assert metrics["steps"] == 3 and metrics["extended_from_step"] == 2 and "resumed_from_step" not in metrics


def test_adapter_weights_load_into_fresh_adapters(tmp_path):
    from types import SimpleNamespace

    from marlhf_cli import lora
    from marlhf_cli.models import load_reward_model

    settings = SimpleNamespace(lora_rank=4, lora_alpha=None, lora_targets="all-linear", lora_dropout=0.0)
    generator = torch.Generator().manual_seed(0)
    trained = lora.add_adapters(load_reward_model("tiny", dtype="fp32"), settings, task="score")
    with torch.no_grad():
        for param in trained.parameters():
            if param.requires_grad:
                param.copy_(torch.randn(param.shape, generator=generator))
    trained.save_pretrained(tmp_path / "adapter")
    fresh = lora.add_adapters(load_reward_model("tiny", dtype="fp32"), settings, task="score")
    lora.load_adapter_weights(fresh, tmp_path / "adapter")
    saved = dict(trained.named_parameters())
    compared = 0
    for name, param in fresh.named_parameters():
        assert torch.equal(param, saved[name]), name
        compared += param.requires_grad
    assert compared > 4  # adapters and the score head
    other = lora.add_adapters(load_reward_model("tiny", dtype="fp32"), SimpleNamespace(**{**vars(settings), "lora_targets": "q_proj"}), task="score")
    with pytest.raises(Exception, match="adapters this model lacks|size mismatch"):
        lora.load_adapter_weights(other, tmp_path / "adapter")
