"""Decoupled GAE (the critic's lambda apart from the actor's) and the length-adaptive lambda,
token and segment level, against the plain per-response loops of test_macro_advantages.

The reference: the advantages of a run of the textbook loop at the actor's lambda, the
returns of a run at the critic's, each response with its own lambda where there is one per
response. Masks are right padded (responses that ended early), left padded and any 0/1
pattern.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_macro_advantages import VALUE_FUNCTIONS, masks_and_lengths, random_tensor, reference_sample, unit_interval

from marlhf_cli.macro import adaptive_lambda, lengths_to_segment_ids, macro_advantages, num_segments, token_gae

FAST = settings(max_examples=100, deadline=None)


def reference(rewards, values, mask, lengths, gamma, lams, critic_lams, value_function):
    """(advantages, returns): row b's advantages from the loop at lams[b], its returns from
    the loop at critic_lams[b]."""
    adv, ret = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for b in range(mask.shape[0]):
        real = mask[b].bool()
        r, v = rewards[b][real].tolist(), values[b][real].tolist()
        a, _ = reference_sample(r, v, lengths[b], gamma, lams[b], value_function)
        _, q = reference_sample(r, v, lengths[b], gamma, critic_lams[b], value_function)
        adv[b][real] = torch.tensor(a, dtype=rewards.dtype)
        ret[b][real] = torch.tensor(q, dtype=rewards.dtype)
    return adv, ret


def per_row(draw, batch: int, scalar_allowed: bool = True):
    """One lambda for the batch (a float) or one per response (a float64 tensor)."""
    if scalar_allowed and draw(st.booleans()):
        return draw(unit_interval)
    return torch.tensor(draw(st.lists(unit_interval, min_size=batch, max_size=batch)), dtype=torch.float64)


def as_list(lam, batch: int) -> list[float]:
    return lam.tolist() if isinstance(lam, torch.Tensor) else [lam] * batch


@FAST
@given(data=masks_and_lengths(), gamma=unit_interval, value_function=st.sampled_from(VALUE_FUNCTIONS),
       seed=st.integers(0, 2**31 - 1), draw=st.data())  # fmt: skip
def test_segment_gae_with_two_lambdas_matches_the_reference(data, gamma, value_function, seed, draw):
    mask, lengths = data
    batch = mask.shape[0]
    lam, critic_lam = per_row(draw.draw, batch), per_row(draw.draw, batch)
    rewards, values = random_tensor(seed, mask.shape), random_tensor(seed + 1, mask.shape)
    segment_ids = lengths_to_segment_ids(lengths, mask)
    adv, ret = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function, critic_lam=critic_lam)
    ref_adv, ref_ret = reference(rewards, values, mask, lengths, gamma, as_list(lam, batch), as_list(critic_lam, batch), value_function)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)


@FAST
@given(data=masks_and_lengths(), gamma=unit_interval, seed=st.integers(0, 2**31 - 1), draw=st.data())
def test_token_gae_with_two_lambdas_matches_the_reference_and_n1_exactly(data, gamma, seed, draw):
    mask, _ = data
    batch = mask.shape[0]
    lam, critic_lam = per_row(draw.draw, batch), per_row(draw.draw, batch)
    rewards, values = random_tensor(seed, mask.shape), random_tensor(seed + 1, mask.shape)
    adv, ret = token_gae(rewards, values, mask, gamma, lam, critic_lam)
    ones = [[1] * int(row.sum()) for row in mask]
    ref_adv, ref_ret = reference(rewards, values, mask, ones, gamma, as_list(lam, batch), as_list(critic_lam, batch), "equal")
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)
    # invariant 1 with two lambdas: one token per segment is token GAE, bit for bit
    macro = macro_advantages(rewards, values, mask, torch.arange(mask.shape[1]).expand_as(mask), gamma, lam, "equal", critic_lam=critic_lam)
    assert torch.equal(macro[0], adv) and torch.equal(macro[1], ret)


@FAST
@given(data=masks_and_lengths(), gamma=unit_interval, lam=unit_interval, value_function=st.sampled_from(VALUE_FUNCTIONS),
       seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.float32, torch.float64]))  # fmt: skip
def test_a_critic_lambda_equal_to_the_actors_is_todays_gae_bit_for_bit(data, gamma, lam, value_function, seed, dtype):
    mask, lengths = data
    rewards, values = random_tensor(seed, mask.shape).to(dtype), random_tensor(seed + 1, mask.shape).to(dtype)
    segment_ids = lengths_to_segment_ids(lengths, mask)
    today = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function)
    for critic_lam in (None, lam, float(lam)):
        same = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function, critic_lam=critic_lam)
        assert torch.equal(same[0], today[0]) and torch.equal(same[1], today[1])
    tokens = token_gae(rewards, values, mask, gamma, lam)
    assert all(torch.equal(a, b) for a, b in zip(token_gae(rewards, values, mask, gamma, lam, lam), tokens))


def test_the_critics_lambda_changes_the_returns_only():
    """lambda 1 for the critic: its targets are the plain returns to go (sum of rewards from
    the segment on), the actor's advantages those of lambda 0.95."""
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    rewards, values = random_tensor(3, mask.shape), random_tensor(4, mask.shape)
    segment_ids = lengths_to_segment_ids([[2, 2, 2], [1, 2]], mask)
    adv, ret = macro_advantages(rewards, values, mask, segment_ids, 1.0, 0.95, "equal", critic_lam=1.0)
    adv_alone, ret_alone = macro_advantages(rewards, values, mask, segment_ids, 1.0, 0.95, "equal")
    assert torch.equal(adv, adv_alone) and not torch.allclose(ret, ret_alone)
    to_go = torch.where(mask.bool(), rewards, 0.0).flip(1).cumsum(1).flip(1)  # sum of the rewards from t on
    starts = torch.tensor([[0, 0, 2, 2, 4, 4, 0, 0], [0, 1, 1, 0, 0, 0, 0, 0]])  # each token's segment start
    expected = torch.where(mask.bool(), to_go.gather(1, starts), 0.0)
    torch.testing.assert_close(ret, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 600), min_size=1, max_size=8), alpha=st.floats(1e-3, 2.0))
