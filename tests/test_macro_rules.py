"""Termination rules fixed / randomized / ppl (docs/method.md "Termination rules") and invariant 4 for every rule."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import (
    TerminationRule,
    fixed_lengths,
    ppl_lengths,
    randomized_lengths,
    segment_lengths,
)
from marlhf_cli.macro.rules import RANDOMIZED_POOL

FAST = settings(max_examples=200, deadline=None)


def assert_valid(lengths, length):
    assert all(isinstance(x, int) and x >= 1 for x in lengths), lengths
    assert sum(lengths) == length, (lengths, length)


# ---------------------------------------------------------------------------------------
# fixed


@pytest.mark.parametrize(
    "length, n, expected",
    [
        (0, 5, []),
        (1, 5, [1]),
        (5, 5, [5]),
        (12, 5, [5, 5, 2]),
        (3, 1, [1, 1, 1]),
        (7, math.inf, [7]),
        (7, 2.0, [2, 2, 2, 1]),
    ],
)
def test_fixed_lengths_explicit(length, n, expected):
    assert fixed_lengths(length, n) == expected


@pytest.mark.parametrize("n", [0, -1, 2.5, float("nan"), -math.inf, "5", True])
def test_fixed_lengths_rejects_bad_n(n):
    with pytest.raises(ValueError):
        fixed_lengths(4, n)


def test_fixed_lengths_rejects_negative_length():
    with pytest.raises(ValueError):
        fixed_lengths(-1, 2)


@FAST
@given(length=st.integers(0, 300), n=st.one_of(st.integers(1, 40), st.just(math.inf)))
def test_fixed_lengths_properties(length, n):
    lengths = fixed_lengths(length, n)
    assert_valid(lengths, length)
    if lengths:
        assert all(x == min(n, length) for x in lengths[:-1])
        assert lengths[-1] <= n


# ---------------------------------------------------------------------------------------
# randomized


@FAST
@given(length=st.integers(0, 150), seed=st.integers(-(2**63), 2**63))
def test_randomized_lengths_properties(length, seed):
    lengths = randomized_lengths(length, seed)
    assert_valid(lengths, length)
    assert lengths == randomized_lengths(length, seed)  # reproducible
    pool_sum = sum(RANDOMIZED_POOL)
    if length >= pool_sum:
        # the whole shuffled pool is consumed, then one final segment with the rest
        assert sorted(lengths[:12]) == sorted(RANDOMIZED_POOL)
        assert len(lengths) == 12 + (1 if length > pool_sum else 0)
    else:
        # a prefix of a shuffle of the pool, the last draw possibly cut short
        assert len(lengths) <= 12
        for x in lengths[:-1]:
            assert x in (2, 3, 5, 10)


def test_randomized_lengths_is_a_prefix_of_the_same_shuffle():
    long = randomized_lengths(200, seed=3)
    short = randomized_lengths(17, seed=3)
    # the short response walks the same shuffled pool
    assert short[:-1] == long[: len(short) - 1]
    assert short[-1] <= long[len(short) - 1]


def test_randomized_lengths_depend_on_the_seed():
    assert len({tuple(randomized_lengths(60, seed)) for seed in range(20)}) > 10


# ---------------------------------------------------------------------------------------
# ppl


def test_ppl_lengths_explicit():
    # nll = 1, 0.5 (<= 1: joins, mean .75), 0.8 (> .75: new), 0.8 (<= .8: joins), 0.1 (joins)
    assert ppl_lengths([-1.0, -0.5, -0.8, -0.8, -0.1]) == [2, 3]
    assert ppl_lengths([]) == []
    assert ppl_lengths([-3.0]) == [1]
    # strictly rising nll: every token opens a segment
    assert ppl_lengths([-1.0, -2.0, -3.0]) == [1, 1, 1]
    # falling nll: one segment
    assert ppl_lengths([-3.0, -2.0, -1.0]) == [3]


@FAST
@given(st.lists(st.floats(-20, 0, allow_nan=False), max_size=60))
def test_ppl_lengths_follow_the_definition(ref_logprobs):
    lengths = ppl_lengths(ref_logprobs)
    assert_valid(lengths, len(ref_logprobs))
    nll = [-x for x in ref_logprobs]
    start = 0
    for length in lengths:
        segment = nll[start : start + length]
        for i in range(1, length):  # every later token did not raise the running mean
            assert segment[i] <= sum(segment[:i]) / i
        if start + length < len(nll):  # the next token would have raised it
            assert nll[start + length] > sum(segment) / length
        start += length


@FAST
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=30))
def test_ppl_lengths_valid_on_any_floats(ref_logprobs):
    assert_valid(ppl_lengths(ref_logprobs), len(ref_logprobs))


# ---------------------------------------------------------------------------------------
# Invariant 4 through the dispatcher, every rule


def spans(text):
    return [m.span() for m in re.finditer(r"\s*(\w+|[^\w\s])|\s+", text)]


texts = st.one_of(
    st.text(alphabet="ab ():=\n\t,.+#'\"", max_size=40),
    st.sampled_from(["", "x", "x = 1\n", "def f(:\n", "for i in range(3):\n    print(i)\n", "  \n "]),
)


@FAST
@given(
    name=st.sampled_from(["fixed", "randomized", "ppl", "code"]),
    n=st.one_of(st.integers(1, 12), st.just(math.inf)),
    cutoff=st.integers(1, 12),
    text=texts,
    sample_seed=st.integers(0, 10**6),
    logprob_seed=st.integers(0, 10**6),
)
def test_every_rule_sums_to_the_length(name, n, cutoff, text, sample_seed, logprob_seed):
    offsets = spans(text)
    length = len(offsets)
    import random

    rng = random.Random(logprob_seed)
    ref = [-rng.expovariate(1.0) for _ in range(length)]
    rule = TerminationRule(name, n=n, cutoff=cutoff)
    lengths, fell_back = segment_lengths(
        rule, length, text=text, offsets=offsets, ref_logprobs=ref, sample_seed=sample_seed
    )
    assert_valid(lengths, length)
    if fell_back:
        assert name == "code" and lengths == fixed_lengths(length, n)
    if name == "code" and not fell_back:
        assert max(lengths, default=0) <= cutoff


@pytest.mark.parametrize("name", ["fixed", "randomized", "ppl", "code"])
@pytest.mark.parametrize("length", [0, 1])
def test_every_rule_on_tiny_responses(name, length):
    text = "x" * length
    offsets = [(0, 1)] * length
    lengths, fell_back = segment_lengths(
        TerminationRule(name), length, text=text, offsets=offsets, ref_logprobs=[-1.0] * length
    )
    assert lengths == ([1] if length else [])
    assert not fell_back
