"""``--report-to mlflow``: an MLflow run in an SQLite store ``mlflow.db`` of the run directory
(its artifacts in ``mlflow-artifacts/`` beside it)
(``MLFLOW_TRACKING_URI`` for another store), experiment ``MLFLOW_EXPERIMENT_NAME`` or
``marlhf``; ``mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`` shows it."""

from __future__ import annotations

import os
import time

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from . import Tracker, flat


class MLflow(Tracker):
    name = "mlflow"

    def __init__(self, client: MlflowClient, run_id: str):
        self.client, self.id = client, run_id

    def log(self, step: int, values: dict[str, float], split: str) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(f"{split}/{key}", value, now, step) for key, value in values.items() if value == value]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 per batch
            self.client.log_batch(self.id, metrics=metrics[start : start + 1000])

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        data = {column: [row[i] for row in rows] for i, column in enumerate(columns)}
        self.client.log_table(self.id, data=data, artifact_file=f"{name}/step_{step:07d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.id)


def rewind(uri: str, run_id: str, step: int) -> bool:
    """Remove the metrics ``run_id`` logged after ``step`` from a local SQLite store (MLflow's
    API has no way to); False for another store."""
    if not uri.startswith("sqlite:///"):
        return False
    import sqlite3

    with sqlite3.connect(uri[len("sqlite:///"):]) as db:
        db.execute("DELETE FROM metrics WHERE run_uuid = ? AND step > ?", (run_id, step))
        # the latest value of each metric, as MLflow keeps it, from what is left
        db.execute("DELETE FROM latest_metrics WHERE run_uuid = ?", (run_id,))
        db.execute(
            "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
            "SELECT key, value, timestamp, step, is_nan, run_uuid FROM metrics m WHERE run_uuid = ? AND NOT EXISTS ("
            "SELECT 1 FROM metrics n WHERE n.run_uuid = m.run_uuid AND n.key = m.key AND "
            "(n.step > m.step OR (n.step = m.step AND n.timestamp > m.timestamp)))", (run_id,),
        )  # fmt: skip
    return True


def start(*, run, stage, name, group, config, start_step, resume_id, say) -> MLflow:
    own_store = not os.environ.get("MLFLOW_TRACKING_URI")
    uri = f"sqlite:///{run.path('mlflow.db').resolve()}" if own_store else os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(tracking_uri=uri)
    if resume_id:
        if not rewind(uri, resume_id, start_step):
            say(f"mlflow: {uri} is not a local SQLite store: the steps logged after step {start_step} stay, and are logged again")
        client.update_run(resume_id, status="RUNNING")
        return MLflow(client, resume_id)
    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "marlhf")
    found = client.get_experiment_by_name(experiment)
    # in the run directory's own store the artifacts (ppo's completions tables) go beside it;
    # MLflow's default is ./mlruns of whatever folder the command was started in
    artifacts = run.path("mlflow-artifacts").resolve().as_uri() if own_store else None
    experiment_id = found.experiment_id if found else client.create_experiment(experiment, artifact_location=artifacts)
    tracked = client.create_run(experiment_id, run_name=name, tags={"group": group, "stage": stage})
    params = [Param(key[:250], str(value)[:6000]) for key, value in flat(config).items()]
    for start in range(0, len(params), 100):
        client.log_batch(tracked.info.run_id, params=params[start : start + 100])
    return MLflow(client, tracked.info.run_id)
