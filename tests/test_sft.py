"""``marlhf sft``: response-only loss, encoding, packing, data order, and resume after SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _toy_prefs import write_toy_preferences
from marlhf_cli import launch
from marlhf_cli.errors import UserError
from marlhf_cli.train import loop, sft
from marlhf_cli.encode import IGNORE


@pytest.fixture(scope="module")
def toy_preferences(tmp_path_factory) -> Path:
    return write_toy_preferences(tmp_path_factory.mktemp("toy") / "prefs.jsonl")


# ---------------------------------------------------------------------------------------
# encoding


def test_labels_cover_the_response_and_eos_only(tokenizer):
    example = sft.encode_example(tokenizer, "Post: hello there\nTL;DR:", " a short summary", 64, 32)
    response = tokenizer(" a short summary", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    prompt_len = len(example["input_ids"]) - len(response)
    assert example["input_ids"][prompt_len:] == response
    assert example["labels"][:prompt_len] == [IGNORE] * prompt_len
    assert example["labels"][prompt_len:] == response


def test_truncation_keeps_prompt_end_and_cuts_response_without_eos(tokenizer):
    prompt = " ".join(f"w{i}" for i in range(200)) + "\nTL;DR:"
    example = sft.encode_example(tokenizer, prompt, " one two three four five six seven", 16, 4)
    assert len(example["input_ids"]) == 16 + 4
    assert tokenizer.decode(example["input_ids"][:16]).endswith("TL;DR:")
    assert tokenizer.eos_token_id not in example["labels"]  # a cut response must not learn to stop


def test_loss_ignores_prompt_and_padding_positions(tokenizer):
    """The loss only sees response tokens: gradients at prompt/padding positions are exactly 0,
    and it equals a hand-written mean over response tokens."""
    import torch
    import torch.nn.functional as F

    examples = [
        sft.encode_example(tokenizer, "Question: why is the sky blue?\nAnswer:", " Rayleigh scattering.", 64, 16),
        sft.encode_example(tokenizer, "Q: 2+2?\nA:", " 4", 64, 16),
    ]
    batch = sft.collate(examples, tokenizer.pad_token_id)
    vocab = len(tokenizer)
    logits = torch.randn(*batch["input_ids"].shape, vocab, requires_grad=True)
    loss = sft.nll_sum(logits, batch["labels"]) / sft.target_count(batch)
    loss.backward()
    # position t predicts token t+1: a position has gradient iff token t+1 is a response token
    predicts_response = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    predicts_response[:, :-1] = batch["labels"][:, 1:] != IGNORE
    assert logits.grad[~predicts_response].abs().max() == 0
    assert (logits.grad[predicts_response].abs().sum(-1) > 0).all()

    manual = []
    for row, example in enumerate(examples):
        start = example["labels"].index(next(l for l in example["labels"] if l != IGNORE))
        for t in range(start, len(example["input_ids"])):
            manual.append(F.cross_entropy(logits[row, t - 1][None], torch.tensor([example["input_ids"][t]])))
    assert loss.item() == pytest.approx(torch.stack(manual).mean().item(), rel=1e-5)

    # what the prompt positions are labelled with changes nothing ... unless they become targets
    changed = batch["labels"].clone()
    prompt = changed == IGNORE
    assert sft.nll_sum(logits, changed).item() == pytest.approx(sft.nll_sum(logits, batch["labels"]).item())
    full_lm = torch.where(prompt & (batch["attention_mask"] == 1), batch["input_ids"], changed)
    assert sft.nll_sum(logits, full_lm).item() > sft.nll_sum(logits, batch["labels"]).item()


def test_prompt_content_does_not_enter_the_targets(tokenizer):
    """Two prompts, one response: the labels differ only in length of the ignored prefix."""
    a = sft.encode_example(tokenizer, "A long and winding prompt about cats.\nAnswer:", " yes", 64, 8)
    b = sft.encode_example(tokenizer, "Short?\nAnswer:", " yes", 64, 8)
    assert [l for l in a["labels"] if l != IGNORE] == [l for l in b["labels"] if l != IGNORE]


def test_packing_keeps_every_token_and_label(tokenizer):
    examples = [sft.encode_example(tokenizer, f"Prompt {i}:", f" response number {i}", 32, 16) for i in range(9)]
    blocks = sft.pack(examples, 20)
    assert all(len(b["input_ids"]) <= 20 for b in blocks)
    assert sum(len(b["input_ids"]) for b in blocks) == sum(len(e["input_ids"]) for e in examples)
    assert [l for b in blocks for l in b["labels"]] == [l for e in examples for l in e["labels"]]


# ---------------------------------------------------------------------------------------
# data order


def test_data_order_is_a_function_of_seed_and_step():
    first = [loop.global_batch(50, 8, seed=7, step=s) for s in range(12)]
    again = [loop.global_batch(50, 8, seed=7, step=s) for s in range(12)]
    assert first == again
    assert first != [loop.global_batch(50, 8, seed=8, step=s) for s in range(12)]
    per_epoch = loop.steps_per_epoch(50, 8)
    seen = sorted(i for batch in first[:per_epoch] for i in batch)
    assert len(set(seen)) == len(seen) == per_epoch * 8  # no repeats within an epoch


@pytest.mark.parametrize("n, batch", [(4, 8), (3, 8), (5, 7), (1, 4)])
def test_a_batch_larger_than_the_data_cycles_through_it_with_max_steps(n, batch):
    """--max-steps promised "cycling the data": with fewer examples than a batch, batches
    are consecutive slices of the epochs' permutations joined end to end (every example once
    per epoch), where it used to be an error."""
    batches = [loop.global_batch(n, batch, seed=3, step=s) for s in range(6)]
    assert all(len(b) == batch for b in batches)
    stream = [i for b in batches for i in b]
    expected = [i for epoch in range(-(-len(stream) // n)) for i in loop.epoch_order(n, 3, epoch)]
    assert stream == expected[: len(stream)]
    assert loop.total_steps(n, batch, epochs=1, max_steps=5) == 5
    with pytest.raises(UserError, match=f"only {n} training example.* for a batch of {batch}: give --max-steps"):
        loop.total_steps(n, batch, epochs=1, max_steps=None)


def test_micro_batches_split_one_global_batch_over_processes():
    indices = list(range(8))
    parts = [loop.micro_batches(indices, 2, 2, rank) for rank in (0, 1)]
    assert parts == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert sorted(i for p in parts for mb in p for i in mb) == indices


# ---------------------------------------------------------------------------------------
# the command


def _child_env() -> dict:
    env = launch.launcher_free_env()
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _sft_command(run_dir: Path, data: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "marlhf_cli.cli", "sft", "--model", "tiny", "--dataset", str(data),
        "--run-dir", str(run_dir), "--batch-size", "4", "--max-steps", "12", "--lr", "3e-3",
        "--warmup-ratio", "0.1", "--max-prompt-length", "24", "--max-response-length", "12",
        "--eval-every", "4", "--eval-records", "6", "--save-every", "2", "--seed", "5", *extra,
    ]  # fmt: skip


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow
def test_sigkill_then_resume_reaches_the_uninterrupted_result(tmp_path, toy_preferences):
    import torch
    from test_ppo_resume import run_here

    straight = tmp_path / "straight"  # in this process: saves a second interpreter start-up
    run_here(_sft_command(straight, toy_preferences))

    crashed = tmp_path / "crashed"
    child = subprocess.Popen(
        _sft_command(crashed, toy_preferences), env=_child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    latest = crashed / "sft" / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and child.poll() is None and not latest.is_file():
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (crashed / "sft" / "config.json").exists()
    assert json.loads((crashed / "run.json").read_text())["stages"]["sft"]["status"] == "running"

    resumed = subprocess.run(
        _sft_command(crashed, toy_preferences, "--resume"), env=_child_env(), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr

    a, b = _weights(straight / "sft"), _weights(crashed / "sft")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)
    rows = [json.loads(x) for x in (crashed / "metrics" / "sft.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r["split"] == "train"]
    assert steps == list(range(1, 13))  # the killed run's extra rows were dropped on resume
    straight_rows = [json.loads(x) for x in (straight / "metrics" / "sft.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rows if r["split"] == "eval"] == pytest.approx(
        [r["loss"] for r in straight_rows if r["split"] == "eval"], rel=1e-5
    )
    manifest = json.loads((crashed / "run.json").read_text())["stages"]["sft"]
    assert manifest["status"] == "finished" and manifest["metrics"]["resumed_from_step"] >= 2


def test_resume_with_changed_options_is_refused_naming_each(tmp_path, toy_preferences, monkeypatch):
    """`--resume --lr 2e-3` used to continue with the checkpoint's rate, no word said."""
    from typer.testing import CliRunner

    from marlhf_cli import checkpoints
    from marlhf_cli.cli import app

    def crash(*args, **kwargs):
        raise RuntimeError("killed before the export")  # an unfinished run: its checkpoints stay resumable

    run_dir = tmp_path / "run"
    args = ["sft", "--model", "tiny", "--dataset", str(toy_preferences), "--run-dir", str(run_dir),
            "--max-steps", "3", "--save-every", "1", "--eval-records", "0",
            "--max-prompt-length", "16", "--max-response-length", "8"]  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(checkpoints, "export_pretrained", crash)
        first = CliRunner().invoke(app, [*args, "--batch-size", "2", "--lr", "1e-3"])
    assert first.exit_code != 0 and isinstance(first.exception, RuntimeError)
    again = CliRunner().invoke(app, [*args, "--batch-size", "4", "--lr", "2e-3", "--resume"], env={"COLUMNS": "400"})
    assert again.exit_code == 2
    *before, message = again.output.strip().splitlines()  # the start-up line on the data, then the error
    assert message.startswith("error: --resume") and "without --resume" in message
    assert not any(line.startswith("error") or "Traceback" in line for line in before)
    assert "--batch-size was 2, now 4" in message and "--lr was 0.001, now 0.002" in message
    # an option no training step depends on is applied, and said
    same = CliRunner().invoke(app, [*args, "--batch-size", "2", "--lr", "1e-3", "--resume", "--eval-every", "7"])
    assert same.exit_code == 0, same.output
    assert "applying --eval-every was 100, now 7" in same.output.replace("\n", " ")
    assert "resuming from" in same.output
