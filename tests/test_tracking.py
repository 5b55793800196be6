"""``--report-to`` (marlhf_cli/tracking) and ``--push-to-hub`` / ``marlhf push``
(marlhf_cli/hub_push.py), offline: every tracker's local store read back (the config, a metric
series, the completions table with its ``@@`` marks), a stopped run resumed into the same
tracker runs with no step logged twice, one-line errors, and the Hub upload's card and files."""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from marlhf_cli import tracking
from marlhf_cli.errors import UserError

ALL = "tensorboard,wandb,trackio,mlflow"


def _have(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_trackers = pytest.mark.skipif(not _have("wandb", "trackio", "mlflow", "sqlalchemy"),
                                    reason="the trackers' libraries are not installed (pip install 'marlhf[trackers]')")  # fmt: skip


@pytest.fixture
def offline_stores(tmp_path, monkeypatch):
    """Every tracker local, in this test's folder (trackio reads TRACKIO_DIR when imported:
    the runs below are fresh processes, or import it after this)."""
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "TRACKIO_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


# ---------------------------------------------------------------------------------------
# reading each store back


def tensorboard_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def tensorboard_texts(folder: Path, tag: str) -> dict[int, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(f"{tag}/text_summary")}


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (its LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, header = run_file.read_bytes(), 32768, 7
    pos, out, pending = 7, [], b""
    while pos + header <= len(data):
        if block - pos % block < header:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        chunk, pos = data[pos + header : pos + header + length], pos + header + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def wandb_runs(run_dir: Path) -> list[dict]:
    """Each offline run folder: its id, config, history rows by step, and tables."""
    runs = []
    for folder in sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*"))):
        (run_file,) = glob.glob(f"{folder}/run-*.wandb")
        info = {"id": None, "config": {}, "history": {}, "folder": Path(folder)}
        for record in wandb_records(Path(run_file)):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                info["id"] = record.run.run_id
                info["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                info["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
                info["history"].setdefault(row["_step"], {}).update(row)
        runs.append(info)
    return runs


def trackio_rows(store: Path, run_name: str) -> list[tuple[int, dict]]:
    with sqlite3.connect(store / "marlhf.db") as db:
        return [(step, json.loads(m)) for step, m in db.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (run_name,))]


def mlflow_client(run_dir: Path):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")


# ---------------------------------------------------------------------------------------


def test_report_to_is_read_as_a_list_and_checked():
    assert tracking.parse(None) == ["tensorboard"] and tracking.parse("none") == []
    assert tracking.parse(" MLflow, wandb ,mlflow") == ["mlflow", "wandb"]
    with pytest.raises(ValueError, match="comet"):
        tracking.parse("tensorboard,comet")


def _ppo_command(run_dir: Path, steps: int, *extra: str) -> list[str]:
    """``marlhf ppo`` on the tiny model, every tracker (a process of its own: trackio reads
    TRACKIO_DIR once, when imported)."""
    import sys

    return [sys.executable, "-m", "marlhf_cli.cli", "ppo", "--run-dir", str(run_dir), "--policy", "tiny", "--reward-model", "tiny",
            "--dataset", "tldr", "--rollout-batch-size", "4", "--mini-batch-size", "4", "--max-new-tokens", "8",
            "--max-prompt-length", "48", "--max-steps", str(steps), "--save-every", "2", "--eval-every", "2", "--eval-prompts", "2",
            "--seed", "3", "--name", "run", "--report-to", ALL, *extra]  # fmt: skip


def _environment() -> dict:
    from test_ppo_resume import environment

    return environment() | {k: os.environ[k] for k in ("TRACKIO_DIR", "WANDB_MODE", "WANDB_SILENT")}


@needs_trackers
@pytest.mark.slow
def test_every_tracker_gets_the_config_the_metrics_and_the_completions(offline_stores):
    run_dir = offline_stores / "run"
    done = subprocess.run(_ppo_command(run_dir, 3), env=_environment(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics" / "ppo-run.jsonl").read_text().splitlines()]
    scores = {r["step"]: r["score"] for r in rows if r["split"] == "train"}
    ids = json.loads((run_dir / "tracking" / "ppo-run.json").read_text())
    assert set(ids) == {"wandb", "trackio", "mlflow"}  # TensorBoard has no run to reopen: its folder is the run

    # TensorBoard: scalars, the config, the completions as a Markdown table at steps 2 and 3
    assert [s for s, _ in tensorboard_scalars(run_dir / "tb" / "ppo-run", "train/score")] == [1, 2, 3]
    assert tensorboard_scalars(run_dir / "tb" / "ppo-run", "train/score")[0][1] == pytest.approx(scores[1], rel=1e-6)
    texts = tensorboard_texts(run_dir / "tb" / "ppo-run", "completions")
    assert sorted(texts) == [2, 3] and "@@" in texts[2] and "| prompt | response | score | segment_advantages |" in texts[2]
    assert '"report_to": "tensorboard,wandb,trackio,mlflow"' in tensorboard_texts(run_dir / "tb" / "ppo-run", "config")[0]

    # W&B, offline: the run, its config with the provenance, the history, the table file
    (run,) = wandb_runs(run_dir)
    assert run["id"] == ids["wandb"] and run["config"]["termination"] == "fixed" and run["config"]["provenance"]["marlhf"]
    assert run["history"][1]["train/score"] == pytest.approx(scores[1], rel=1e-6)
    assert run["history"][2]["completions/_type"] == "table-file"
    table = json.loads((run["folder"] / "files" / run["history"][2]["completions/path"]).read_text())
    assert table["columns"] == ["prompt", "response", "score", "segment_advantages"] and "@@" in table["data"][0][1]

    # trackio's local store
    logged = trackio_rows(offline_stores / "trackio", ids["trackio"])
    assert [step for step, m in logged if "train/score" in m] == [1, 2, 3]
    tables = [m["completions"]["_value"] for step, m in logged if "completions" in m]
    assert len(tables) == 2 and "@@" in tables[0][0]["response"]

    # MLflow's SQLite store, through its client
    client = mlflow_client(run_dir)
    tracked = client.get_run(ids["mlflow"])
    assert tracked.data.params["termination"] == "fixed" and tracked.data.tags["group"] == "run"
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "train/score")] == [1, 2, 3]
    artifact = Path(client.download_artifacts(ids["mlflow"], "completions/step_0000002.json", str(offline_stores / "art")))
    data = json.loads(artifact.read_text())
    assert data["columns"] == ["prompt", "response", "score", "segment_advantages"] and "@@" in data["data"][0][1]


@needs_trackers
@pytest.mark.slow
def test_a_stopped_run_resumes_into_the_same_tracker_runs_with_no_step_twice(offline_stores):
    """Ctrl-C (SIGINT) once the step-2 checkpoint exists (the process may have logged step 3
    before it stops), then --resume: the same W&B id (a new offline folder of it, from step
    3), trackio run and MLflow run, each step once in TensorBoard, trackio and MLflow."""
    import signal
    import time

    run_dir = offline_stores / "run"
    command, env = _ppo_command(run_dir, 5), _environment()
    # SIGINT as at a terminal: a shell's background job (the suite run as `... &`) starts its
    # children with SIGINT ignored, and the run would then finish instead of stopping
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    marker, deadline = run_dir / "ppo" / "run" / "checkpoints" / "critic" / "latest", time.time() + 300
    while not marker.is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130, "the run ended before Ctrl-C reached it"
    first = json.loads((run_dir / "tracking" / "ppo-run.json").read_text())
    done = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run_dir / "tracking" / "ppo-run.json").read_text()) == first  # the same runs, reopened

    assert [s for s, _ in tensorboard_scalars(run_dir / "tb" / "ppo-run", "train/score")] == [1, 2, 3, 4, 5]
    runs = wandb_runs(run_dir)  # (a folder of the killed process may end before its run record)
    assert {r["id"] for r in runs} - {None} == {first["wandb"]} and runs[-1]["id"] == first["wandb"]
    assert sorted(step for step, row in runs[-1]["history"].items() if "train/score" in row) == [3, 4, 5]
    logged = [step for step, m in trackio_rows(offline_stores / "trackio", first["trackio"]) if "train/score" in m]
    assert logged == [1, 2, 3, 4, 5]
    history = mlflow_client(run_dir).get_metric_history(first["mlflow"], "train/score")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]


