"""``marlhf dpo``: its losses against plain formulas, the response log-probs against a
hand-computed sum, the reference computed once (and with LoRA the base model's), and the
stage end to end on the tiny model: the held-out margin rises, SIGKILL then --resume is the
uninterrupted run, bad input is one line, and ``bon`` compares it with the SFT model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from marlhf_cli.cli import app
from marlhf_cli.train.dpo_loss import PreferenceLoss, implicit_rewards, pair_losses

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------
# the losses, against the formulas written with floats


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def reference_loss(pc, pr, rc, rr, lc, lr, beta, kind, eps, alpha) -> float:
    margin = (pc - rc) - (pr - rr)
    z = beta * margin + alpha * (lc - lr)  # R-DPO: the length difference joins the margin
    if kind == "ipo":
        return (z / beta - 1 / (2 * beta)) ** 2
    return -(1 - eps) * _log_sigmoid(z) - eps * _log_sigmoid(-z)


@settings(max_examples=80, deadline=None)
@given(
    logps=st.lists(st.tuples(*[st.floats(-80, 0)] * 4, st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=6),
    beta=st.floats(0.001, 5.0), kind=st.sampled_from(["sigmoid", "ipo"]), eps=st.floats(0.0, 0.49), alpha=st.floats(0.0, 0.5),
)  # fmt: skip
def test_every_loss_is_its_formula(logps, beta, kind, eps, alpha):
    eps = eps if kind == "sigmoid" else 0.0
    columns = [torch.tensor(c, dtype=torch.float64) for c in zip(*logps)]
    loss = PreferenceLoss(beta, kind, eps, alpha)
    got = pair_losses(*columns, loss).tolist()
    expected = [reference_loss(*row, beta, kind, eps, alpha) for row in logps]
    assert got == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert implicit_rewards(columns[0], columns[2], beta).tolist() == pytest.approx([beta * (a - c) for a, _, c, *_ in logps], rel=1e-5, abs=1e-5)


def _pair(h: float, lengths=(10, 10)) -> list[torch.Tensor]:
    """Log-probs whose log-ratio margin is h (the policy's chosen raised by h)."""
    return [torch.tensor([v], dtype=torch.float64) for v in (-20.0 + h, -30.0, -20.0, -30.0, *lengths)]


def test_the_losses_at_their_limits():
    # at the start (policy = reference) DPO's loss is log 2; IPO's is 1 / (4 beta^2)
    assert pair_losses(*_pair(0.0), PreferenceLoss(0.1)).item() == pytest.approx(math.log(2))
    assert pair_losses(*_pair(0.0), PreferenceLoss(0.1, "ipo")).item() == pytest.approx(1 / (4 * 0.01))
    # IPO is zero at the margin 1 / (2 beta) and grows on either side
    assert pair_losses(*_pair(5.0), PreferenceLoss(0.1, "ipo")).item() == pytest.approx(0.0, abs=1e-9)
    # a large beta: DPO is a hinge on the margin's sign (0 when right, beta x |h| when wrong)
    big = PreferenceLoss(1e4)
    assert pair_losses(*_pair(0.5), big).item() == pytest.approx(0.0, abs=1e-12)
    assert pair_losses(*_pair(-0.5), big).item() == pytest.approx(1e4 * 0.5, rel=1e-6)
    # alpha 0 and eps 0 are DPO exactly; with a large alpha a pair won by the longer response
    # costs nothing (its length explains it), one won by the shorter costs alpha x |d|
    plain = pair_losses(*_pair(1.3, (40, 12)), PreferenceLoss(0.1))
    assert torch.equal(pair_losses(*_pair(1.3, (40, 12)), PreferenceLoss(0.1, length_penalty=0.0, label_smoothing=0.0)), plain)
    assert pair_losses(*_pair(1.3, (12, 40)), PreferenceLoss(0.1, length_penalty=10.0)).item() == pytest.approx(10.0 * 28 - 0.13, rel=1e-6)
    assert pair_losses(*_pair(1.3, (40, 12)), PreferenceLoss(0.1, length_penalty=10.0)).item() == pytest.approx(0.0, abs=1e-9)
    # and the gradient on the policy's log-ratio is smaller for the pair won by length
    def pull(lengths):
        h = torch.tensor([1.3], dtype=torch.float64, requires_grad=True)
        logps = [-20.0 + h, *(torch.tensor([v], dtype=torch.float64) for v in (-30.0, -20.0, -30.0, *lengths))]
        pair_losses(*logps, PreferenceLoss(0.1, length_penalty=0.05)).sum().backward()
        return -float(h.grad)
    assert 0 < pull((40, 12)) < pull((12, 40))
    # label smoothing: at eps the loss is the mix of both labels' losses
    z = 0.1 * 1.3
    smoothed = pair_losses(*_pair(1.3), PreferenceLoss(0.1, label_smoothing=0.2)).item()
    assert smoothed == pytest.approx(-0.8 * _log_sigmoid(z) - 0.2 * _log_sigmoid(-z))
    for bad in (dict(beta=0.0), dict(loss_type="hinge"), dict(loss_type="ipo", label_smoothing=0.1), dict(label_smoothing=0.5)):
        with pytest.raises(ValueError):
            PreferenceLoss(**bad)


# ---------------------------------------------------------------------------------------
# the log-probs of the responses


@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_causal_lm
    from marlhf_cli.train.forward import disable_dropout

    model = load_causal_lm("tiny").eval()
    disable_dropout(model)
    return model


def _hand_sum(model, ids: list[int], start: int) -> float:
    """Sum over the response tokens ids[start:] of log softmax(logits of the token before)[token],
    from one forward over the unpadded row."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    return sum(torch.log_softmax(logits[t - 1], dim=-1)[ids[t]].item() for t in range(start, len(ids)))


@pytest.mark.parametrize("template", ["none", "auto"])
def test_response_logps_are_the_response_tokens_alone_whatever_the_padding(tiny, tokenizer, tmp_path, template):
    """Chosen and rejected of two pairs (one a chat-template conversation), right-padded by
    collate and left-padded by hand: each row's sum is the hand-computed one over its response
    and end token only (prompt and padding add nothing)."""
    from test_chat import ROWS, one_record

    from marlhf_cli.chat import ChatFormat
    from marlhf_cli.train import dpo, rm

    chat = ChatFormat(tokenizer, template)
    records = [one_record(tmp_path, ROWS["conversational"]),
               {"prompt": "\n\nHuman: Name a colour.\n\nAssistant:", "chosen": " Teal, a blue-green.", "rejected": " No."}]  # fmt: skip
    pairs, _ = rm.encode_pairs(tokenizer, records, 64, 16, chat)
    batch = dpo.collate(pairs, tokenizer.pad_token_id)
    with torch.no_grad():
        right = dpo.response_logps(tiny, batch["input_ids"], batch["attention_mask"], batch["response_mask"]).tolist()
    rows = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    starts = [p["prompt_length"] for p in pairs] * 2
    expected = [_hand_sum(tiny, row, start) for row, start in zip(rows, starts)]
    assert right == pytest.approx(expected, rel=1e-5, abs=1e-4)
    assert batch["lengths"].tolist() == [len(row) - start for row, start in zip(rows, starts)]
    longest = max(map(len, rows))  # the same rows padded on the left
    left = torch.tensor([[tokenizer.pad_token_id] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    response = torch.tensor([[0] * (longest - len(r) + s) + [1] * (len(r) - s) for r, s in zip(rows, starts)])
    with torch.no_grad():
        assert dpo.response_logps(tiny, left, mask, response).tolist() == pytest.approx(expected, rel=1e-5, abs=1e-4)


def _tiny_config(tmp_path, **flags):
    from marlhf_cli import config as config_module

    base = dict(policy="tiny", dataset="tldr", batch_size=4, max_steps=2, max_prompt_length=48, max_response_length=16,
                eval_every=0, save_every=0, lr=1e-3, dtype="fp32", lr_scheduler="constant", run_dir=str(tmp_path))  # fmt: skip
    return config_module.resolve("dpo", flags={**base, **flags})


def test_a_lora_reference_is_the_base_models_log_probs(tiny, tokenizer, tmp_path):
    """With LoRA the reference is the engine with its adapter off: after the adapters moved,
    the kept log-probs are still the base model's (one forward of the plain model), and the
    policy's (adapter on) differ."""
    pytest.importorskip("peft")
    from marlhf_cli import engine as eng, lora
    from marlhf_cli.chat import ChatFormat
    from marlhf_cli.models import load_causal_lm
    from marlhf_cli.train import common, dpo

    config = _tiny_config(tmp_path, lora_rank=4)
    common.start(config)
    records = common.load_split(config, "ppo", None, report=False).records[:6]
    task, _ = dpo.build_task(config, tokenizer, records, [], ChatFormat(tokenizer, "none"))
    model = lora.add_adapters(load_causal_lm("tiny"), config, task="causal")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    engine = eng.build_engine(dpo.ResponseLogps(model), config, lr=config.lr, batch_size=4, total_steps=2)
    dpo.attach_reference(task.train, engine, config, "tiny", own_start=False, pad_id=tokenizer.pad_token_id)
    batch = dpo.collate(task.train, tokenizer.pad_token_id)
    with torch.no_grad():
        base = dpo.response_logps(tiny, batch["input_ids"], batch["attention_mask"], batch["response_mask"])
        adapted = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], response_mask=batch["response_mask"])
    torch.testing.assert_close(batch["reference"].float(), base, rtol=1e-5, atol=1e-4)
    assert (adapted - base).abs().max() > 1e-2


