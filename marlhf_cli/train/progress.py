"""A training stage's progress: a live bar on a terminal, plain lines in a log file.

On a terminal, rich's bar redraws in place; it is one line wide enough for 80 columns, with
as many of the live metrics as fit whole (all of them are in ``metrics/<stage>.jsonl``).
Where stderr is not a terminal (``nohup``, CI, ``2> log``) a bar would appear only when the
run ends, so a killed run would leave nothing: there a plain line is printed, and flushed,
at the first step, every ``every_steps`` steps (a twentieth of the run by default) or
``every_seconds`` seconds (60), whichever comes first, and at the last step::

    sft step 4/40 (10%), 0:00:12 elapsed, ~0:01:48 left: loss 9.634  lr 0.001
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 12
EVERY_SECONDS = 60.0


def due(step: int, last_step: int | None, seconds_since: float, total: int, every_steps: int, every_seconds: float) -> bool:
    """Whether a plain progress line is due at ``step`` (the last one was at ``last_step``)."""
    return last_step is None or step >= total or step - last_step >= every_steps or seconds_since >= every_seconds


def clock(seconds: float) -> str:
    """h:mm:ss, as rich's bar shows times."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def metrics_text(live: dict[str, object], width: int | None = None) -> str:
    """'loss 9.634  lr 0.001': every metric, or the first ones that fit in ``width`` whole."""
    parts = [f"{name} {_short(value)}" for name, value in live.items()]
    if width is None:
        return "  ".join(parts)
    text = ""
    for part in parts:
        longer = f"{text}  {part}" if text else part
        if len(longer) > width:
            break
        text = longer
    return text


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class LogLines:
    """Plain progress lines for a log file (see the module doc)."""

    def __init__(self, stage: str, total: int, start: int, *, every_steps: int | None = None,
                 every_seconds: float = EVERY_SECONDS, stream: TextIO | None = None):  # fmt: skip
        self.stage, self.total, self.start = stage, total, start
        self.every_steps = every_steps or max(1, total // 20)
        self.every_seconds = every_seconds
        self.stream = stream
        self.began = self.last_time = time.monotonic()
        self.last_step: int | None = None

    def advance(self, step: int, live: dict[str, object]) -> None:
        now = time.monotonic()
        if not due(step, self.last_step, now - self.last_time, self.total, self.every_steps, self.every_seconds):
            return
        elapsed = now - self.began
        done = step - self.start
        left = f", ~{clock(elapsed / done * (self.total - step))} left" if done > 0 and step < self.total else ""
        line = f"{self.stage} step {step}/{self.total} ({100 * step // max(self.total, 1)}%), {clock(elapsed)} elapsed{left}"
        text = metrics_text(live)
        print(f"{line}: {text}" if text else line, file=self.stream or sys.stderr, flush=True)
        self.last_step, self.last_time = step, now

    def print(self, message: str) -> None:
        print(message, file=self.stream or sys.stderr, flush=True)

    def stop(self) -> None:
        pass


class Bar:
    """rich's live bar, one line at the console's width."""

    def __init__(self, stage: str, total: int, start: int, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.stage, self.total, self.console = stage, total, console
        self.progress = Progress(
            TextColumn(f"[bold]{stage}[/]"), BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("<"), TimeRemainingColumn(), TextColumn("{task.fields[live]}"), console=console, transient=False,
        )  # fmt: skip
        self.progress.start()
        self.task = self.progress.add_task(stage, total=total, completed=start, live="")

    def room(self) -> int:
        """Columns left for the metrics: the others' widths and a space between columns
        (the times take 7 columns, 8 past 9 hours)."""
        steps = 2 * len(str(self.total)) + 1
        return self.console.width - (len(self.stage) + BAR_WIDTH + steps + 8 + 1 + 8 + 6) - 1

    def advance(self, step: int, live: dict[str, object]) -> None:
        self.progress.update(self.task, completed=step, live=metrics_text(live, self.room()))

    def print(self, message: str) -> None:
        self.progress.console.print(message, highlight=False)

    def stop(self) -> None:
        self.progress.stop()
