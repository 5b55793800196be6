"""Segment-level GAE (docs/method.md "Segment GAE") against plain reference loops, and the invariants of docs/method.md.

The reference implementations here are written with Python lists and the textbook
definitions (A_k = sum_l (gamma lam)^l delta_{k+l}), independently of the vectorised code.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import (
    discounted_reverse_cumsum,
    lengths_to_segment_ids,
    macro_advantages,
    num_segments,
    segment_sums,
    segment_weights,
    token_gae,
)

VALUE_FUNCTIONS = ["equal", "unit", "position", "first"]
FAST = settings(max_examples=100, deadline=None)

# ---------------------------------------------------------------------------------------
# Plain reference loops (one sample, real tokens only)


def reference_sigma(length: int, value_function: str) -> list[float]:
    if value_function == "equal":
        return [1.0 / length] * length
    if value_function == "unit":
        return [0.0] * (length - 1) + [1.0]
    if value_function == "first":
        return [1.0] + [0.0] * (length - 1)
    harmonic = sum(1.0 / (length - i) for i in range(length))
    return [(1.0 / (length - i)) / harmonic for i in range(length)]


def reference_sample(rewards, values, lengths, gamma, lam, value_function):
    """Per-token (advantages, returns) of one sample by the definitions of docs/method.md "Segment GAE"."""
    segments, start = [], 0
    for length in lengths:
        segments.append(list(range(start, start + length)))
        start += length
    seg_values = [
        sum(s * values[t] for s, t in zip(reference_sigma(len(seg), value_function), seg))
        for seg in segments
    ]
    seg_rewards = [sum(rewards[t] for t in seg) for seg in segments]
    count = len(segments)
    deltas = [
        seg_rewards[k] + gamma * (seg_values[k + 1] if k + 1 < count else 0.0) - seg_values[k]
        for k in range(count)
    ]
    advantages = [
        sum((gamma * lam) ** l * deltas[k + l] for l in range(count - k)) for k in range(count)
    ]
    token_adv, token_ret = [], []
    for k, seg in enumerate(segments):
        token_adv += [advantages[k]] * len(seg)
        token_ret += [advantages[k] + seg_values[k]] * len(seg)
    return token_adv, token_ret


def reference_batch(rewards, values, mask, lengths_per_sample, gamma, lam, value_function):
    adv = torch.zeros_like(rewards)
    ret = torch.zeros_like(rewards)
    for b in range(mask.shape[0]):
        real = mask[b].bool()
        a, r = reference_sample(
            rewards[b][real].tolist(), values[b][real].tolist(), lengths_per_sample[b], gamma, lam, value_function
        )
        adv[b][real] = torch.tensor(a, dtype=rewards.dtype)
        ret[b][real] = torch.tensor(r, dtype=rewards.dtype)
    return adv, ret


# ---------------------------------------------------------------------------------------
# Strategies


@st.composite
def masks_and_lengths(draw, max_batch: int = 4, max_time: int = 12):
    """A [B, T] mask (right padded, left padded or any 0/1 pattern per row) and a random
    partition of each row's real length into segments."""
    batch = draw(st.integers(1, max_batch))
    time = draw(st.integers(1, max_time))
    rows, lengths = [], []
    for _ in range(batch):
        kind = draw(st.sampled_from(["right", "left", "any"]))
        if kind == "any":
            row = draw(st.lists(st.integers(0, 1), min_size=time, max_size=time))
        else:
            n = draw(st.integers(0, time))
            row = [1] * n + [0] * (time - n) if kind == "right" else [0] * (time - n) + [1] * n
        rows.append(row)
        count = sum(row)
        cuts = draw(st.lists(st.booleans(), min_size=max(count - 1, 0), max_size=max(count - 1, 0)))
        sample, current = [], 1 if count else 0
        for cut in cuts:
            if cut:
                sample.append(current)
                current = 1
            else:
                current += 1
        if count:
            sample.append(current)
        lengths.append(sample)
    return torch.tensor(rows, dtype=torch.long), lengths


unit_interval = st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0))