# ---------------------------------------------------------------------------------------
# the stage, end to end


def _command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "marlhf_cli.cli", "dpo", "--run-dir", str(run_dir), "--policy", "tiny", "--dataset", "tldr",
            "--batch-size", "4", "--max-prompt-length", "64", "--max-response-length", "24", "--lr", "1e-3",
            "--lr-scheduler", "constant", "--eval-every", "3", "--save-every", "2", "--seed", "5", "--dtype", "fp32", *extra]  # fmt: skip


def _rows(run_dir: Path) -> list[dict]:
    from marlhf_cli.artifacts import read_jsonl

    return [{k: v for k, v in row.items() if k not in ("step_time", "time")} for row in read_jsonl(run_dir / "metrics" / "dpo.jsonl")]


@pytest.mark.slow
def test_a_few_steps_raise_the_held_out_margin_and_bon_compares_it(tmp_path):
    """8 steps on the embedded TL;DR sample: the first step's loss is log 2 (the reference is
    the policy's start), the held-out margin ends above its start (0), every TRL metric is
    logged on both splits, dpo/ is a causal LM that bon samples beside another policy."""
    from test_ppo_resume import run_here

    from marlhf_cli.models import load_causal_lm

    run_here(_command(tmp_path, "--max-steps", "8", "--eval-every", "4"))
    rows = _rows(tmp_path)
    train = [r for r in rows if r["split"] == "train"]
    held = [r for r in rows if r["split"] == "eval"]
    assert train[0]["loss"] == pytest.approx(math.log(2), abs=1e-6) and train[0]["rewards/margins"] == pytest.approx(0, abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected",
                "lengths/chosen", "lengths/rejected"):  # fmt: skip
        assert key in train[-1] and key in held[-1]
    assert held[-1]["rewards/margins"] > 0.05 and held[-1]["loss"] < math.log(2)
    entry = json.loads((tmp_path / "run.json").read_text())["stages"]["dpo"]
    assert entry["status"] == "finished" and entry["metrics"]["eval_rewards/margins"] == pytest.approx(held[-1]["rewards/margins"], rel=1e-6)
    assert entry["inputs"]["reference"] == "tiny" and entry["config"]["beta"] == 0.1
    assert load_causal_lm(str(tmp_path / "dpo")).config.vocab_size > 0
    result = CliRunner().invoke(app, ["bon", "--run-dir", str(tmp_path), "--policy", "tiny,dpo", "--reward-model", "tiny",
                                      "--n", "1", "--temperature", "0.8", "--max-records", "2", "--max-new-tokens", "8"])  # fmt: skip
    assert result.exit_code == 0, result.output[-2000:]
    compared = json.loads((tmp_path / "bon" / "policies.json").read_text())
    assert [p["name"] for p in compared["policies"]] == ["tiny", "dpo"] and "score, N=1" in result.output


