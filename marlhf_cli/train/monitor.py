"""What a training stage shows and records: progress, metrics JSONL, the trackers of
``--report-to`` (TensorBoard by default: marlhf_cli/tracking), loss PNG.

Only rank 0 does any of it (other ranks get a monitor whose methods do nothing), so a
multi-process run prints one progress bar and writes each metric once. Progress is a live
bar on a terminal and plain lines in a log file (:mod:`.progress`).

On ``--resume`` from step k, rows after k (written by the run that was killed) are dropped
from ``metrics/<stage>.jsonl``, and the trackers continue their runs without them (TensorBoard
purges them; marlhf_cli/tracking), so the records of a resumed run read like those of a run
that never stopped.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from .. import artifacts

# what a held-out evaluation's console line shows, in this order, of what the stage measured
# (ppo: score, length, EOS rate; sft: loss, perplexity; rm: loss, accuracy, margin)
EVAL_SHOWN = ("score", "loss", "perplexity", "accuracy", "margin", "response_length", "eos_rate")

# MARLHF_PLOTS=0: no plots/<stage>-*.png (metrics/ and the trackers keep every number they
# show). A PNG costs a tenth of a second of matplotlib, and pyplot's import half a second
# more per process: a quarter of a few-step run, which sweeps and the test suite (it sets
# this; tests/conftest.py) run by the hundred.
PLOTS_ENV = "MARLHF_PLOTS"


def plots_wanted() -> bool:
    return os.environ.get(PLOTS_ENV, "1") != "0"


class Monitor:
    """Progress, metrics and plots for one stage of one run directory."""

    def __init__(
        self, run: artifacts.RunDir, stage: str, *, total_steps: int, start_step: int, enabled: bool, live: bool | None = None,
        config: Any = None,
    ):
        """``live``: rich's bar (True) or plain lines (False); by default the bar where
        stderr is a terminal. ``config``: the stage's resolved options, whose ``report_to``
        names the trackers (TensorBoard without one) and which they get, with the provenance,
        as the run's config."""
        self.run = run
        self.stage = stage
        self.enabled = enabled
        self.total_steps = total_steps
        self.path = run.metrics_path(stage)
        self._trackers = None
        self._progress = None
        if not enabled:
            return
        self._truncate(start_step)
        self._trackers = _open_trackers(run, stage, config, start_step)
        from rich.console import Console

        from .progress import Bar, LogLines

        console = Console(stderr=True)
        if console.is_terminal if live is None else live:
            self._progress = Bar(stage, total_steps, start_step, console)
        else:
            self._progress = LogLines(stage, total_steps, start_step)

    # metrics ------------------------------------------------------------------------------
    def _truncate(self, start_step: int) -> None:
        if not self.path.is_file():
            return
        rows = artifacts.read_jsonl(self.path) if start_step else []
        artifacts.write_jsonl(self.path, [row for row in rows if row.get("step", 0) <= start_step])

    def log(self, step: int, values: dict[str, Any], split: str = "train") -> None:
        """One metrics row ``{"step", "split", **values}`` to JSONL and TensorBoard."""
        if not self.enabled:
            return
        row = {"step": step, "split": split, **as_logged(values), "time": round(time.time(), 3)}
        artifacts.append_jsonl(self.path, row)
        if split == "eval":  # held-out figures were only in the files: one line each on the console
            self.print(eval_line(self.stage, step, values))
        if self._trackers is not None:
            self._trackers.log(step, values, split)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        """A table (``ppo``'s completions) to every tracker."""
        if self._trackers is not None:
            self._trackers.table(step, name, columns, rows)

    # progress -----------------------------------------------------------------------------
    def advance(self, step: int, live: dict[str, float]) -> None:
        if self._progress is not None:
            self._progress.advance(step, live)

    def print(self, message: str) -> None:
        if self._progress is not None:
            self._progress.print(message)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None

    # plot ---------------------------------------------------------------------------------
    def plot(self, metric: str = "loss", title: str | None = None, xlabel: str = "optimizer step") -> Path | None:
        """``plots/<stage>-<metric>.png`` (a '/' in the metric's name, as TRL's rewards/margins,
        becomes '-'): the training curve and the held-out points (none with MARLHF_PLOTS=0)."""
        if not self.enabled or not self.path.is_file() or not plots_wanted():
            return None
        rows = artifacts.read_jsonl(self.path)
        path = self.run.plot_path(artifacts.safe_name(f"{self.stage}-{metric}"))  # rewards/margins: dpo-rewards-margins.png
        return plot_curves(rows, metric, path, title or f"{self.stage} {metric}", xlabel)


def eval_line(stage: str, step: int, values: dict[str, Any]) -> str:
    """'ppo-fixed5 eval at step 4: score 0.1234  response_length 20.5  eos_rate 0.5'."""
    from .progress import metrics_text

    shown = {key: values[key] for key in EVAL_SHOWN if isinstance(values.get(key), (int, float))}
    return f"{stage} eval at step {step}: {metrics_text(shown)}"


def plot_curves(rows: list[dict], metric: str, path: Path, title: str, xlabel: str = "optimizer step") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for split, style in (("train", "-"), ("eval", "o-")):
        points = [(r["step"], r[metric]) for r in rows if r.get("split") == split and isinstance(r.get(metric), (int, float))]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, style, label=f"{split} {metric}", markersize=4)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    return artifacts.write_figure(path, fig)


def _open_trackers(run: artifacts.RunDir, stage: str, config: Any, start_step: int):
    from .. import config as config_module, provenance, tracking
    from . import common

    names = tracking.parse(getattr(config, "report_to", None))
    settings = {**(config_module.to_dict(config) if config is not None else {}), "provenance": provenance.provenance()}
    return tracking.open_trackers(run, stage, names, config=settings, start_step=start_step, say=common.say)


def as_logged(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as :meth:`Monitor.log` writes them (and a resumed run reads them back): a
    figure derived from logged rows is the same whether the run stopped or not."""
    return {key: _plain(value) for key, value in values.items()}


def _plain(value: Any) -> Any:
    """A metric for JSON: 7 significant digits (a float32's), so a learning rate of 3e-8
    late in a schedule stays 3e-8 instead of rounding to 0.0."""
    if isinstance(value, float):
        return float(f"{value:.7g}") if math.isfinite(value) else None
    return value

