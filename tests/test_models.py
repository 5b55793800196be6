from pathlib import Path

import pytest
import torch

from marlhf_cli import models
from marlhf_cli.errors import UserError


def test_tiny_alias_builds_a_small_causal_lm_deterministically(tokenizer):
    first = models.load_causal_lm("tiny")
    second = models.load_causal_lm("tiny")
    assert first.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in first.parameters()) < 5_000_000
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)
    ids = tokenizer("hello world", return_tensors="pt")
    assert first(**ids).logits.shape == (1, ids["input_ids"].shape[1], len(tokenizer))


def test_tiny_does_not_move_the_callers_random_stream():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    models.load_causal_lm("tiny")
    assert torch.equal(torch.rand(3), expected)


def test_tiny_reward_model_has_a_scalar_head(tokenizer):
    model = models.load_reward_model("tiny")
    batch = tokenizer(["a b c", "d"], return_tensors="pt", padding=True)
    assert model(**batch).logits.shape == (2, 1)


def test_tokenizer_is_fast_with_pad_and_offsets(tokenizer):
    assert tokenizer.is_fast and tokenizer.pad_token is not None
    enc = tokenizer("don't (stop)", return_offsets_mapping=True)
    assert enc["offset_mapping"][-1][1] == len("don't (stop)")
    left = models.load_tokenizer("tiny", padding_side="left")
    assert left.padding_side == "left" and tokenizer.padding_side == "right"


def test_tokenizer_copies_pad_on_their_own_side_and_keep_their_own_tokens():
    """load_tokenizer's copies are independent of each other and of its cache: each pads on its
    own side, interleaved; a special token set, or a token added, on one stays on it."""
    left, right = models.load_tokenizer("tiny", padding_side="left"), models.load_tokenizer("tiny")
    texts = ["a", "a longer text here"]
    for _ in range(2):
        ids_left = left(texts, padding=True)["input_ids"][0]
        ids_right = right(texts, padding=True)["input_ids"][0]
        assert ids_left[0] == left.pad_token_id != ids_left[-1] and ids_right[-1] == right.pad_token_id != ids_right[0]
    eos = right.eos_token
    left.pad_token = "<|im_start|>"
    assert right.pad_token == models.load_tokenizer("tiny").pad_token == eos != left.pad_token
    size = len(right)
    left.add_tokens(["<only-in-this-copy>"])
    assert len(left) == size + 1 and len(right) == len(models.load_tokenizer("tiny")) == size
    assert models.load_causal_lm("tiny").config.vocab_size == size