def test_a_missing_library_or_a_tracker_that_will_not_start_is_one_line(tmp_path, monkeypatch):
    from marlhf_cli.artifacts import RunDir

    def absent(name):
        raise ImportError("No module named 'wandb'", name="wandb")

    monkeypatch.setattr(tracking, "_backend", absent)
    with pytest.raises(UserError, match=r"--report-to wandb: the wandb library is not installed \(pip install wandb"):
        tracking.open_trackers(RunDir(tmp_path), "sft", ["wandb"], config={}, start_step=0, say=print)

    class Broken:
        @staticmethod
        def start(**kwargs):
            raise ConnectionError("no route to the server\nmore")

    monkeypatch.setattr(tracking, "_backend", lambda name: Broken)
    with pytest.raises(UserError, match=r"^--report-to mlflow: the tracker did not start \(ConnectionError: no route to the server\)$"):
        tracking.open_trackers(RunDir(tmp_path), "sft", ["mlflow"], config={}, start_step=0, say=print)


def test_a_tracker_that_fails_mid_run_is_dropped_with_one_warning():
    said, logged = [], []

    class Flaky(tracking.Tracker):
        name = "flaky"

        def log(self, step, values, split):
            raise OSError("disk full")

    class Fine(tracking.Tracker):
        name = "fine"

        def log(self, step, values, split):
            logged.append((step, values))

        def table(self, step, name, columns, rows):
            logged.append((step, name))

    trackers = tracking.Trackers([Flaky(), Fine()], said.append)
    for step in (1, 2):
        trackers.log(step, {"score": 0.5, "name": "x", "flag": True}, "train")
    trackers.table(2, "completions", ["a"], [["b"]])
    assert said == ["flaky: logging failed (OSError: disk full); the run goes on without it"]
    assert logged == [(1, {"score": 0.5}), (2, {"score": 0.5}), (2, "completions")] and trackers.names == ["fine"]


