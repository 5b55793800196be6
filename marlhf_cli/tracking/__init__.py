"""``--report-to``: experiment trackers, each through its own library, all local-first.

``sft``, ``rm`` and ``ppo`` log to every tracker named in ``--report-to`` (a comma list of
``tensorboard``, ``wandb``, ``trackio``, ``mlflow``, or ``none``), through the stage's
:class:`marlhf_cli.train.monitor.Monitor`, which keeps writing ``metrics/<stage>.jsonl`` in
every case. The default is ``tensorboard``: a dependency already, no account, no server, and
what marlhf wrote before this option existed. Each tracker works with no network:

* ``tensorboard``: event files under ``tb/<stage>/`` (``tensorboard --logdir RUN_DIR/tb``);
* ``wandb``: an offline run under ``wandb/`` unless ``WANDB_MODE`` says otherwise (``wandb
  sync`` uploads it later); project ``WANDB_PROJECT`` or ``marlhf``;
* ``trackio``: trackio's local store (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``;
  ``trackio show``); project ``TRACKIO_PROJECT`` or ``marlhf``;
* ``mlflow``: an SQLite store ``mlflow.db`` in the run directory unless ``MLFLOW_TRACKING_URI``
  names another (``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db``); experiment
  ``MLFLOW_EXPERIMENT_NAME`` or ``marlhf``.

What every tracker gets: the run's name (``<run dir>/<stage>``) and group (the run directory:
the runs ``--compare`` draws together), the config (every resolved option and the provenance
run.json keeps), every step's metrics (``train/...`` and ``eval/...``), and the tables a stage
logs (``ppo``: the completions of its evaluation steps, with ``@@`` between macro actions).

Failures: a tracker whose library is missing, or that fails to start, is a one-line error
before anything trains. One that fails later warns once and is dropped; the run goes on.

Resume: a tracker run's id is kept in ``tracking/<stage>.json``; ``--resume`` continues the
same run, and the steps the stopped process logged after its last checkpoint are removed
where the store allows it (TensorBoard, the local MLflow and trackio stores), so no step is
logged twice; W&B keeps the values it received first for those steps (docs/trackers.md).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ..errors import UserError

NAMES = ("tensorboard", "wandb", "trackio", "mlflow")
DEFAULT = "tensorboard"
INSTALL = {"wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow-skinny sqlalchemy alembic"}


def parse(text: str | None) -> list[str]:
    """``--report-to``'s trackers, in order, without repeats; ``none`` alone means none.
    Raises ValueError naming the first unknown one."""
    names = [part.strip().lower() for part in str(text if text is not None else DEFAULT).split(",") if part.strip()]
    if names == ["none"]:
        return []
    unknown = [name for name in names if name not in NAMES]
    if unknown or not names:
        raise ValueError(unknown[0] if unknown else text)
    return list(dict.fromkeys(names))


class Tracker:
    """What a tracker does for a stage; each backend module has one subclass."""

    name = "tracker"
    id: str | None = None  # what --resume reopens (None: nothing to reopen)

    def log(self, step: int, values: dict[str, float], split: str) -> None:
        raise NotImplementedError

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _backend(name: str):
    from importlib import import_module

    return import_module(f".{name}_tracker", __name__)


class Trackers:
    """Every tracker of a stage: a call reaches each; one that fails is warned about once and
    dropped, and the run goes on."""

    def __init__(self, trackers: list[Tracker], say: Callable[[str], None]):
        self.trackers = trackers
        self.say = say

    def _each(self, what: str, call) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as error:  # noqa: BLE001 - a tracker never stops training
                self.trackers.remove(tracker)
                first = (str(error).strip().splitlines() or [""])[0][:200]
                self.say(f"{tracker.name}: {what} failed ({type(error).__name__}: {first}); the run goes on without it")

    def log(self, step: int, values: dict[str, Any], split: str) -> None:
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self._each("logging", lambda t: t.log(step, numbers, split))

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        self._each("logging a table", lambda t: t.table(step, name, columns, rows))

    def close(self) -> None:
        self._each("closing", lambda t: t.close())

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.trackers]


def open_trackers(run, stage: str, names: list[str], *, config: dict, start_step: int, say: Callable[[str], None]) -> Trackers:
    """Start every tracker of ``names`` for ``stage`` of the run directory ``run`` (a RunDir):
    a fresh run from step 0, or the stopped one continued after ``start_step`` (its ids read
    from ``tracking/<stage>.json``, the steps after ``start_step`` removed where the store
    allows). A missing library or a failed start is a one-line UserError."""
    ids_file = run.path("tracking", f"{stage}.json")
    ids = json.loads(ids_file.read_text()) if start_step and ids_file.is_file() else {}
    group = run.root.resolve().name
    setting = {"run": run, "stage": stage, "name": f"{group}/{stage}", "group": group, "config": config,
               "start_step": start_step}  # fmt: skip
    trackers = []
    for name in names:
        try:
            backend = _backend(name)
        except ImportError as error:
            missing = getattr(error, "name", None) or name
            raise UserError(f"--report-to {name}: the {missing} library is not installed (pip install {INSTALL[name]}, "
                            "or pip install 'marlhf[trackers]')") from None  # fmt: skip
        try:
            trackers.append(backend.start(**setting, resume_id=ids.get(name), say=say))
        except UserError:
            raise
        except Exception as error:  # noqa: BLE001 - one line, before anything trains
            first = (str(error).strip().splitlines() or [""])[0][:200]
            raise UserError(f"--report-to {name}: the tracker did not start ({type(error).__name__}: {first})") from None
    kept = {t.name: t.id for t in trackers if t.id is not None}
    if kept:
        from ..artifacts import write_json

        write_json(ids_file, kept)
    return Trackers(trackers, say)


def flat(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as ``a.b`` keys and string values (the trackers whose parameters are flat)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out