@pytest.mark.slow
def test_sigkill_then_resume_is_the_uninterrupted_run(tmp_path):
    from test_ppo_resume import environment, kill_once_saved, run_here

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_here(_command(straight, "--max-steps", "6"))
    proc = subprocess.Popen(_command(killed, "--max-steps", "6"), env=environment(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    kill_once_saved(proc, killed / "dpo" / "checkpoints" / "latest")
    resumed = subprocess.run(_command(killed, "--max-steps", "6", "--resume"), env=environment(), capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert _rows(killed) == _rows(straight)
    from safetensors.torch import load_file

    a, b = load_file(straight / "dpo" / "model.safetensors"), load_file(killed / "dpo" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _pairs_file(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("flags, words", [
    (["--beta", "0"], "--beta must be > 0"),
    (["--beta", "-1"], "--beta must be > 0"),
    (["--loss-type", "sigmod"], "did you mean sigmoid?"),
    (["--loss-type", "ipo", "--label-smoothing", "0.1"], "--label-smoothing is conservative DPO's"),
    (["--reference", "OTHER"], "another tokenizer than --policy"),
    (["--lora-rank", "4", "--reference", "OTHER"], "the reference is the policy with its adapter off"),
])  # fmt: skip
def test_bad_options_are_one_line_and_train_nothing(tmp_path, flags, words):
    if "OTHER" in flags:  # a model folder whose tokenizer has one token more than the policy's
        from marlhf_cli.models import load_causal_lm, load_tokenizer

        other = load_tokenizer("tiny")
        other.add_tokens(["<an-extra-token>"])
        other.save_pretrained(tmp_path / "other")
        load_causal_lm("tiny").save_pretrained(tmp_path / "other")
        flags = [str(tmp_path / "other") if f == "OTHER" else f for f in flags]
    result = CliRunner().invoke(app, ["dpo", "--run-dir", str(tmp_path), "--policy", "tiny", "--dataset", "tldr", *flags])
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith(("precision:", "hub unreachable", "dpo: training"))]
    assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output
    assert not (tmp_path / "dpo" / "config.json").exists()


def test_bad_data_is_one_line_and_identical_pairs_are_counted(tmp_path):
    prompt = "\n\nHuman: Say something.\n\nAssistant:"
    only_chosen = _pairs_file(tmp_path, [{"prompt": prompt, "completion": " Hello."}] * 30)
    result = CliRunner().invoke(app, ["dpo", "--run-dir", str(tmp_path), "--policy", "tiny", "--dataset", only_chosen])
    assert result.exit_code == 2 and "dpo" in result.output and "preference" in result.output, result.output
    # every third pair's responses differ only after their first 4 tokens: identical once cut
    long = " It is a long answer that goes on and on"
    rows = [{"prompt": f"{prompt} {i}", "chosen": f"{long} yes {i}.", "rejected": f" No {i}." if i % 3 else f"{long} no {i}."}
            for i in range(40)]  # fmt: skip
    config = _tiny_config(tmp_path / "run", dataset=_pairs_file(tmp_path, rows), split_shares="0/0/100", max_response_length=4)
    from marlhf_cli.chat import ChatFormat
    from marlhf_cli.models import load_tokenizer
    from marlhf_cli.train import common, dpo

    tokenizer = load_tokenizer("tiny", padding_side="right")
    train = common.load_split(config, "ppo", None, report=False).records
    task, identical = dpo.build_task(config, tokenizer, train, [], ChatFormat(tokenizer, "none"))
    same = sum(1 for r in train if r["rejected"].startswith(long))
    assert identical == same > 0 and len(task.train) == len(train) - same


def test_the_command_needs_an_sft_model_first(tmp_path):
    result = CliRunner().invoke(app, ["dpo", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2 and "run 'marlhf sft" in result.output



def test_the_reference_is_computed_for_the_pairs_the_run_reads(tokenizer):
    """A run shorter than an epoch reads only its steps' pairs (loop.global_batch): those, and
    every held-out pair, get reference log-probs; from one epoch on, every training pair."""
    from types import SimpleNamespace

    from marlhf_cli.train import dpo, loop

    task = SimpleNamespace(train=[{"id": i} for i in range(20)], eval=[{"id": 100}, {"id": 101}])
    config = SimpleNamespace(batch_size=4, seed=3)
    short = dpo.used_pairs(task, config, 2)
    expected = sorted(set(loop.global_batch(20, 4, 3, 0)) | set(loop.global_batch(20, 4, 3, 1)))
    assert [p["id"] for p in short] == expected + [100, 101] and len(expected) == 8
    assert [p["id"] for p in dpo.used_pairs(task, config, 5)] == list(range(20)) + [100, 101]
