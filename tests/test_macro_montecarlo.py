"""Monte-Carlo segment advantages (marlhf_cli.macro.montecarlo) against brute-force references
on random inputs: the even boundary cap, the boundary plan, the per-token advantages, their
telescoping sum and the reduction to RLOO with one segment."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings as hypothesis_settings, strategies as st

from marlhf_cli.macro import (
    boundary_plan,
    cap_segments,
    kept_boundaries,
    lengths_to_segment_ids,
    mc_advantages,
    rloo_advantages,
    sequence_to_tokens,
)
from marlhf_cli.macro.baselines import leave_one_out_means

# ---------------------------------------------------------------------------------------
# the even cap


def test_kept_boundaries_by_hand():
    assert kept_boundaries(5, None) == [1, 2, 3, 4]
    assert kept_boundaries(5, 4) == [1, 2, 3, 4] and kept_boundaries(5, 9) == [1, 2, 3, 4]
    assert kept_boundaries(10, 1) == [5]  # the middle: 5 + 5 segments
    assert kept_boundaries(10, 2) == [3, 6]  # 3 + 3 + 4
    assert kept_boundaries(10, 3) == [2, 5, 7]  # 2 + 3 + 2 + 3
    assert kept_boundaries(7, 0) == [] and kept_boundaries(1, 3) == [] and kept_boundaries(0, 3) == []


@hypothesis_settings(max_examples=300, deadline=None)
@given(segments=st.integers(0, 80), cap=st.one_of(st.none(), st.integers(0, 40)))
def test_kept_boundaries_are_inner_distinct_and_even(segments, cap):
    kept = kept_boundaries(segments, cap)
    inner = max(segments - 1, 0)
    assert len(kept) == (inner if cap is None else min(cap, inner))
    assert kept == sorted(set(kept)) and all(1 <= k < segments for k in kept)
    if cap is not None and inner > cap:
        # "evenly": the kept boundaries cut the S segments into cap + 1 runs whose lengths
        # (in segments) differ by at most one
        runs = [b - a for a, b in zip([0, *kept], [*kept, segments])]
        assert max(runs) - min(runs) <= 1, runs
        assert kept == [m * segments // (cap + 1) for m in range(1, cap + 1)]


def _random_batch(draw, rows: int, width: int):
    """Prefix masks and random segmentations: (lengths per row, mask, segment ids)."""
    real = draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows))
    lengths = []
    for count in real:
        cuts = sorted(draw(st.sets(st.integers(1, max(count - 1, 1)), max_size=max(count - 1, 0)))) if count > 1 else []
        bounds = [0, *cuts, count] if count else [0]
        lengths.append([b - a for a, b in zip(bounds, bounds[1:]) if b > a])
    mask = torch.zeros((rows, width), dtype=torch.long)
    for b, count in enumerate(real):
        mask[b, :count] = 1
    return lengths, mask, lengths_to_segment_ids(lengths, mask)


def _reference_cap(lengths: list[int], cap) -> list[int]:
    """Per-token merged segment of one row, by a plain loop over the kept boundaries."""
    kept = kept_boundaries(len(lengths), cap)
    out = []
    for j, length in enumerate(lengths):
        out += [sum(1 for k in kept if k <= j)] * length
    return out


@hypothesis_settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(1, 24), cap=st.one_of(st.none(), st.integers(0, 8)), data=st.data())
def test_cap_segments_matches_a_plain_loop(rows, width, cap, data):
    lengths, mask, ids = _random_batch(data.draw, rows, width)
    capped = cap_segments(ids, mask, cap)
    for b in range(rows):
        count = int(mask[b].sum())
        assert capped[b, :count].tolist() == _reference_cap(lengths[b], cap)
        assert capped[b, count:].eq(0).all()
        assert int(capped[b, :count].max()) + 1 <= (len(lengths[b]) if cap is None else cap + 1) if count else True


@hypothesis_settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(1, 24), data=st.data())
def test_boundary_plan_lists_every_segment_start_but_the_first(rows, width, data):
    lengths, mask, ids = _random_batch(data.draw, rows, width)
    plan = boundary_plan(ids, mask)
    expected = [(b, k, sum(lens[:k])) for b, lens in enumerate(lengths) for k in range(1, len(lens))]
    assert list(zip(plan.rows.tolist(), plan.boundaries.tolist(), plan.positions.tolist())) == expected
    assert plan.segments.tolist() == [len(lens) for lens in lengths]
    # garbage at padding changes nothing
    noisy = torch.where(mask.bool(), ids, torch.randint(0, 50, ids.shape))
    again = boundary_plan(noisy, mask)
    assert torch.equal(again.positions, plan.positions) and torch.equal(again.boundaries, plan.boundaries)


# ---------------------------------------------------------------------------------------
# advantages against a brute-force reference


def _reference_advantages(scores, k, lengths, continuation_means):
    """Per row: V(s_0) = mean of the other K-1 scores, V(s_j) = the mean of its continuations'
    scores, V(s_S) = its own score; each token of segment j gets V(s_{j+1}) - V(s_j)."""
    out, inner = [], iter(continuation_means)
    for b, lens in enumerate(lengths):
        group = range(b // k * k, b // k * k + k)
        values = [sum(scores[j] for j in group if j != b) / (k - 1)]
        values += [next(inner) for _ in range(len(lens) - 1)]
        values.append(scores[b])
        out.append([values[j + 1] - values[j] for j, length in enumerate(lens) for _ in range(length)])
    return out


@hypothesis_settings(max_examples=150, deadline=None)
@given(
    k=st.integers(2, 4), groups=st.integers(1, 3), width=st.integers(1, 20), rollouts=st.integers(1, 4),
    cap=st.one_of(st.none(), st.integers(0, 5)), data=st.data(),
)  # fmt: skip
def test_mc_advantages_match_a_plain_loop_and_telescope(k, groups, width, rollouts, cap, data):
    rows = k * groups
    rule_lengths, mask, rule_ids = _random_batch(data.draw, rows, width)
    ids = cap_segments(rule_ids, mask, cap)
    lengths = [[int((ids[b, : int(mask[b].sum())] == j).sum()) for j in range(int(ids[b].max()) + 1)] if mask[b].any() else []
               for b in range(rows)]  # fmt: skip
    plan = boundary_plan(ids, mask)
    floats = st.floats(-3, 3, allow_nan=False, width=32)
    scores = torch.tensor(data.draw(st.lists(floats, min_size=rows, max_size=rows)))
    continuation = torch.tensor(data.draw(st.lists(floats, min_size=len(plan) * rollouts, max_size=len(plan) * rollouts)))
    continuation = continuation.reshape(len(plan), rollouts)
    advantages = mc_advantages(scores, k, continuation, plan, ids, mask)
    reference = _reference_advantages(scores.double().tolist(), k, lengths, continuation.double().mean(1).tolist())
    others = leave_one_out_means(scores, k)
    for b in range(rows):
        count = int(mask[b].sum())
        assert advantages[b, :count].tolist() == pytest.approx(reference[b], abs=1e-9)
        assert advantages[b, count:].eq(0).all()
        if count:  # one advantage per segment (its first token), summing to score - V(s_0)
            firsts = [0, *plan.positions[plan.rows == b].tolist()]
            assert float(advantages[b, firsts].sum()) == pytest.approx(float(scores[b].double() - others[b]), abs=1e-9)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_one_segment_per_response_is_rloo_of_the_score_exactly(k):
    torch.manual_seed(k)
    scores = torch.randn(4 * k)
    mask = (torch.arange(9)[None, :] < torch.randint(1, 10, (4 * k, 1))).long()
    ids = torch.zeros_like(mask)  # fixed --n inf: one segment, no inner boundary, no continuation
    plan = boundary_plan(ids, mask)
    assert len(plan) == 0
    advantages = mc_advantages(scores, k, torch.zeros((0, 2)), plan, ids, mask)
    assert torch.equal(advantages.float(), sequence_to_tokens(rloo_advantages(scores, k), mask))


def test_hand_computed_response():
    # K = 2: scores 1.0 and 0.0; row 0 has segments [2, 1, 2] with continuations means 0.25
    # and 0.75; V = [0.0 (the other), 0.25, 0.75, 1.0]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ids = lengths_to_segment_ids([[2, 1, 2], [2]], mask)
    plan = boundary_plan(ids, mask)
    assert plan.positions.tolist() == [2, 3]
    continuation = torch.tensor([[0.0, 0.5], [1.0, 0.5]])
    advantages = mc_advantages(torch.tensor([1.0, 0.0]), 2, continuation, plan, ids, mask)
    assert advantages.tolist() == [[0.25, 0.25, 0.5, 0.25, 0.25], [-1.0, -1.0, 0.0, 0.0, 0.0]]


def test_inputs_that_do_not_fit_are_errors():
    mask = torch.ones((2, 4), dtype=torch.long)
    ids = lengths_to_segment_ids([[2, 2], [4]], mask)
    plan = boundary_plan(ids, mask)
    with pytest.raises(ValueError, match="1 boundaries"):
        mc_advantages(torch.zeros(2), 2, torch.zeros((3, 2)), plan, ids, mask)
    with pytest.raises(ValueError, match="at least 2"):
        mc_advantages(torch.zeros(2), 1, torch.zeros((1, 2)), plan, ids, mask)