def test_the_completions_rows_mark_each_macro_action_and_its_advantage():
    import torch

    from marlhf_cli.models import load_tokenizer
    from marlhf_cli.train.ppo.completions import marked, rows

    tokenizer = load_tokenizer("tiny")
    ids = tokenizer(" one two three four five", add_special_tokens=False)["input_ids"]
    n = len(ids)

    class Rollout:
        batch_size, prompts = 1, ["x" * 400]
        response_ids, mask = torch.tensor([ids + [0]]), torch.tensor([[1] * n + [0]])
        segment_ids = torch.tensor([[0, 0, 1, 1, 2, 2][:n] + [2]])
        advantages = torch.tensor([[0.5, 0.5, -0.25, -0.25, 1.0, 1.0][:n] + [0.0]])
        raw_scores = torch.tensor([0.75])

    (row,) = rows(Rollout(), tokenizer)
    assert row[0] == "..." + "x" * 300 and row[2] == 0.75
    assert row[1] == " one two@@ three four@@ five@@" and row[3] == "+0.500 -0.250 +1.000"
    assert marked(["a ", "b\n"]) == "a@@ b@@\n"


def _finished_stage(tmp_path) -> Path:
    from marlhf_cli.artifacts import RunDir
    from marlhf_cli.models import load_causal_lm, load_tokenizer

    run = RunDir(tmp_path / "run")
    folder = run.stage_dir("ppo", "fixed5")
    load_causal_lm("tiny").save_pretrained(folder)
    load_tokenizer("tiny").save_pretrained(folder)
    (folder / "checkpoints" / "actor").mkdir(parents=True)
    (folder / "checkpoints" / "actor" / "latest").write_text("step2")
    run.record_stage("ppo/fixed5", config={"dataset": "tldr", "termination": "fixed", "n": 5},
                     inputs={"policy": "tiny", "reward_model": "tiny", "reward": "rm", "source": "embedded:tldr",
                             "credit_assignment": "MA-PPO (macro actions: fixed n=5; value function equal; token ratio)"},
                     metrics={"steps": 4, "eval_score": 0.25}, status="finished")  # fmt: skip
    return folder


