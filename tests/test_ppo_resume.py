"""``marlhf ppo`` as a user runs it: SIGKILL then --resume reproduces the uninterrupted run,
and a two-process ZeRO-2 run works (both through the real command line, in subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marlhf_cli.artifacts import read_jsonl

pytestmark = pytest.mark.slow

NAME = "randomized"
# per process or per machine: timings, and the static-cache buckets a process made (a resumed
# process makes its own: marlhf_cli/generation/compiled.py)
VOLATILE = ("time", "step_time", "generation_time", "scoring_time", "credit_time", "training_time", "tokens_per_second",
            "generation_captures", "generation_replays")


def command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "marlhf_cli.cli", "ppo", "--run-dir", str(run_dir),
        "--policy", "tiny", "--reward-model", "tiny", "--termination", "randomized",
        "--rollout-batch-size", "4", "--mini-batch-size", "2", "--ppo-epochs", "2",
        "--max-new-tokens", "8", "--max-prompt-length", "48", "--actor-lr", "1e-3", "--critic-lr", "1e-3",
        "--max-steps", "8", "--save-every", "2", "--eval-every", "3", "--eval-prompts", "2", "--seed", "3", *extra,
    ]  # fmt: skip


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


def run_here(args: list[str]) -> None:
    """The uninterrupted reference run of ``args`` (a :func:`command`), in this process: the
    same numbers as a ``marlhf`` process (with one torch thread here too), without that
    process's 5 s of imports. The runs that are killed and resumed stay real processes."""
    import torch
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    assert args[:3] == [sys.executable, "-m", "marlhf_cli.cli"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(app, args[3:])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output[-3000:]


def metrics(run_dir: Path) -> list[dict]:
    rows = read_jsonl(run_dir / "metrics" / f"ppo-{NAME}.jsonl")
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


def kill_once_saved(proc: subprocess.Popen, marker: Path) -> None:
    """SIGKILL the run's process group as soon as ``marker`` (a checkpoint's pointer) exists."""
    deadline = time.time() + 240
    try:
        while not marker.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"


# the resume tests below run 6 steps: killed after the step-2 checkpoint, the resumed run still
# crosses an evaluation (3, 6) and a checkpoint (4) before its end
RESUMED_RUN = ("--max-steps", "6")


# bit-exact within a precision; bf16 restores the fp32 masters and the optimizer's state too,
# which covers what an fp32 run restores (its twin in fp32 cost the suite 30 s)
@pytest.mark.parametrize("dtype", ["bf16"])
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path, dtype):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_here(command(straight, "--dtype", dtype, *RESUMED_RUN))

    proc = subprocess.Popen(
        command(killed, "--dtype", dtype, *RESUMED_RUN), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    kill_once_saved(proc, killed / "ppo" / NAME / "checkpoints" / "critic" / "latest")
    assert not (killed / "ppo" / NAME / "config.json").exists()

    resumed = subprocess.run(
        command(killed, "--dtype", dtype, *RESUMED_RUN, "--resume"), env=environment(), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    assert metrics(killed) == metrics(straight)
    assert read_jsonl(killed / "samples" / f"{NAME}.jsonl") == read_jsonl(straight / "samples" / f"{NAME}.jsonl")


def test_resume_refuses_a_checkpoint_written_with_other_options(tmp_path):
    first = subprocess.run(
        command(tmp_path, "--max-steps", "3", "--save-every", "1", "--eval-prompts", "0"),
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    other = subprocess.run(
        command(tmp_path, "--max-steps", "3", "--rollout-batch-size", "8", "--actor-lr", "2e-3", "--resume", "--eval-prompts", "0"),
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert other.returncode == 2
    # every changed option, each with its old and new value (the learning rate was once ignored silently)
    message = other.stderr.replace("\n", " ")
    assert "--rollout-batch-size was 4, now 8" in message and "--actor-lr was 0.001, now 0.002" in message
    assert "Traceback" not in other.stderr


def test_two_processes_with_zero2(tmp_path):
    result = subprocess.run(
        command(tmp_path, "--nproc", "2", "--zero-stage", "2", "--max-steps", "2", "--save-every", "0", "--eval-every", "1"),
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes" in result.stderr
    rows = read_jsonl(tmp_path / "metrics" / f"ppo-{NAME}.jsonl")
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]
    assert len(read_jsonl(tmp_path / "samples" / f"{NAME}.jsonl")) == 2
    assert (tmp_path / "ppo" / NAME / "config.json").is_file()


@pytest.mark.parametrize(
    "name,flags",
    [("mc-randomized-k2", ("--advantage", "mc", "--samples-per-prompt", "2", "--mc-rollouts", "2")),
     ("tree-randomized", ("--advantage", "tree", "--tree-branches", "2", "--tree-depth", "2"))],
)  # fmt: skip
def test_sampling_estimators_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path, name, flags):
    """--advantage mc and tree: every continuation's (mc) or tree completion's seed derives from
    (seed, step, response or tree, position), so a resumed run samples the same and repeats
    the run exactly."""
    volatile = VOLATILE + ("continuation_time",)

    def mc_command(run_dir: Path, *extra: str) -> list[str]:
        base = command(run_dir, *flags, *RESUMED_RUN, *extra)
        at = base.index("--critic-lr")  # no critic: the flag would be an error
        return base[:at] + base[at + 2 :]

    def history(run_dir: Path) -> list[dict]:
        rows = read_jsonl(run_dir / "metrics" / f"ppo-{name}.jsonl")
        return [{k: v for k, v in row.items() if k not in volatile} for row in rows]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_here(mc_command(straight))
    proc = subprocess.Popen(
        mc_command(killed), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    kill_once_saved(proc, killed / "ppo" / name / "checkpoints" / "actor" / "latest")
    resumed = subprocess.run(mc_command(killed, "--resume"), env=environment(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    rows = history(straight)
    sampled = "continuation_tokens" if name.startswith("mc") else "shared_prefix_tokens"  # what the estimator drew beside the responses
    assert all(row[sampled] > 0 for row in rows if row["split"] == "train")
    assert history(killed) == rows
    assert read_jsonl(killed / "samples" / f"{name}.jsonl") == read_jsonl(straight / "samples" / f"{name}.jsonl")
    assert not (killed / "ppo" / name / "critic").exists()