@pytest.mark.slow
def test_smollm2_alias_loads_real_weights_offline(tokenizer):
    model = models.load_causal_lm("smollm2-135m")
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    ids = tokenizer("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def test_unknown_model_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot load model"):
        models.load_causal_lm(str(tmp_path / "missing-model"))
    with pytest.raises(UserError, match="cannot load tokenizer"):
        models.load_tokenizer(str(tmp_path / "missing-tok"))


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_hub_fails_at_once_and_in_one_line(tmp_path):
    """Online mode with a hub that refuses connections: huggingface_hub alone retries for
    about 30 s per file, waiting between attempts; the reachability probe makes it one line
    with no wait at all."""
    import json
    import os
    import subprocess
    import sys

    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    script = (
        "import json, time\n"
        "from marlhf_cli import models\n"
        "from marlhf_cli.errors import UserError\n"
        # huggingface_hub's retry loop waits between its attempts with time.sleep: count what
        # it asks for (a bound on the clock failed on a loaded machine; this is the same on any)
        "asked = [0.0]\n"
        "sleep = time.sleep\n"
        "def counted(seconds):\n"
        "    asked[0] += seconds\n"
        "    sleep(seconds)\n"
        "time.sleep = counted\n"
        "out = {}\n"
        "for what, load in (('tokenizer', models.load_tokenizer), ('model', models.load_causal_lm),\n"
        "                   ('reward', models.load_reward_model)):\n"
        "    asked[0] = 0.0\n"
        "    try:\n"
        "        load('marlhf-tests/no-such-model')\n"
        "        out[what] = ['loaded', 0]\n"
        "    except UserError as err:\n"
        "        out[what] = [str(err), asked[0]]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for what, (message, waited) in results.items():
        # the probe's verdict is what stopped it: no retry loop, which waits between attempts
        assert f"cannot connect to 127.0.0.1:{port}" in message, (what, message)
        assert "\n" not in message and waited == 0, (what, waited)

    cli = subprocess.run(
        [sys.executable, "-c", "from marlhf_cli.cli import main; main()", "segment", "-", "--rule", "ppl",
         "--model", "marlhf-tests/no-such-model"],
        input="one two three four five six", env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 2
    assert cli.stderr.strip().count("\n") == 0 and f"127.0.0.1:{port}" in cli.stderr, cli.stderr


@pytest.mark.parametrize(
    "shape, params",
    # parameter counts of the released SmolLM2 models (tied embeddings)
    [("smollm2-135m", 134_515_008), ("smollm2-360m", 361_821_120), ("smollm2-1.7b", 1_711_376_384)],
)
def test_random_shapes_are_smollm2s_configs(tokenizer, shape, params):
    from transformers import LlamaForCausalLM

    arch = models.random_arch(f"random:{shape}")
    config = models.tiny_config(tokenizer, **arch)
    assert config.vocab_size == 49152 and config.tie_word_embeddings
    assert config.hidden_size // config.num_attention_heads == 64  # SmolLM2's head size
    with torch.device("meta"):  # the shapes without the memory
        model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == params


def test_random_model_loads_with_smollm2s_tokenizer_and_a_matching_reward_backbone(tokenizer):
    name = "random:smollm2-135m"
    assert models.load_tokenizer(name).get_vocab() == tokenizer.get_vocab()
    policy = models.load_causal_lm(name, dtype="bf16")
    reward = models.load_reward_model(name, dtype="bf16")
    assert policy.config.num_hidden_layers == 30 and policy.config.num_key_value_heads == 3
    assert policy.dtype == torch.bfloat16
    # the same seed: the reward model's backbone is the policy's, as for 'tiny'
    assert torch.equal(policy.model.layers[0].mlp.up_proj.weight, reward.model.layers[0].mlp.up_proj.weight)
    ids = tokenizer("hello world", return_tensors="pt")
    assert policy(**ids).logits.shape == (1, ids["input_ids"].shape[1], 49152)


def test_unknown_random_shape_is_a_one_line_user_error():
    with pytest.raises(UserError, match="unknown random-init shape 'smollm2-7b'.*random:smollm2-360m"):
        models.load_causal_lm("random:smollm2-7b")
    assert models.random_arch("tiny") == models.TINY_ARCH
    assert models.random_arch("google/gemma-2b") is None


def test_a_prompt_and_response_longer_than_the_model_reads_are_one_line_before_any_weight_loads(tmp_path, monkeypatch):
    """tiny reads 2,048 positions: asking for more is exit 2, one line, before a model loads
    (a user's 100,000-token prompts once ran for minutes at 6.6 GB before anything said so)."""
    from typer.testing import CliRunner

    from marlhf_cli import models
    from marlhf_cli.cli import app

    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.setattr(models, "load_score_model", lambda *a, **k: pytest.fail("a model loaded"))
    runner = CliRunner()
    for args, needle in (
        (["rm", "--model", "tiny", "--max-prompt-length", "100000"], "--max-prompt-length 100,000 + --max-response-length 512 = 100,512 tokens, beyond the 2,048 positions 'tiny' can read"),
        (["sft", "--model", "tiny", "--max-response-length", "1600", "--max-prompt-length", "512"], "= 2,112 tokens, beyond the 2,048 positions"),
        (["ppo", "--policy", "tiny", "--reward-model", "tiny", "--max-new-tokens", "3000"], "--max-new-tokens 3,000 = 3,512 tokens, beyond the 2,048 positions"),
    ):  # fmt: skip
        result = runner.invoke(app, [*args, "--run-dir", str(tmp_path)])
        assert result.exit_code == 2 and needle in " ".join(result.output.split()), result.output
    assert models.positions("random:smollm2-135m") == 8192 and models.positions("tiny") == 2048