def random_tensor(seed: int, shape, scale: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale


# ---------------------------------------------------------------------------------------
# Invariant 2: the vectorised segment GAE equals the per-sample reference loop


@FAST
@given(
    data=masks_and_lengths(),
    gamma=unit_interval,
    lam=unit_interval,
    value_function=st.sampled_from(VALUE_FUNCTIONS),
    seed=st.integers(0, 2**31 - 1),
)
def test_macro_advantages_match_reference_loop(data, gamma, lam, value_function, seed):
    mask, lengths = data
    rewards = random_tensor(seed, mask.shape)
    values = random_tensor(seed + 1, mask.shape)
    segment_ids = lengths_to_segment_ids(lengths, mask)

    adv, ret = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function)
    ref_adv, ref_ret = reference_batch(rewards, values, mask, lengths, gamma, lam, value_function)

    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 140),
    n=st.integers(1, 9),
    gamma=unit_interval,
    lam=unit_interval,
    value_function=st.sampled_from(VALUE_FUNCTIONS),
    seed=st.integers(0, 2**31 - 1),
)
def test_long_responses_match_reference_loop(length, n, gamma, lam, value_function, seed):
    """Long enough for many doubling steps of the scan."""
    time = length + 3
    mask = torch.tensor([[1] * length + [0] * 3])
    lengths = [[n] * (length // n) + ([length % n] if length % n else [])]
    rewards, values = random_tensor(seed, mask.shape), random_tensor(seed + 7, mask.shape)
    segment_ids = lengths_to_segment_ids(lengths, mask)
    adv, ret = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function)
    ref_adv, ref_ret = reference_batch(rewards, values, mask, lengths, gamma, lam, value_function)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)
    assert adv.shape == (1, time)


@FAST
@given(data=masks_and_lengths(), gamma=unit_interval, lam=unit_interval, seed=st.integers(0, 2**31 - 1))
def test_token_gae_matches_reference_loop(data, gamma, lam, seed):
    mask, _ = data
    rewards, values = random_tensor(seed, mask.shape), random_tensor(seed + 1, mask.shape)
    adv, ret = token_gae(rewards, values, mask, gamma, lam)
    ones = [[1] * int(row.sum()) for row in mask]
    ref_adv, ref_ret = reference_batch(rewards, values, mask, ones, gamma, lam, "equal")
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------
# Invariant 1: fixed n=1 is token-level GAE, exactly


@FAST
@given(
    data=masks_and_lengths(),
    gamma=unit_interval,
    lam=unit_interval,
    value_function=st.sampled_from(VALUE_FUNCTIONS),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_n1_equals_token_gae_exactly(data, gamma, lam, value_function, seed, dtype):
    mask, _ = data
    rewards = random_tensor(seed, mask.shape).to(dtype)
    values = random_tensor(seed + 1, mask.shape).to(dtype)
    ones = lengths_to_segment_ids([[1] * int(row.sum()) for row in mask], mask)
    adv, ret = macro_advantages(rewards, values, mask, ones, gamma, lam, value_function)
    token_adv, token_ret = token_gae(rewards, values, mask, gamma, lam)
    assert torch.equal(adv, token_adv)
    assert torch.equal(ret, token_ret)


# ---------------------------------------------------------------------------------------
# Invariant 3: masked positions are inert


@FAST
@given(
    data=masks_and_lengths(),
    gamma=unit_interval,
    lam=unit_interval,
    value_function=st.sampled_from(VALUE_FUNCTIONS),
    seed=st.integers(0, 2**31 - 1),
    garbage=st.sampled_from([float("nan"), float("inf"), -1e30, 3.0]),
)
def test_masked_positions_change_nothing(data, gamma, lam, value_function, seed, garbage):
    mask, lengths = data
    rewards, values = random_tensor(seed, mask.shape), random_tensor(seed + 1, mask.shape)
    segment_ids = lengths_to_segment_ids(lengths, mask)
    adv, ret = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function)
    token_adv, token_ret = token_gae(rewards, values, mask, gamma, lam)

    padding = ~mask.bool()
    noisy_rewards = torch.where(padding, torch.full_like(rewards, garbage), rewards)
    noisy_values = torch.where(padding, random_tensor(seed + 2, mask.shape) * 1e3, values)
    noisy_ids = torch.where(padding, torch.randint(0, 50, mask.shape, generator=torch.Generator().manual_seed(seed)), segment_ids)
    adv2, ret2 = macro_advantages(noisy_rewards, noisy_values, mask, noisy_ids, gamma, lam, value_function)
    token_adv2, token_ret2 = token_gae(noisy_rewards, noisy_values, mask, gamma, lam)

    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert torch.equal(token_adv, token_adv2) and torch.equal(token_ret, token_ret2)
    assert not adv[padding].any() and not ret[padding].any()


