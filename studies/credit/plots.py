"""The study's figures, each on the three cost axes (steps, responses, generated tokens).

* ``kaplan_meier.png``: per task (rows) and axis (columns), the share of runs that have
  reached the threshold by a given cost, 1 - Kaplan-Meier survival; the arms the comparisons
  use drawn thick, the other arms thin, in their family's colour (``arm_style``).
* ``restricted_means.png``: the restricted mean cost to threshold of every arm with its
  bootstrap interval, per task and axis (secondary: it depends on the horizon).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .analysis import ArmResult
from .protocol import AXES, AXIS_LABELS, Protocol
from .survival import kaplan_meier

EDITIONS = {2: "second", 3: "third"}
FAMILY_COLOURS = {"token-ppo": "C0", "ma-ppo": "C3", "critic-free": "C2", "mc": "C4"}


def arm_style(protocol: Protocol, name: str) -> tuple[str, str]:
    """(colour, line style) of an arm: its family's colour (MA-PPO's ppl arms orange, so the
    two rules differ), dashed for the segment value `first`, so that the arms the third
    edition compares within MA-PPO can be told apart."""
    arm = protocol.arms[name]
    colour = "C1" if arm.family == "ma-ppo" and arm.flags.get("termination") == "ppl" else FAMILY_COLOURS.get(arm.family, "grey")
    return colour, "--" if arm.flags.get("value_function") == "first" else "-"


def _figure(rows: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, len(AXES), figsize=(5.0 * len(AXES), 3.6 * rows), dpi=100, squeeze=False)


def kaplan_meier_figure(protocol: Protocol, tasks: dict[str, tuple[dict[str, ArmResult], set[str], dict]], path: Path) -> None:
    """``tasks``: task -> (arm results, the family bests, horizons)."""
    fig, axes = _figure(len(tasks))
    for row, (task, (arms, decided, horizon)) in zip(axes, tasks.items()):
        for ax, axis in zip(row, AXES):
            for name, a in arms.items():
                times, survival = kaplan_meier(a.outcomes[axis])
                end = a.outcomes[axis].times.max()
                xs = np.concatenate([[0.0], times, [end]])
                ys = 1.0 - np.concatenate([[1.0], survival, [survival[-1]]])
                best = name in decided
                colour, style = arm_style(protocol, name)
                ax.step(xs, ys, where="post", color=colour, linestyle=style, linewidth=2.2 if best else 0.8,
                        alpha=1.0 if best else 0.45, label=f"{name}, lr {a.lr:g} ({a.reached}/{a.runs})" if best else None)  # fmt: skip
            if axis == "tokens":
                ax.axvline(horizon["tokens"], color="grey", linestyle=":", linewidth=0.8)
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel(AXIS_LABELS[axis])
            ax.set_ylabel("share of runs at the threshold")
            ax.set_title(f"{task}, {protocol.tokens[task]} tokens", fontsize=9)
            ax.grid(alpha=0.3)
            if axis == "steps":
                ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"credit-assignment study, {EDITIONS[protocol.edition]} edition ({protocol.mode}): 1 - Kaplan-Meier; thick: the arms compared "
                 f"(runs reached/run), thin: the other arms; colour: family (ppl orange), dashed: segment value `first`", fontsize=9)  # fmt: skip
    fig.tight_layout()
    from marlhf_cli.artifacts import write_figure

    write_figure(path, fig)


def restricted_mean_figure(protocol: Protocol, tasks: dict[str, tuple[dict[str, ArmResult], set[str], dict]], path: Path) -> None:
    fig, axes = _figure(len(tasks))
    for row, (task, (arms, decided, horizon)) in zip(axes, tasks.items()):
        names = list(arms)
        for ax, axis in zip(row, AXES):
            for y, name in enumerate(names):
                mean, low, high = arms[name].restricted[axis]
                colour = arm_style(protocol, name)[0]
                ax.errorbar([mean], [y], xerr=[[mean - low], [high - mean]], fmt="o", color=colour,
                            markersize=6 if name in decided else 3, linewidth=1.6 if name in decided else 0.8)  # fmt: skip
            ax.set_yticks(range(len(names)), [f"{n}{' *' if n in decided else ''}" for n in names], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel(f"restricted mean {AXIS_LABELS[axis]} to threshold (horizon {horizon[axis]:,.0f})")
            ax.set_title(f"{task}", fontsize=9)
            ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"credit-assignment study, {EDITIONS[protocol.edition]} edition ({protocol.mode}): restricted mean cost to threshold, "
                 f"{protocol.confidence:.0%} bootstrap intervals; * family best", fontsize=9)  # fmt: skip
    fig.tight_layout()
    from marlhf_cli.artifacts import write_figure

    write_figure(path, fig)
