"""A run whose stderr is a log file: progress lines appear while it runs (not only at the
end), and Ctrl-C or SIGTERM (a scheduler's time limit) records "interrupted" in run.json, with
exit code 130 or 143."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from _toy_prefs import write_toy_preferences
from marlhf_cli.train.progress import LogLines, due


def test_a_line_is_due_at_the_first_step_every_n_steps_or_seconds_and_at_the_end():
    lines, last, clock = [], None, 0.0
    for step in range(1, 101):
        clock += 0.5 if step < 50 else 30.0  # steps get slow halfway
        if due(step, last, clock - (lines[-1][1] if lines else 0.0), 100, every_steps=20, every_seconds=60):
            lines.append((step, clock))
            last = step
    steps = [s for s, _ in lines]
    assert steps[:3] == [1, 21, 41]  # every 20 steps while fast
    assert steps[3:6] == [51, 53, 55]  # every 60 s once a step takes 30 s
    assert steps[-1] == 100


def test_log_lines_are_plain_and_name_step_total_and_metrics(tmp_path):
    log = (tmp_path / "log").open("w")
    lines = LogLines("sft", 40, 0, stream=log)
    for step in range(1, 41):
        lines.advance(step, {"loss": 9.634123, "lr": 0.001})
    log.close()
    text = (tmp_path / "log").read_text().splitlines()
    assert [line.split()[2] for line in text] == [f"{s}/40" for s in (1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 40)]
    assert text[0].startswith("sft step 1/40 (2%), 0:00:00 elapsed") and text[0].endswith(": loss 9.634  lr 0.001")
    assert "\x1b" not in "".join(text)  # no terminal control codes in a log


def test_every_held_out_evaluation_is_one_line_on_the_console(tmp_path, capsys):
    """Evaluations (ppo at steps 0, 4, 8; sft's --eval-every) were only in the metrics files:
    the monitor prints one line per evaluation, above the bar or among the log lines."""
    from marlhf_cli.artifacts import RunDir
    from marlhf_cli.train.monitor import Monitor

    monitor = Monitor(RunDir(tmp_path), "ppo-fixed5", total_steps=8, start_step=0, enabled=True, live=False)
    monitor.log(1, {"score": 0.1, "kl": 0.0}, "train")
    monitor.log(4, {"score": 0.123456, "response_length": 20.5, "eos_rate": 0.25, "prompts": 8.0}, "eval")
    monitor.log(2, {"loss": 1.5, "perplexity": 4.4817}, "eval")
    monitor.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["ppo-fixed5 eval at step 4: score 0.1235  response_length 20.5  eos_rate 0.25",
                     "ppo-fixed5 eval at step 2: loss 1.5  perplexity 4.482"]  # fmt: skip


def test_marlhf_plots_0_skips_the_curves_and_anything_else_draws_them(tmp_path, monkeypatch):
    """The suite's MARLHF_PLOTS=0 (tests/conftest.py) leaves plots/ out; a user, without it,
    gets every curve."""
    from marlhf_cli.artifacts import RunDir
    from marlhf_cli.train.monitor import Monitor

    run = RunDir(tmp_path)
    monitor = Monitor(run, "sft", total_steps=2, start_step=0, enabled=True, live=False)
    monitor.log(1, {"loss": 2.0})
    monitor.log(2, {"loss": 1.5})
    monitor.close()
    monkeypatch.setenv("MARLHF_PLOTS", "0")
    assert monitor.plot("loss") is None and not (tmp_path / "plots").exists()
    monkeypatch.delenv("MARLHF_PLOTS")
    assert monitor.plot("loss") == run.plot_path("sft-loss") and run.plot_path("sft-loss").stat().st_size > 1000


def _env() -> dict:
    from marlhf_cli import launch

    env = launch.launcher_free_env()
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", COLUMNS="80")
    return env


@pytest.mark.slow
def test_a_logged_run_shows_progress_and_ctrl_c_marks_it_interrupted(tmp_path):
    data = write_toy_preferences(tmp_path / "prefs.jsonl")
    run_dir, log_path = tmp_path / "run", tmp_path / "sft.log"
    command = [sys.executable, "-m", "marlhf_cli.cli", "sft", "--model", "tiny", "--dataset", str(data),
               "--run-dir", str(run_dir), "--batch-size", "2", "--max-steps", "400", "--eval-every", "0",
               "--save-every", "0", "--max-prompt-length", "16", "--max-response-length", "8"]  # fmt: skip
    with log_path.open("w") as log:
        # SIGINT as at a terminal: a shell's background job starts with SIGINT ignored, and
        # Python then installs no KeyboardInterrupt handler (the suite run as `... &`)
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=_env(), cwd=tmp_path,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        try:
            deadline = time.time() + 240
            while time.time() < deadline and child.poll() is None and "sft step 21/400" not in log_path.read_text():
                time.sleep(0.1)
            assert child.poll() is None, log_path.read_text()[-2000:]
            # written while the run goes on: what a killed run's log keeps
            running = log_path.read_text()
            assert "sft step 1/400 (0%)" in running and "sft step 21/400 (5%)" in running, running[-2000:]
            assert json.loads((run_dir / "run.json").read_text())["stages"]["sft"]["status"] == "running"
            child.send_signal(signal.SIGINT)
            assert child.wait(timeout=120) == 130
        finally:
            if child.poll() is None:
                child.kill()
    text = log_path.read_text()
    assert "━" not in text and "\x1b" not in text  # no bar drawn into the file
    assert text.rstrip().endswith("interrupted (sft marked so in run.json)"), text[-1000:]
    entry = json.loads((run_dir / "run.json").read_text())["stages"]["sft"]
    assert entry["status"] == "interrupted" and entry["inputs"]["train_records"] > 0  # the rest of the entry stays


def _sigterm_after_first_step(tmp_path, *extra: str) -> tuple[int, str, dict]:
    data = write_toy_preferences(tmp_path / "prefs.jsonl")
    run_dir, log_path = tmp_path / "run", tmp_path / "sft.log"
    command = [sys.executable, "-m", "marlhf_cli.cli", "sft", "--model", "tiny", "--dataset", str(data),
               "--run-dir", str(run_dir), "--batch-size", "2", "--max-steps", "400", "--eval-every", "0",
               "--save-every", "0", "--max-prompt-length", "16", "--max-response-length", "8", *extra]  # fmt: skip
    with log_path.open("w") as log:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=_env(), cwd=tmp_path)
        try:
            deadline = time.time() + 240
            while time.time() < deadline and child.poll() is None and "sft step 1/400" not in log_path.read_text():
                time.sleep(0.1)
            assert child.poll() is None, log_path.read_text()[-2000:]
            child.send_signal(signal.SIGTERM)  # to this process only, as `kill PID` does
            code = child.wait(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
    return code, log_path.read_text(), json.loads((run_dir / "run.json").read_text())["stages"]["sft"]


@pytest.mark.slow
def test_sigterm_marks_the_run_interrupted_and_exits_143(tmp_path):
    """What a batch scheduler does at a job's time limit: SIGTERM, then SIGKILL a while later."""
    code, log, entry = _sigterm_after_first_step(tmp_path)
    assert code == 143, log[-2000:]
    assert log.rstrip().endswith("terminated (sft marked interrupted in run.json)"), log[-2000:]
    assert entry["status"] == "interrupted"


@pytest.mark.slow
def test_sigterm_to_an_nproc_run_reaches_its_workers(tmp_path):
    """``--nproc 2``: the signal goes to the process the user started, which passes it to
    torchrun, which stops its workers; they mark the run (not left running without a parent)."""
    code, log, entry = _sigterm_after_first_step(tmp_path, "--nproc", "2")
    assert code == 143, log[-2000:]
    assert entry["status"] == "interrupted", log[-2000:]
    assert entry["inputs"]["processes"] == 2


def test_a_command_run_in_process_leaves_sigterm_as_it_found_it(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(app, ["segment", "-", "--rule", "fixed", "--n", "2"], input="one two three four")
    assert result.exit_code == 0, result.output
    assert "@@" in result.output
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_while_a_checkpoint_is_written_says_where_a_resume_starts(tmp_path, capsys):
    """Ctrl-C lands inside a checkpoint's writing: the line says that checkpoint is not
    complete and the step a resume starts from (the previous complete one)."""
    import torch
    import typer

    from marlhf_cli import checkpoints, options

    root = tmp_path / "checkpoints"
    (root / checkpoints.tag_for(1)).mkdir(parents=True)
    (root / checkpoints.tag_for(1) / checkpoints.STATE_FILE).write_text('{"step": 1}')

    class Engine:
        module = torch.nn.Linear(1, 1)  # not adapted, whether or not an earlier test imported peft

        def save_checkpoint(self, *args, **kwargs):
            raise KeyboardInterrupt

    @options.user_errors
    def command():
        checkpoints.save_checkpoint(Engine(), root, 2, {})

    with pytest.raises(typer.Exit) as stop:
        command()
    assert stop.value.exit_code == 130
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())
    # (a stage an earlier test of this process left running adds "(X marked so in run.json)")
    assert said.startswith("interrupted")
    assert ": the checkpoint of step 2 was being written and is not complete; --resume starts from step 1" in said
    assert checkpoints.interrupted_checkpoint() is None  # nothing is being written any more