# ---------------------------------------------------------------------------------------
# Invariant 5: per-sample independence (batch neighbours, padding amount, padding side)


@FAST
@given(
    data=masks_and_lengths(),
    gamma=unit_interval,
    lam=unit_interval,
    value_function=st.sampled_from(VALUE_FUNCTIONS),
    seed=st.integers(0, 2**31 - 1),
    extra=st.integers(0, 9),
)
def test_sample_does_not_depend_on_batch_or_padding(data, gamma, lam, value_function, seed, extra):
    mask, lengths = data
    rewards, values = random_tensor(seed, mask.shape), random_tensor(seed + 1, mask.shape)
    segment_ids = lengths_to_segment_ids(lengths, mask)
    adv, ret = macro_advantages(rewards, values, mask, segment_ids, gamma, lam, value_function)

    for b in range(mask.shape[0]):
        real = mask[b].bool()
        count = int(real.sum())
        # the same sample alone, packed to the left, with `extra` more padding
        alone_mask = torch.tensor([[1] * count + [0] * (mask.shape[1] - count + extra)])
        alone_r = torch.zeros(alone_mask.shape, dtype=torch.float64)
        alone_v = torch.zeros(alone_mask.shape, dtype=torch.float64)
        alone_r[0, :count] = rewards[b][real]
        alone_v[0, :count] = values[b][real]
        alone_ids = lengths_to_segment_ids([lengths[b]], alone_mask)
        a_adv, a_ret = macro_advantages(alone_r, alone_v, alone_mask, alone_ids, gamma, lam, value_function)
        torch.testing.assert_close(a_adv[0, :count], adv[b][real], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a_ret[0, :count], ret[b][real], rtol=1e-12, atol=1e-12)
        assert not a_adv[0, count:].any()


# ---------------------------------------------------------------------------------------
# Explicit small cases


