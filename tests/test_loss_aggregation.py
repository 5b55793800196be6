"""--loss-aggregation (docs/method.md "Loss aggregation"): ``macro.aggregate`` against plain
loops on random masks, the exact equivalences between the three, their gradients, and one
GRPO update through ``ppo_update`` against a hand-written one for each."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import LOSS_AGGREGATIONS, aggregate, kl_loss, policy_loss

FAST = settings(max_examples=150, deadline=None)


@st.composite
def losses_and_masks(draw, max_batch=5, max_time=9):
    """Per-token losses [B, T] (float64) and a mask: prefix masks (responses) or arbitrary 0/1."""
    batch, time = draw(st.integers(1, max_batch)), draw(st.integers(1, max_time))
    rows = []
    for _ in range(batch):
        if draw(st.booleans()):
            n = draw(st.integers(0, time))
            rows.append([1] * n + [0] * (time - n))
        else:
            rows.append(draw(st.lists(st.integers(0, 1), min_size=time, max_size=time)))
    seed = draw(st.integers(0, 2**31 - 1))
    values = torch.randn(batch, time, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return values, torch.tensor(rows)


def reference(values: torch.Tensor, mask: torch.Tensor, how: str, max_length: int | None = None) -> float:
    """The three definitions written as loops over responses and tokens."""
    rows = [[float(v) for v, m in zip(row, keep) if m] for row, keep in zip(values, mask)]
    if how == "token-mean":
        tokens = [v for row in rows for v in row]
        return sum(tokens) / len(tokens) if tokens else 0.0
    if how == "sequence-mean":
        means = [sum(row) / len(row) for row in rows if row]
        return sum(means) / len(means) if means else 0.0
    return sum(v for row in rows for v in row) / (len(rows) * max_length)


@FAST
@given(losses_and_masks(), st.sampled_from(LOSS_AGGREGATIONS), st.integers(1, 16))
def test_aggregate_matches_plain_loops_on_random_masks(data, how, budget):
    values, mask = data
    got = float(aggregate(values, mask, how, max_length=budget))
    assert got == pytest.approx(reference(values, mask, how, budget), rel=1e-12, abs=1e-12)


@FAST
@given(losses_and_masks(), st.sampled_from(LOSS_AGGREGATIONS))
def test_masked_positions_are_inert_values_and_gradients(data, how):
    values, mask = data
    garbage = values.clone()
    garbage[~mask.bool()] = float("nan")
    garbage.requires_grad_(True)
    loss = aggregate(garbage, mask, how, max_length=values.shape[1])
    assert float(loss.detach()) == pytest.approx(float(aggregate(values, mask, how, max_length=values.shape[1])), abs=1e-12)
    loss.backward()
    assert torch.all(garbage.grad[~mask.bool()] == 0) and torch.isfinite(garbage.grad).all()


@FAST
@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_equal_lengths_make_token_mean_and_sequence_mean_the_same(batch, length, seed):
    """With every response L tokens long, sum/(B L) = mean_i (sum_i / L): the two coincide,
    and token-sum with the budget L is the same number too."""
    time = length + 3  # padding after every response
    values = torch.randn(batch, time, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    mask = torch.zeros(batch, time, dtype=torch.long)
    mask[:, :length] = 1
    token = aggregate(values, mask, "token-mean")
    sequence = aggregate(values, mask, "sequence-mean")
    budget = aggregate(values, mask, "token-sum", max_length=length)
    assert torch.allclose(token, sequence, rtol=1e-13, atol=1e-13)
    assert torch.allclose(token, budget, rtol=1e-13, atol=1e-13)


def test_gradients_say_who_weighs_what():
    """token-mean: 1/N per token; sequence-mean: 1/(B |o_i|), short responses' tokens weigh
    more; token-sum: 1/(B L) for every token, whatever the lengths."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    grads = {}
    for how in LOSS_AGGREGATIONS:
        x = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
        aggregate(x, mask, how, max_length=8).backward()
        grads[how] = x.grad
    assert grads["token-mean"].tolist() == [[0.2] * 4, [0.2, 0, 0, 0]]
    assert grads["sequence-mean"].tolist() == [[0.125] * 4, [0.5, 0, 0, 0]]
    assert grads["token-sum"].tolist() == [[1 / 16] * 4, [1 / 16, 0, 0, 0]]


