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