def test_hand_computed_two_segments():
    # segments [0,1] and [2]; gamma 0.9, lam 0.5; equal weights
    rewards = torch.tensor([[0.1, 0.2, 1.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.3, 0.8, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    ids = torch.tensor([[0, 0, 1, 0]])
    adv, ret = macro_advantages(rewards, values, mask, ids, gamma=0.9, lam=0.5)
    v1, v2 = 0.4, 0.8
    r1, r2 = 0.30000000000000004, 1.0  # summed, not averaged
    d2 = r2 - v2
    d1 = r1 + 0.9 * v2 - v1
    a2, a1 = d2, d1 + 0.45 * d2
    expected_adv = torch.tensor([[a1, a1, a2, 0.0]], dtype=torch.float64)
    expected_ret = torch.tensor([[a1 + v1, a1 + v1, a2 + v2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected_adv)
    torch.testing.assert_close(ret, expected_ret)


def test_one_segment_is_bandit_update():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.6]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    adv, ret = macro_advantages(rewards, values, mask, torch.zeros(1, 3, dtype=torch.long), 1.0, 0.95)
    torch.testing.assert_close(adv, torch.full((1, 3), 0.6, dtype=torch.float64))
    torch.testing.assert_close(ret, torch.full((1, 3), 1.0, dtype=torch.float64))


def test_segment_rewards_are_summed_not_averaged():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    values = torch.zeros(1, 4, dtype=torch.float64)
    mask = torch.ones(1, 4)
    adv, _ = macro_advantages(rewards, values, mask, torch.zeros(1, 4, dtype=torch.long), 1.0, 1.0)
    assert adv[0, 0].item() == 4.0


def test_labels_are_runs_not_values():
    rewards, values = random_tensor(0, (1, 5)), random_tensor(1, (1, 5))
    mask = torch.ones(1, 5)
    canonical = torch.tensor([[0, 0, 1, 1, 1]])
    relabelled = torch.tensor([[7, 7, 3, 3, 3]])
    assert torch.equal(
        macro_advantages(rewards, values, mask, canonical, 0.9, 0.8)[0],
        macro_advantages(rewards, values, mask, relabelled, 0.9, 0.8)[0],
    )
    assert num_segments(mask, relabelled).tolist() == [2]


@pytest.mark.parametrize(
    "value_function, expected",
    [
        ("equal", [1 / 3, 1 / 3, 1 / 3, 0.5, 0.5, 1.0]),
        ("unit", [0, 0, 1, 0, 1, 1]),
        ("first", [1, 0, 0, 1, 0, 1]),
        # L=3: H = 1/3 + 1/2 + 1 = 11/6 -> 2/11, 3/11, 6/11; L=2: H = 3/2 -> 1/3, 2/3
        ("position", [2 / 11, 3 / 11, 6 / 11, 1 / 3, 2 / 3, 1.0]),
    ],
)
def test_segment_weights_explicit(value_function, expected):
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 0]])
    sigma = segment_weights(mask, ids, value_function)
    torch.testing.assert_close(sigma, torch.tensor([expected + [0.0]]), rtol=1e-6, atol=1e-7)


@FAST
@given(data=masks_and_lengths(), value_function=st.sampled_from(VALUE_FUNCTIONS))
def test_segment_weights_properties(data, value_function):
    mask, lengths = data
    ids = lengths_to_segment_ids(lengths, mask)
    sigma = segment_weights(mask, ids, value_function)
    assert not sigma[~mask.bool()].any()
    assert (sigma >= 0).all()
    # every value function is a convex combination of the segment's token values
    sums = segment_sums(sigma.double(), mask, ids)
    for b, sample in enumerate(lengths):
        torch.testing.assert_close(sums[b, : len(sample)], torch.ones(len(sample), dtype=torch.float64))
        assert not sums[b, len(sample):].any()
        real_sigma = sigma[b][mask[b].bool()].tolist()
        start = 0
        for length in sample:
            expected = reference_sigma(length, value_function)
            assert real_sigma[start : start + length] == pytest.approx(expected, rel=1e-6, abs=1e-7)
            start += length


@settings(max_examples=60, deadline=None)
@given(length=st.integers(0, 70), discount=unit_interval, seed=st.integers(0, 1000))
def test_discounted_reverse_cumsum(length, discount, seed):
    x = random_tensor(seed, (2, length))
    out = discounted_reverse_cumsum(x, discount)
    for b in range(2):
        row = x[b].tolist()
        expected = [sum(discount**l * row[k + l] for l in range(length - k)) for k in range(length)]
        assert out[b].tolist() == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_low_precision_inputs_run_in_float32():
    mask = torch.ones(2, 4)
    ids = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    adv, ret = macro_advantages(torch.ones(2, 4, dtype=torch.bfloat16), torch.zeros(2, 4, dtype=torch.bfloat16), mask, ids)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32


def test_invalid_arguments():
    mask = torch.ones(1, 3)
    ids = torch.zeros(1, 3, dtype=torch.long)
    x = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="value function"):
        macro_advantages(x, x, mask, ids, value_function="mean")
    with pytest.raises(ValueError, match="gamma"):
        macro_advantages(x, x, mask, ids, gamma=1.5)
    with pytest.raises(ValueError, match="lam"):
        token_gae(x, x, mask, lam=-0.1)
    with pytest.raises(ValueError, match="shape"):
        macro_advantages(torch.zeros(1, 4), x, mask, ids)
    with pytest.raises(ValueError, match="value function"):
        segment_weights(mask, ids, "last")


def test_empty_and_all_masked_batches():
    mask = torch.zeros(2, 3)
    ids = torch.zeros(2, 3, dtype=torch.long)
    x = torch.randn(2, 3)
    adv, ret = macro_advantages(x, x, mask, ids)
    assert not adv.any() and not ret.any()
    empty = torch.zeros(2, 0)
    adv, ret = macro_advantages(empty, empty, empty, empty.long())
    assert adv.shape == (2, 0)
    assert math.isfinite(float(token_gae(x, x, mask)[0].sum()))
