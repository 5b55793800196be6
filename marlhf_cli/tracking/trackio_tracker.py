"""``--report-to trackio``: a trackio run in its local store (``TRACKIO_DIR``, default
``~/.cache/huggingface/trackio``; ``trackio show --project marlhf``)."""

from __future__ import annotations

import os
import sqlite3

import trackio

from . import Tracker


class Trackio(Tracker):
    name = "trackio"

    def __init__(self, run, run_name: str):
        self.run = run
        self.id = run_name

    def log(self, step: int, values: dict[str, float], split: str) -> None:
        self.run.log({f"{split}/{key}": value for key, value in values.items()}, step=step)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        self.run.log({name: trackio.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


def database(project: str):
    """The local store's file of ``project`` (trackio keeps one SQLite file per project)."""
    from trackio.utils import TRACKIO_DIR

    return TRACKIO_DIR / f"{project}.db"


def rewind(project: str, run_name: str, step: int) -> None:
    """Remove what ``run_name`` logged after ``step`` (a resumed run logs those steps again)."""
    path = database(project)
    if not path.is_file():
        return
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in ("metrics",):
            if table in tables:
                db.execute(f"DELETE FROM {table} WHERE run_name = ? AND step > ?", (run_name, step))


def start(*, run, stage, name, group, config, start_step, resume_id, say) -> Trackio:
    project = os.environ.get("TRACKIO_PROJECT", "marlhf")
    run_name = resume_id or name
    if resume_id:
        rewind(project, run_name, start_step)
    tracker = trackio.init(project=project, name=run_name, group=group, config=config,
                           resume="allow" if resume_id else "never", auto_log_cpu=False, auto_log_gpu=False)  # fmt: skip
    return Trackio(tracker, run_name)