def test_the_push_sends_the_export_and_a_card_and_never_the_checkpoints(tmp_path, monkeypatch):
    from marlhf_cli import hub_push

    folder = _finished_stage(tmp_path)
    files, card = hub_push.plan(folder, "me/tldr-ma-ppo")
    assert "README.md" in files and "model.safetensors" in files and "config.json" in files
    assert not any(f.startswith("checkpoints") for f in files)
    for needle in ("# me/tldr-ma-ppo", "| stage | `ppo/fixed5` |", "| base | `tiny` |", "fixed n=5", "| steps | 4 |",
                   "| eval_score | 0.25 |", "| dataset | `tldr` (embedded:tldr) |"):  # fmt: skip
        assert needle in card, needle
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"^--push-to-hub me/x: the Hub is unreachable \(offline mode \(HF_HUB_OFFLINE\)\); nothing was uploaded"):
        hub_push.push(folder, "me/x", print)
    with pytest.raises(ValueError):
        hub_push.check_repo_id("not a repo")
    with pytest.raises(UserError, match="no finished 'sft' stage"):
        (tmp_path / "run" / "sft").mkdir()
        (tmp_path / "run" / "sft" / "config.json").write_text("{}")
        hub_push.plan(tmp_path / "run" / "sft", "me/x")


def test_marlhf_push_dry_run_and_its_errors(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    folder = _finished_stage(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(app, ["push", str(folder), "me/tldr", "--dry-run"])
    assert shown.exit_code == 0, shown.output
    assert "| stage | `ppo/fixed5` |" in shown.output and "files to upload to me/tldr: README.md" in shown.output
    bad = runner.invoke(app, ["push", str(folder), "no slash"])
    assert bad.exit_code == 2 and "'no slash' is not a Hub repository id" in bad.output


def test_deepspeed_loads_without_mlflow_and_leaves_it_importable():
    """DeepSpeed's autotuner imports mlflow whenever it is installed, a second of every
    stage's start; the engine hides it while DeepSpeed loads (marlhf never autotunes)."""
    pytest.importorskip("mlflow")
    code = ("import sys\nfrom marlhf_cli import engine\nengine._import_deepspeed()\n"
            "print('mlflow' in sys.modules)\nimport mlflow\nprint(mlflow.__name__)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "mlflow"]


@needs_trackers
def test_mlflow_keeps_its_artifacts_in_the_run_directory(offline_stores, monkeypatch):
    """Not in ./mlruns of the folder the command was started in (MLflow's default)."""
    from marlhf_cli.artifacts import RunDir

    elsewhere = offline_stores / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = RunDir(offline_stores / "run")
    trackers = tracking.open_trackers(run, "ppo", ["mlflow"], config={"lr": 1}, start_step=0, say=print)
    trackers.table(2, "completions", ["response"], [["a @@ b"]])
    trackers.close()
    assert list(elsewhere.iterdir()) == []
    assert [p.name for p in (offline_stores / "run" / "mlflow-artifacts").rglob("*.json")] == ["step_0000002.json"]
