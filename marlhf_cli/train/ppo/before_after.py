"""What a run did to its held-out prompts: the evaluation before training beside the last
one, prompt by prompt.

The evaluation samples each held-out prompt once (evaluation.py), so the two evaluations
score the same prompts and their difference is paired: the gain's interval is a paired
t-interval over prompts (``scipy.stats.ttest_rel``), narrower than the two means' own
intervals suggest when a prompt's difficulty is shared by both. Each interval holds the
sampling noise of one response per prompt as well as the prompts' spread; it says nothing
of prompts unlike the held-out ones.

The samples before training are kept in ``samples/<name>-before.jsonl`` (what
``marlhf judge`` reads beside ``samples/<name>.jsonl``), written at step 0, so a resumed run
still compares against them.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

CONFIDENCE = 0.95
BEFORE_SUFFIX = "-before"  # samples/<name>-before.jsonl: the evaluation at step 0


def _interval(result: Any) -> tuple[float, float] | None:
    low, high = result.confidence_interval(CONFIDENCE)
    return None if math.isnan(low) else (float(low), float(high))


def paired_gain(before: Sequence[dict], after: Sequence[dict]) -> dict[str, Any] | None:
    """Mean score before and after over the prompts both evaluations scored, each with its
    t-interval, and the paired gain with its; None when they share no prompt. Intervals are
    None below two prompts, and for the gain also when every difference is the same."""
    from scipy import stats

    scores = {row["prompt"]: row["score"] for row in before}
    pairs = [(scores[row["prompt"]], row["score"]) for row in after if row["prompt"] in scores]
    if not pairs:
        return None
    old, new = [p[0] for p in pairs], [p[1] for p in pairs]
    out: dict[str, Any] = {"prompts": len(pairs), "before": sum(old) / len(old), "after": sum(new) / len(new)}
    out["gain"] = out["after"] - out["before"]
    many = len(pairs) > 1
    out["before_ci"] = _interval(stats.ttest_1samp(old, 0.0)) if many and len(set(old)) > 1 else None
    out["after_ci"] = _interval(stats.ttest_1samp(new, 0.0)) if many and len(set(new)) > 1 else None
    varies = len({b - a for a, b in pairs}) > 1
    out["gain_ci"] = _interval(stats.ttest_rel(new, old)) if many and varies else None
    return out


def _with_interval(mean: float, interval: tuple[float, float] | None, sign: bool = False) -> str:
    shown = f"{mean:+.3f}" if sign else f"{mean:.3f}"
    return shown if interval is None else f"{shown} [{interval[0]:.3f}, {interval[1]:.3f}]"


def gain_line(gain: dict[str, Any]) -> str:
    """The run's result in one line: held-out score before, after, and the paired gain."""
    return (
        f"held-out score on {gain['prompts']} prompts (one sample each; mean [{CONFIDENCE:.0%} t-interval over prompts]): "
        f"before training {_with_interval(gain['before'], gain['before_ci'])}, after {_with_interval(gain['after'], gain['after_ci'])}; "
        f"gain {_with_interval(gain['gain'], gain['gain_ci'], sign=True)} (paired)"
    )


def shorten(text: str, width: int = 160) -> str:
    """``text`` on one line, its middle cut where it is longer than ``width``."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    half = (width - 5) // 2
    return f"{flat[:half].rstrip()} ... {flat[-half:].lstrip()}"


def sample_lines(before: Sequence[dict], after: Sequence[dict], count: int) -> list[str]:
    """The first ``count`` held-out prompts with their response and score before and after."""
    earlier = {row["prompt"]: row for row in before}
    lines = []
    shown = [row for row in after if row["prompt"] in earlier][:count]
    for index, row in enumerate(shown, start=1):
        old = earlier[row["prompt"]]
        lines += [
            f"held-out prompt {index}: {shorten(row['prompt'])}",
            f"  before ({old['score']:.3f}): {shorten(old['response'], 400)}",
            f"  after  ({row['score']:.3f}): {shorten(row['response'], 400)}",
        ]
    return lines
