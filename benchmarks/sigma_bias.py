"""The segment value sigma: which choices are baselines, measured on the prefix task (issue 35).

    python benchmarks/sigma_bias.py [--responses 200000] [--seed 0] [--quick]
                                    [--p 0.1] [--tokens 32] [--n 5] [--overshoot 0.25,0.5]

A random policy writes ``--responses`` responses of ``--tokens`` tokens; each token is in the
target class with probability ``--p``, independently. The reward (on the last token, gamma =
1) is the prefix task's: the share of target tokens among the first 4, so each of positions
0-3 is worth exactly 0.25 when it is a target token and later positions are worth nothing.
Segments are ``fixed`` with n = ``--n`` (the first segment is tokens 0 .. n-1).

Two kinds of critic give the per-token values v[t] (the value of the state in which token t
is chosen, i.e. after tokens 0 .. t-1):

- ``exact``: V(s_t) = (targets among positions < min(t, 4)) / 4 + p (4 - min(t, 4)) / 4;
- ``over+o``: exact at each segment's first token, with the increments inside the segment
  (1 + o) times too large: v[t] = V(s_a) + (1 + o) (V(s_t) - V(s_a)), a the segment's first
  token. ``--overshoot`` lists the o's.

For every sigma of ``marlhf_cli.macro.VALUE_FUNCTIONS`` and lambda in {0.95, 1}, the
project's own ``macro_advantages`` computes the advantages; the first segment's advantage is
regressed by least squares on the four target indicators of positions 0-3 (plus an
intercept). A coefficient is the credit the estimator gives, on average, to a target token
at that position; an unbiased estimator gives 0.25 everywhere. docs/method.md "Segment GAE"
derives the closed form, credit_j = 0.25 (1 - (1 + o) w_j), w_j the weight sigma puts on
states after token j inside the segment; the last line prints the largest gap between the
fit and that formula. Both critics make the advantage an exact linear function of the
indicators, so the intervals (+- 1.96 standard errors) are zero up to rounding: the sampling
checks the code path, not a noisy estimate. ``--quick`` runs 20000 responses.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

from marlhf_cli.macro import VALUE_FUNCTIONS, fixed_lengths, lengths_to_segment_ids, macro_advantages  # noqa: E402

PREFIX = 4  # the prefix task's scored positions
LAMBDAS = (0.95, 1.0)


def exact_values(target: torch.Tensor, p: float) -> torch.Tensor:
    """V(s_t) of the random policy on the prefix task, [B, T]: targets seen so far plus the
    expected share of the prefix positions still to come."""
    batch, tokens = target.shape
    prefix = target[:, :PREFIX].to(torch.float64)
    # seen[:, t] = targets among positions < min(t, PREFIX)
    seen = torch.zeros(batch, tokens, dtype=torch.float64)
    seen[:, 1 : PREFIX + 1] = prefix.cumsum(dim=1)[:, : min(PREFIX, tokens - 1)]
    if tokens > PREFIX + 1:
        seen[:, PREFIX + 1 :] = seen[:, PREFIX : PREFIX + 1]
    left = (PREFIX - torch.arange(tokens).clamp(max=PREFIX)).to(torch.float64)
    return seen / PREFIX + p * left / PREFIX


def overshooting(values: torch.Tensor, n: int, overshoot: float) -> torch.Tensor:
    """Exact at every segment start, in-segment increments (1 + overshoot) times too large."""
    start = (torch.arange(values.shape[1]) // n) * n
    at_start = values[:, start]
    return at_start + (1.0 + overshoot) * (values - at_start)


def weight_after(value_function: str, n: int) -> np.ndarray:
    """w_j: the weight sigma puts on the segment's states after token j (offsets j+1 .. n-1)."""
    if value_function == "equal":
        sigma = np.full(n, 1.0 / n)
    elif value_function == "unit":
        sigma = np.eye(n)[n - 1]
    elif value_function == "first":
        sigma = np.eye(n)[0]
    else:  # position
        sigma = 1.0 / (n - np.arange(n))
        sigma /= sigma.sum()
    return np.array([sigma[j + 1 :].sum() for j in range(n)])


def fit(advantage: np.ndarray, indicators: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slopes of advantage on the indicators (with intercept) and their SEs."""
    design = np.column_stack([np.ones(len(advantage)), indicators])
    coef, _, _, _ = np.linalg.lstsq(design, advantage, rcond=None)
    residual = advantage - design @ coef
    dof = max(len(advantage) - design.shape[1], 1)
    cov = residual @ residual / dof * np.linalg.inv(design.T @ design)
    return coef[1:], np.sqrt(np.maximum(np.diag(cov)[1:], 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="20000 responses")
    parser.add_argument("--p", type=float, default=0.1, help="probability of a target token")
    parser.add_argument("--tokens", type=int, default=32, help="response length")
    parser.add_argument("--n", type=int, default=5, help="fixed segment length")
    parser.add_argument("--overshoot", default="0.25,0.5", help="comma-separated o's of the over+o critics")
    args = parser.parse_args()
    if args.quick:
        args.responses = 20_000
    if args.tokens <= PREFIX or args.n < PREFIX:
        parser.error(f"--tokens must exceed {PREFIX} and --n must be at least {PREFIX} (the prefix in one segment)")
    overshoots = [float(o) for o in args.overshoot.split(",") if o.strip()]
    torch.set_num_threads(1)
    print(H.machine_line())
    print(f"# prefix task: {args.responses} responses of {args.tokens} tokens, random policy p = {args.p}, "
          f"fixed n = {args.n}, gamma = 1, seed {args.seed}; true credit 0.25 at positions 0-3")  # fmt: skip
    started = time.perf_counter()

    generator = torch.Generator().manual_seed(args.seed)
    target = torch.rand(args.responses, args.tokens, generator=generator) < args.p
    mask = torch.ones(args.responses, args.tokens, dtype=torch.long)
    row = lengths_to_segment_ids([fixed_lengths(args.tokens, args.n)], mask[:1])
    segment_ids = row.expand(args.responses, -1)
    rewards = torch.zeros(args.responses, args.tokens, dtype=torch.float64)
    rewards[:, -1] = target[:, :PREFIX].sum(dim=1).to(torch.float64) / PREFIX
    exact = exact_values(target, args.p)
    critics = [("exact", 0.0, exact)] + [(f"over+{o:g}", o, overshooting(exact, args.n, o)) for o in overshoots]
    indicators = target[:, :PREFIX].numpy().astype(np.float64)

    header = "| sigma | critic | lambda | " + " | ".join(f"pos {j}" for j in range(PREFIX)) + " | true |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    gap = 0.0
    for value_function in VALUE_FUNCTIONS:
        after = weight_after(value_function, args.n)
        for name, overshoot, values in critics:
            formula = 0.25 * (1.0 - (1.0 + overshoot) * after[:PREFIX])
            for lam in LAMBDAS:
                advantages, _ = macro_advantages(
                    rewards, values, mask, segment_ids, gamma=1.0, lam=lam, value_function=value_function
                )
                coef, se = fit(advantages[:, 0].numpy(), indicators)
                gap = max(gap, float(np.abs(coef - formula).max()))
                cells = " | ".join(f"{round(c, 4) + 0.0:+.4f} ± {1.96 * s:.0e}" for c, s in zip(coef, se))
                print(f"| {value_function} | {name} | {lam:g} | {cells} | 0.25 |", flush=True)
    print(f"# largest |fitted credit - closed form 0.25 (1 - (1 + o) w_j)| over the table: {gap:.1e}")
    print(f"# wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
