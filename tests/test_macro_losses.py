"""PPO losses (docs/method.md "Losses"): hand computations, the macro ratio, and invariant 1 for losses."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import (
    lengths_to_segment_ids,
    macro_advantages,
    masked_mean,
    policy_loss,
    token_gae,
    value_loss,
)

FAST = settings(max_examples=100, deadline=None)


@st.composite
def batches(draw, max_batch=4, max_time=10):
    batch = draw(st.integers(1, max_batch))
    time = draw(st.integers(1, max_time))
    rows = []
    for _ in range(batch):
        if draw(st.booleans()):
            n = draw(st.integers(0, time))
            rows.append([1] * n + [0] * (time - n))
        else:
            rows.append(draw(st.lists(st.integers(0, 1), min_size=time, max_size=time)))
    return torch.tensor(rows), draw(st.integers(0, 2**31 - 1))


def randn(seed, shape, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


# ---------------------------------------------------------------------------------------
# masked_mean


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(x, mask).item() == pytest.approx(13 / 4)
    assert masked_mean(x, mask, dim=1).tolist() == pytest.approx([1.5, 5.0])
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0


def test_masked_mean_gradient_is_zero_at_masked_positions():
    x = torch.tensor([1.0, float("nan"), 3.0], requires_grad=True)
    masked_mean(x, torch.tensor([1, 0, 1])).backward()
    assert x.grad.tolist() == [0.5, 0.0, 0.5]


# ---------------------------------------------------------------------------------------
# policy loss, token ratio


def test_policy_loss_hand_computed():
    logp = torch.tensor([[math.log(1.5), math.log(0.5), math.log(1.1), 0.0]])
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 2.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = policy_loss(logp, old, adv, mask, clip=0.2)
    # token 0: ratio 1.5, A=1: max(-1.5, -1.2) = -1.2 (clipped)
    # token 1: ratio 0.5, A=2: max(-1.0, -1.6) = -1.0 (unclipped)
    # token 2: ratio 1.1, A=-1: max(1.1, 1.1) = 1.1 (inside the range)
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 1.1) / 3)
    assert stats["clip_fraction"].item() == pytest.approx(1 / 3)
    k3 = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.1)]
    assert stats["approx_kl"].item() == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert not stats["clip_fraction"].requires_grad


def test_policy_loss_gradient_and_masked_garbage():
    logp = torch.tensor([[-1.0, -2.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, float("nan")]])
    adv = torch.tensor([[1.0, -1.0, float("inf")]])
    mask = torch.tensor([[1, 1, 0]])
    loss, _ = policy_loss(logp, old, adv, mask)
    loss.backward()
    assert math.isfinite(loss.item())
    # d/dlogp of -A * ratio at ratio 1, averaged over 2 tokens
    assert logp.grad[0].tolist() == pytest.approx([-0.5, 0.5, 0.0])


# ---------------------------------------------------------------------------------------
# policy loss, macro ratio


def test_macro_ratio_hand_computed():
    # one segment of two tokens with log-ratios 0.1 and 0.2 -> ratio e^0.3 ~ 1.35 -> clipped
    # at 1.2 for A = 1; a second segment of one token with ratio e^-0.5, A = 2 (unclipped:
    # -2 * 0.607 > -2 * 0.8). Each segment's objective weighs by its length.
    logp = torch.tensor([[0.1, 0.2, -0.5]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, 1.0, 2.0]])
    mask = torch.ones(1, 3)
    ids = torch.tensor([[0, 0, 1]])
    loss, stats = policy_loss(logp, old, adv, mask, clip=0.2, ratio="macro", segment_ids=ids)
    expected = (2 * -1.2 + 1 * -2.0 * math.exp(-0.5)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)
    # the token ratio would not have clipped token 0 (e^0.1 < 1.2)
    token_loss, _ = policy_loss(logp, old, adv, mask, clip=0.2)
    assert token_loss.item() != pytest.approx(expected)


def test_macro_ratio_gradient_reaches_every_token_of_the_segment():
    logp = torch.tensor([[0.01, 0.02, 0.03]], requires_grad=True)
    ids = torch.tensor([[0, 0, 0]])
    loss, _ = policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), ratio="macro", segment_ids=ids)
    loss.backward()
    # loss = -exp(sum logp) (all three tokens carry it, mean over 3) -> d/dlogp_t = -exp(0.06)
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.06)] * 3)


def test_macro_ratio_needs_segment_ids_and_valid_mode():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="segment_ids"):
        policy_loss(x, x, x, torch.ones(1, 2), ratio="macro")
    with pytest.raises(ValueError, match="ratio mode"):
        policy_loss(x, x, x, torch.ones(1, 2), ratio="sequence")


# ---------------------------------------------------------------------------------------
# Invariant 1 for the losses: n = 1 is token PPO exactly


@FAST
@given(
    data=batches(),
    gamma=st.floats(0, 1),
    lam=st.floats(0, 1),
    value_function=st.sampled_from(["equal", "unit", "position", "first"]),
    clip=st.sampled_from([0.1, 0.2, 0.5]),
)
def test_n1_losses_equal_token_ppo_exactly(data, gamma, lam, value_function, clip):
    mask, seed = data
    rewards, values = randn(seed, mask.shape), randn(seed + 1, mask.shape)
    old_logp = randn(seed + 2, mask.shape) - 2
    logp_init = old_logp + randn(seed + 3, mask.shape, scale=0.3)
    ones = lengths_to_segment_ids([[1] * int(row.sum()) for row in mask], mask)

    macro_adv, macro_ret = macro_advantages(rewards, values, mask, ones, gamma, lam, value_function)
    token_adv, token_ret = token_gae(rewards, values, mask, gamma, lam)

    results = []
    for adv, ratio in ((token_adv, "token"), (macro_adv, "token"), (macro_adv, "macro")):
        logp = logp_init.clone().requires_grad_(True)
        loss, stats = policy_loss(logp, old_logp, adv, mask, clip=clip, ratio=ratio, segment_ids=ones)
        loss.backward()
        results.append((loss.detach(), logp.grad, stats["clip_fraction"], stats["approx_kl"]))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)

    new_values = values + randn(seed + 4, mask.shape, scale=0.5)
    token_vloss, token_vstats = value_loss(new_values, values, token_ret, mask, clip)
    macro_vloss, macro_vstats = value_loss(new_values, values, macro_ret, mask, clip)
    assert torch.equal(token_vloss, macro_vloss)
    assert torch.equal(token_vstats["clip_fraction"], macro_vstats["clip_fraction"])


@FAST
@given(data=batches(), seed=st.integers(0, 1000))
def test_macro_ratio_with_one_token_segments_is_token_ratio(data, seed):
    mask, _ = data
    logp, old, adv = randn(seed, mask.shape), randn(seed + 1, mask.shape), randn(seed + 2, mask.shape)
    ones = lengths_to_segment_ids([[1] * int(row.sum()) for row in mask], mask)
    token = policy_loss(logp, old, adv, mask)
    macro = policy_loss(logp, old, adv, mask, ratio="macro", segment_ids=ones)
    assert torch.equal(token[0], macro[0])
    assert torch.equal(token[1]["clip_fraction"], macro[1]["clip_fraction"])


# ---------------------------------------------------------------------------------------
# value loss


def test_value_loss_hand_computed():
    values = torch.tensor([[1.5, 0.1, 0.6, 7.0]])
    old = torch.tensor([[1.0, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, clip=0.2)
    # token 0: clipped value 1.2: max((1.5-2)^2, (1.2-2)^2) = max(0.25, 0.64) = 0.64
    # token 1: clipped value 0.3: max(0.01, 0.09) = 0.09
    # token 2: within the clip range: 0.36 both ways
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.09 + 0.36) / 3)
    assert stats["clip_fraction"].item() == pytest.approx(2 / 3)


def test_value_loss_clipping_takes_the_pessimistic_branch():
    # moving away from the target beyond the clip range: the clipped error is smaller,
    # so the unclipped one is used and the gradient is not cut
    values = torch.tensor([[3.0]], requires_grad=True)
    loss, stats = value_loss(values, torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), clip=0.2)
    assert loss.item() == pytest.approx(0.5 * 9.0)
    loss.backward()
    assert values.grad.item() == pytest.approx(3.0)
    assert stats["clip_fraction"].item() == 0.0
    # moving towards the target beyond the clip range: the clipped error is larger, so the
    # clipped branch is used and the gradient vanishes
    values = torch.tensor([[0.2]], requires_grad=True)
    loss, stats = value_loss(values, torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.ones(1, 1), clip=0.2)
    assert loss.item() == pytest.approx(0.5 * 0.64)
    loss.backward()
    assert values.grad.item() == 0.0
    assert stats["clip_fraction"].item() == 1.0


def test_value_loss_masked_garbage_is_inert():
    values = torch.tensor([[0.5, float("nan")]], requires_grad=True)
    old = torch.tensor([[0.4, float("inf")]])
    returns = torch.tensor([[1.0, float("nan")]])
    loss, _ = value_loss(values, old, returns, torch.tensor([[1, 0]]))
    loss.backward()
    assert loss.item() == pytest.approx(0.5 * 0.25)
    assert values.grad[0, 1].item() == 0.0


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        value_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