def test_adaptive_lambda_is_the_formula_clipped(lengths, alpha):
    got = adaptive_lambda(torch.tensor(lengths), alpha)
    for value, length in zip(got.tolist(), lengths):
        expected = 0.0 if length == 0 else min(max(1.0 - 1.0 / (alpha * length), 0.0), 1.0)
        assert value == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert got.dtype == torch.float32 and bool(((got >= 0) & (got <= 1)).all())


def test_adaptive_lambda_at_vapos_setting_and_in_segments():
    """alpha 0.05: 1 - 20 / l, so 0 up to 20 steps, 0.8 at 100, 0.98 at 1000; counted in
    segments for MA-PPO (num_segments), tokens at n = 1."""
    assert adaptive_lambda(torch.tensor([10, 20, 40, 100, 1000]), 0.05).tolist() == pytest.approx([0.0, 0.0, 0.5, 0.8, 0.98])
    mask = torch.tensor([[1] * 100 + [0] * 20, [1] * 120])
    fives = lengths_to_segment_ids([[5] * 20, [5] * 24], mask)
    assert num_segments(mask, fives).tolist() == [20, 24]
    assert adaptive_lambda(num_segments(mask, fives), 0.05).tolist() == pytest.approx([0.0, 1 - 20 / 24])
    with pytest.raises(ValueError, match="alpha must be above 0"):
        adaptive_lambda(torch.tensor([3]), 0.0)


def test_lambdas_out_of_range_or_of_the_wrong_shape_are_refused():
    mask = torch.ones(2, 3, dtype=torch.long)
    x, ids = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="critic_lam must be in"):
        macro_advantages(x, x, mask, ids, 1.0, 0.9, critic_lam=1.5)
    with pytest.raises(ValueError, match="lam must be in"):
        macro_advantages(x, x, mask, ids, 1.0, torch.tensor([0.5, -0.1]))
    with pytest.raises(ValueError, match=r"per response must be \[batch\]"):
        token_gae(x, x, mask, 1.0, torch.tensor([0.5, 0.5, 0.5]))
