"""The two evaluation figures: best-of-N curves (like the paper's Figure 8) and stacked
win/tie/loss bars (like its Figure 4). Written atomically, Agg backend, no display needed."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .. import artifacts

COLORS = {"win": "#2e7d32", "tie": "#9e9e9e", "loss": "#c62828"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    return artifacts.write_figure(path, fig)


def best_of_n(curves: dict[float, dict[int, dict[str, float]]], path: Path, title: str, ylabel: str = "reward-model score") -> Path:
    """Score of the best of N against N (log2 axis), one line per temperature, +-1 s.e. band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    cmap = plt.get_cmap("viridis")
    temps = sorted(curves)
    for index, temp in enumerate(temps):
        ns = sorted(curves[temp])
        means = [curves[temp][n]["mean"] for n in ns]
        sems = [curves[temp][n]["sem"] for n in ns]
        color = cmap(0.85 * index / max(1, len(temps) - 1))  # the top of viridis is too pale
        ax.plot(ns, means, "o-", color=color, label=f"T = {temp:g}", markersize=4)
        ax.fill_between(ns, [m - s for m, s in zip(means, sems)], [m + s for m, s in zip(means, sems)], color=color, alpha=0.15)
    ax.set_xscale("log", base=2)
    all_n = sorted({n for c in curves.values() for n in c})
    ax.set_xticks(all_n, [str(n) for n in all_n])
    ax.set_xlabel("N (best of N samples)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if temps:
        ax.legend(fontsize=8)
    return _save(fig, path)


def win_tie_loss(bars: Sequence[dict], path: Path, title: str = "Pairwise judgements") -> Path:
    """Horizontal stacked bars, one per comparison and judge: ``{"label", "win", "tie", "loss"}``
    counts; each segment is labelled with its share of the decided pairs."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.6 * max(1, len(bars)) + 1.2), dpi=100)
    labels = []
    for row, bar in enumerate(bars):
        total = sum(bar[v] for v in COLORS) or 1
        left = 0.0
        for verdict, color in COLORS.items():
            share = 100.0 * bar[verdict] / total
            ax.barh(row, share, left=left, color=color, label=verdict if row == 0 else None)
            if share >= 6:
                ax.text(left + share / 2, row, f"{share:.0f}%", ha="center", va="center", color="white", fontsize=8)
            left += share
        labels.append(f"{bar['label']} (n={total if any(bar[v] for v in COLORS) else 0})")
    ax.set_yticks(range(len(bars)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of judged pairs (first file's win / tie / loss)")
    ax.set_title(title)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=3, fontsize=8, frameon=False)
    return _save(fig, path)