def test_hand_computed_and_errors():
    values = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0], [5.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last response has no real token
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(16 / 4)
    assert float(aggregate(values, mask, "sequence-mean")) == pytest.approx((2 + 10) / 2)  # empty row not counted
    assert float(aggregate(values, mask, "token-sum", max_length=4)) == pytest.approx(16 / 12)
    assert float(aggregate(values, torch.zeros_like(mask), "sequence-mean")) == 0.0
    with pytest.raises(ValueError, match="token-sum needs the generation budget"):
        aggregate(values, mask, "token-sum")
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        aggregate(values, mask, "mean")


@FAST
@given(losses_and_masks(), st.sampled_from(LOSS_AGGREGATIONS), st.sampled_from(["token", "macro"]))
def test_policy_and_kl_losses_aggregate_the_per_token_terms(data, how, ratio):
    """policy_loss = aggregate(max(-A r, -A clip(r))) and kl_loss = aggregate(k3), token-mean
    being what both computed before the option existed."""
    logp, mask = data
    generator = torch.Generator().manual_seed(1)
    old = logp + 0.3 * torch.randn(logp.shape, generator=generator, dtype=torch.float64)
    ref = logp + 0.2 * torch.randn(logp.shape, generator=generator, dtype=torch.float64)
    advantages = torch.randn(logp.shape, generator=generator, dtype=torch.float64)
    segments = torch.arange(logp.shape[1]).expand_as(logp)  # one token per segment: macro = token
    budget = logp.shape[1] + 2
    loss, _ = policy_loss(logp, old, advantages, mask, clip=0.2, ratio=ratio, segment_ids=segments,
                          aggregation=how, max_length=budget)  # fmt: skip
    r = torch.exp(logp - old)
    per_token = torch.maximum(-advantages * r, -advantages * r.clamp(0.8, 1.2))
    assert float(loss) == pytest.approx(reference(per_token, mask, how, budget), rel=1e-9, abs=1e-12)
    d = ref - logp
    k3 = torch.exp(d) - d - 1
    assert float(kl_loss(logp, ref, mask, how, budget)) == pytest.approx(reference(k3, mask, how, budget), rel=1e-9, abs=1e-12)
    if how == "token-mean":
        assert torch.equal(loss, policy_loss(logp, old, advantages, mask, clip=0.2, ratio=ratio, segment_ids=segments)[0])


# ---------------------------------------------------------------------------------------
# one GRPO update with each aggregation, against a hand-written step (tiny model, no DeepSpeed)


@pytest.mark.parametrize("how", LOSS_AGGREGATIONS)
def test_grpo_update_aggregates_as_asked(how):
    pytest.importorskip("gguf")
    from test_critic_free import RowScore, _rollout
    from test_ppo_unit import SGDEngine

    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.update import UpdateSettings, ppo_update

    models = {"tokenizer": load_tokenizer("tiny", padding_side="left"), "actor": load_causal_lm("tiny"),
              "reference": load_causal_lm("tiny")}  # fmt: skip
    beta, clip, lr, temperature, budget = 0.3, 0.2, 0.5, 0.9, 8
    exp, _ = _rollout(models, RowScore([1, 0, 2, 2, 0, 3]), kl_coef=0.0)
    # the random-init model never stops early: cut the responses to different lengths, so
    # that the three aggregations differ
    lengths = torch.tensor([8, 3, 5, 8, 1, 6])
    exp.mask = (torch.arange(exp.mask.shape[1])[None, :] < lengths[:, None]).long()
    exp.attention_mask[:, exp.prompt_length :] = exp.mask
    for name in ("old_logp", "ref_logp"):
        setattr(exp, name, getattr(exp, name) * exp.mask)
    exp.old_logp = exp.old_logp + 0.3 * torch.randn_like(exp.old_logp) * exp.mask
    credit.assign_group_credit(exp, "grpo", 2)
    actor = copy.deepcopy(models["actor"])
    by_hand = copy.deepcopy(actor)
    stats = ppo_update(
        SGDEngine(actor, lr), None, exp,
        UpdateSettings(epochs=1, mini_batch_size=6, micro_batch_size=6, clip_range=clip, temperature=temperature,
                       kl_loss_coef=beta, loss_aggregation=how, max_new_tokens=budget),
    )  # fmt: skip

    plen, seq, att = exp.prompt_length, exp.sequences, exp.attention_mask
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = by_hand(input_ids=seq, attention_mask=att, position_ids=pos).logits[:, plen - 1 : -1] / temperature
    logp = torch.log_softmax(logits.float(), -1).gather(-1, seq[:, plen:, None])[..., 0]
    surrogate_terms, kl_terms = [], []  # per response: the list of its tokens' terms
    for row in range(6):
        n = int(lengths[row])
        a = exp.advantages[row, :n]
        ratio = torch.exp(logp[row, :n] - exp.old_logp[row, :n])
        surrogate_terms.append(torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)))
        d = exp.ref_logp[row, :n] - logp[row, :n]
        kl_terms.append(torch.exp(d) - d - 1)

    def combine(terms):
        if how == "token-mean":
            return torch.cat(terms).mean()
        if how == "sequence-mean":
            return torch.stack([t.mean() for t in terms]).mean()
        return torch.cat(terms).sum() / (6 * budget)

    surrogate, k3 = combine(surrogate_terms), combine(kl_terms)
    (surrogate + beta * k3).backward()
    with torch.no_grad():
        for p in by_hand.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    assert stats["policy_loss"] == pytest.approx(float(surrogate), abs=1e-5)
    assert stats["kl_loss"] == pytest.approx(float(k3), abs=1e-6)
    for mine, theirs in zip(actor.parameters(), by_hand.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-6)


def test_run_name_and_start_up_line_say_the_aggregation(tmp_path):
    from marlhf_cli import config as config_module
    from marlhf_cli.train.ppo import settings

    def resolved(**flags):
        return config_module.resolve("ppo", flags={"run_dir": str(tmp_path), **flags})

    assert settings.run_name(resolved(advantage="grpo")) == "grpo"
    assert settings.run_name(resolved(advantage="grpo", loss_aggregation="sequence-mean")) == "grpo-sequence-mean"
    assert settings.run_name(resolved(advantage="rloo", loss_aggregation="token-sum", samples_per_prompt=8)) == "rloo-token-sum-k8"
    assert settings.run_name(resolved(loss_aggregation="token-sum")) == "fixed5-token-sum"
    config = resolved(advantage="grpo", loss_aggregation="token-sum")
    assert "token-sum loss" in settings.plan_run(config).describe(config)
    default = resolved()
    assert "loss" not in settings.plan_run(default).describe(default)
