"""Which segment values are baselines (docs/method.md "Segment GAE"), computed exactly.

The prefix task with a random policy: each token is a target token with probability p,
independently, and the reward (on the last token, gamma = 1) is the share of target tokens
among the first m. A target token at position j < m is worth 1/m, later positions nothing.
With the exact critic V(s_t) = (targets among positions < min(t, m)) / m + p (m - min(t, m)) / m,
the expected first-segment advantage is computed by enumerating every pattern of the first
segment's tokens (probability-weighted, one ``macro_advantages`` batch), and the credit of
position j is E[A | target at j] - E[A | no target at j]. No sampling: the checks are exact.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import VALUE_FUNCTIONS, macro_advantages


def exact_values(target: torch.Tensor, p: float, m: int) -> torch.Tensor:
    """V(s_t), the value of the state in which token t is chosen (after tokens 0 .. t-1)."""
    batch, tokens = target.shape
    values = torch.zeros(batch, tokens, dtype=torch.float64)
    for t in range(tokens):
        seen = min(t, m)
        values[:, t] = target[:, :seen].sum(dim=1) / m + p * (m - seen) / m
    return values


def first_segment_credits(
    p: float, n: int, m: int, tokens: int, lam: float, value_function: str, overshoot: float = 0.0
) -> list[float]:
    """E[A_1 | target at j] - E[A_1 | none at j] for j = 0 .. n-1, by enumeration.

    ``overshoot`` o makes the critic exact at segment starts and (1 + o) times too steep
    inside segments: v[t] = V(s_a) + (1 + o) (V(s_t) - V(s_a)), a the segment's first token.
    """
    assert m <= n <= tokens
    patterns = torch.tensor(list(itertools.product([0.0, 1.0], repeat=n)), dtype=torch.float64)
    target = torch.zeros(len(patterns), tokens, dtype=torch.float64)
    target[:, :n] = patterns  # later tokens do not move the reward or any value (m <= n)
    prob = (p**patterns * (1 - p) ** (1 - patterns)).prod(dim=1)

    values = exact_values(target, p, m)
    start = [(t // n) * n for t in range(tokens)]
    values = values[:, start] + (1.0 + overshoot) * (values - values[:, start])
    rewards = torch.zeros_like(values)
    rewards[:, -1] = target[:, :m].sum(dim=1) / m
    mask = torch.ones(len(patterns), tokens, dtype=torch.long)
    segment_ids = (torch.arange(tokens) // n).expand(len(patterns), -1)
    advantages, _ = macro_advantages(rewards, values, mask, segment_ids, gamma=1.0, lam=lam, value_function=value_function)
    a = advantages[:, 0]
    credits = []
    for j in range(n):
        x = patterns[:, j]
        credits.append(float((prob * x * a).sum() / p - (prob * (1 - x) * a).sum() / (1 - p)))
    return credits


def sigma(value_function: str, n: int) -> list[float]:
    """The weights of docs/method.md "Segment GAE", written out here independently."""
    if value_function == "equal":
        return [1.0 / n] * n
    if value_function == "unit":
        return [0.0] * (n - 1) + [1.0]
    if value_function == "first":
        return [1.0] + [0.0] * (n - 1)
    harmonic = sum(1.0 / (n - i) for i in range(n))
    return [1.0 / (n - i) / harmonic for i in range(n)]


@pytest.mark.parametrize("lam", [0.95, 1.0])
def test_first_gives_every_position_its_true_credit(lam):
    credits = first_segment_credits(p=0.1, n=5, m=4, tokens=32, lam=lam, value_function="first")
    assert credits == pytest.approx([0.25, 0.25, 0.25, 0.25, 0.0], abs=1e-6)


@pytest.mark.parametrize("lam", [0.95, 1.0])
def test_equal_shrinks_early_credit_by_the_weight_on_earlier_states(lam):
    """equal's V_1 averages states that already saw the segment's own tokens: a target at
    offset j keeps (j + 1) / 5 of its credit."""
    credits = first_segment_credits(p=0.1, n=5, m=4, tokens=32, lam=lam, value_function="equal")
    assert credits == pytest.approx([0.05, 0.10, 0.15, 0.20, 0.0], abs=1e-6)


@pytest.mark.parametrize("value_function", VALUE_FUNCTIONS)
@pytest.mark.parametrize("overshoot", [0.0, 0.25, 0.5])
def test_every_sigma_keeps_the_share_of_its_weight_on_states_before_the_action(value_function, overshoot):
    """credit_j = true_j (1 - (1 + o) w_j), w_j = sum of sigma over offsets after j: 0 for
    first, (n-1-j)/n for equal, all but the last offset's weight for unit."""
    n, m = 5, 4
    weights = sigma(value_function, n)
    expected = [(1 / m if j < m else 0.0) * (1 - (1 + overshoot) * sum(weights[j + 1 :])) for j in range(n)]
    credits = first_segment_credits(p=0.1, n=n, m=m, tokens=12, lam=0.95, value_function=value_function, overshoot=overshoot)
    assert credits == pytest.approx(expected, abs=1e-6)


def test_an_overshooting_critic_flips_the_sign_of_equals_first_credit():
    """25% too steep inside the segment cancels position 0's credit exactly; 50% reverses it."""
    at = {o: first_segment_credits(0.1, 5, 4, 32, 1.0, "equal", overshoot=o)[0] for o in (0.25, 0.5)}
    assert at[0.25] == pytest.approx(0.0, abs=1e-9)
    assert at[0.5] == pytest.approx(-0.05, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    p=st.floats(0.05, 0.95),
    n=st.integers(1, 6),
    data=st.data(),
    extra=st.integers(0, 12),
    lam=st.sampled_from([0.95, 1.0]),
    overshoot=st.floats(0.0, 1.0),
)
def test_first_is_unbiased_on_random_tasks(p, n, data, extra, lam, overshoot):
    """Any p, segment length, prefix length m <= n, response length and lambda; even a critic
    wrong inside the segment, as long as it is right where segments start."""
    m = data.draw(st.integers(1, n), label="m")
    credits = first_segment_credits(p, n, m, n + extra, lam, "first", overshoot=overshoot)
    assert credits == pytest.approx([1 / m if j < m else 0.0 for j in range(n)], abs=1e-6)


def test_the_benchmark_prints_the_table_the_closed_form_predicts():
    """benchmarks/sigma_bias.py end to end: `first` credits 0.25 at every position, `equal`
    (j + 1)/5 of it, and its own check against the closed form is at rounding level."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "sigma_bias.py"
    done = subprocess.run([sys.executable, str(script), "--responses", "4000", "--overshoot", "0.5"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {tuple(cells[:3]): [float(c.split()[0]) for c in cells[3:7]]
            for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| sigma")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}  # fmt: skip
    assert rows[("first", "exact", "1")] == pytest.approx([0.25] * 4, abs=1e-9)
    assert rows[("first", "over+0.5", "0.95")] == pytest.approx([0.25] * 4, abs=1e-9)
    assert rows[("equal", "exact", "0.95")] == pytest.approx([0.05, 0.10, 0.15, 0.20], abs=1e-9)
    assert rows[("equal", "over+0.5", "1")][0] == pytest.approx(-0.05, abs=1e-9)
    gap = float(re.search(r"over the table: (\S+)", done.stdout).group(1))
    assert gap < 1e-9
