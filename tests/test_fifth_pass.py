"""The fifth new-user pass: each defect it found, through the command line as the user met it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from marlhf_cli.cli import app

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def _error(result) -> str:
    """A run that failed part-way: exit 2, no traceback, the error its one line beside the
    stage's progress lines."""
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


# ---------------------------------------------------------------------------------------
# 1. --report-to none


def test_report_to_none_is_taken_from_the_flag_and_from_a_file(tmp_path):
    """It was refused everywhere ("must be none, or ..., got 'none'"): the check read the
    empty list of trackers as a failure. Now it runs, and reports to nothing."""
    for stage in ("sft", "rm", "ppo", "dpo"):
        assert _invoke(stage, "--preset", "cpu-tiny", "--report-to", "none", "--dry-run", "--run-dir", str(tmp_path)).exit_code == 0
    config = tmp_path / "none.yaml"
    config.write_text("report_to: none\n", encoding="utf-8")
    assert _invoke("ppo", "--config", str(config), "--dry-run", "--run-dir", str(tmp_path)).exit_code == 0
    assert "--report-to must be none" in _one_line(_invoke("sft", "--report-to", "nothing", "--run-dir", str(tmp_path)))
    run = tmp_path / "run"
    done = _invoke("sft", "--preset", "cpu-tiny", "--report-to", "none", "--max-steps", "2", "--run-dir", str(run))
    assert done.exit_code == 0, done.output[-2000:]
    assert (run / "sft" / "config.json").is_file() and not (run / "tb").exists()


# ---------------------------------------------------------------------------------------
# 5, 7, 9 and a duplicate key: values the options took and the run could not


@pytest.mark.parametrize("flags, words", [
    (("ppo", "--kl-coef", "inf"), "--kl-coef (config key 'kl_coef') must be a finite number, got inf"),
    (("ppo", "--actor-lr", "nan"), "must be a finite number, got nan"),
    (("sft", "--lr", "-inf"), "must be a finite number"),
    (("ppo", "--seed", "1180591620717411303424"), "--seed must be in [0, 4294967295]"),
])  # fmt: skip
def test_values_no_run_can_use_are_one_line(tmp_path, flags, words):
    assert words in _one_line(_invoke(*flags, "--dry-run", "--run-dir", str(tmp_path)))


def test_inf_stays_a_segment_length_and_the_largest_seed_runs(tmp_path):
    assert "n: inf" in _invoke("ppo", "--n", "inf", "--dry-run", "--run-dir", str(tmp_path)).output
    done = _invoke("sft", "--preset", "cpu-tiny", "--seed", str(2**32 - 1), "--max-steps", "1", "--run-dir", str(tmp_path / "run"))
    assert done.exit_code == 0, done.output[-2000:]


def test_config_files_that_are_folders_or_repeat_a_key(tmp_path):
    assert "a folder, not a config file" in _one_line(_invoke("sft", "--config", str(tmp_path), "--dry-run"))
    repeated = tmp_path / "twice.yaml"
    repeated.write_text("lr: 1.0e-3\nbatch_size: 4\nlr: 5.0e-3\n", encoding="utf-8")
    assert "duplicate key 'lr' on line 3" in _one_line(_invoke("sft", "--config", str(repeated), "--dry-run"))
    nested = tmp_path / "nested.yaml"
    nested.write_text("ppo:\n  kl_coef: 0.1\n  kl_coef: 0.2\n", encoding="utf-8")
    assert "duplicate key 'kl_coef'" in _one_line(_invoke("ppo", "--config", str(nested), "--dry-run"))


@pytest.fixture(scope="module")
def broken_models(tmp_path_factory):
    """A causal LM and a reward model, each with one weight that is NaN."""
    pytest.importorskip("gguf")
    import torch

    from marlhf_cli.models import load_causal_lm, load_reward_model, load_tokenizer

    root = tmp_path_factory.mktemp("broken")
    policy, reward = load_causal_lm("tiny"), load_reward_model("tiny")
    with torch.no_grad():
        policy.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
        reward.score.weight[0, 0] = float("nan")
    for name, model in (("policy", policy), ("rm", reward)):
        model.save_pretrained(root / name)
        load_tokenizer("tiny").save_pretrained(root / name)
    return root


def _status(run_dir, stage: str) -> str:
    import json

    return json.loads((run_dir / "run.json").read_text())["stages"][stage]["status"]


def test_a_loss_or_a_score_that_is_not_finite_stops_the_run_in_error(tmp_path, broken_models):
    """It trained on NaN and ended in a TypeError with run.json "running": now the step says
    which numbers are not finite, the stage is marked failed, and nothing diverged is kept."""
    sft = _invoke("sft", "--preset", "cpu-tiny", "--model", str(broken_models / "policy"), "--max-steps", "4",
                  "--run-dir", str(tmp_path / "sft"))  # fmt: skip
    assert "sft: the loss of step 1 is nan (not finite)" in _error(sft) and _status(tmp_path / "sft", "sft") == "failed"
    ppo = ["ppo", "--preset", "cpu-tiny", "--max-steps", "3", "--save-every", "1", "--eval-every", "0"]
    scores = _invoke(*ppo, "--policy", "tiny", "--reward-model", str(broken_models / "rm"), "--run-dir", str(tmp_path / "rm"))
    assert "step 1: 8 of 8 scores are not finite" in _error(scores) and _status(tmp_path / "rm", "ppo/fixed5") == "failed"
    policy = _invoke(*ppo, "--policy", str(broken_models / "policy"), "--reward-model", "tiny", "--run-dir", str(tmp_path / "pi"))
    line = _error(policy)
    assert "step 1: the rollout has" in line and "log-probs" in line and "not finite" in line
    assert not list((tmp_path / "pi" / "ppo" / "fixed5" / "checkpoints").glob("**/step-*"))


# ---------------------------------------------------------------------------------------
# 8, and marlhf push's own words offline


@pytest.mark.slow
def test_a_critic_free_runs_card_names_no_critic_and_push_offline_speaks_for_itself(tmp_path, monkeypatch):
    base = ("ppo", "--preset", "cpu-tiny", "--policy", "tiny", "--reward-model", "tiny", "--max-steps", "1", "--eval-every", "0",
            "--run-dir", str(tmp_path))  # fmt: skip
    assert _invoke(*base, "--advantage", "grpo").exit_code == 0
    assert _invoke(*base).exit_code == 0
    grpo = _invoke("push", str(tmp_path / "ppo" / "grpo"), "me/grpo", "--dry-run")
    gae = _invoke("push", str(tmp_path / "ppo" / "fixed5"), "me/fixed5", "--dry-run")
    assert grpo.exit_code == gae.exit_code == 0
    assert "critic from" not in grpo.output and "| critic from | `tiny` |" in gae.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _one_line(_invoke("push", str(tmp_path / "ppo" / "grpo"), "me/grpo"))
    assert line.startswith("error: marlhf push: the Hub is unreachable") and "--push-to-hub" not in line


# ---------------------------------------------------------------------------------------
# 10. a reward model that is not one, a policy that is a reward model


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """A causal-LM folder and a reward-model folder (tiny shapes)."""
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_causal_lm, load_reward_model, load_tokenizer

    root = tmp_path_factory.mktemp("heads")
    for name, model in (("lm", load_causal_lm("tiny")), ("rm", load_reward_model("tiny"))):
        model.save_pretrained(root / name)
        load_tokenizer("tiny").save_pretrained(root / name)
    return root


def test_a_model_whose_head_does_not_fit_its_role_is_refused_unless_asked(tmp_path, heads):
    """A causal LM as the reward model scored with a new, random head, and a reward model as
    the policy loaded silently: both are one line now, before any weight loads."""
    lm, rm = str(heads / "lm"), str(heads / "rm")
    ppo = ("ppo", "--preset", "cpu-tiny", "--max-steps", "1", "--eval-every", "0", "--run-dir")
    line = _one_line(_invoke(*ppo, str(tmp_path / "a"), "--policy", "tiny", "--reward-model", lm))
    assert "is a causal LM, not a reward model" in line and "--allow-new-head" in line
    assert "is a reward model" in _one_line(_invoke(*ppo, str(tmp_path / "b"), "--policy", rm, "--reward-model", "tiny"))
    assert "is a reward model" in _one_line(_invoke("dpo", "--preset", "cpu-tiny", "--policy", rm, "--run-dir", str(tmp_path / "c")))
    assert "is a causal LM" in _one_line(_invoke("bon", "--policy", "tiny", "--reward-model", lm, "--run-dir", str(tmp_path / "d")))
    asked = _invoke(*ppo, str(tmp_path / "e"), "--policy", "tiny", "--reward-model", lm, "--allow-new-head")
    assert asked.exit_code == 0 and "is a causal LM, not a reward model" in asked.output and "(--allow-new-head)" in asked.output
    plumbing = _invoke(*ppo, str(tmp_path / "f"), "--policy", "tiny", "--reward-model", "tiny")
    assert plumbing.exit_code == 0 and "the reward model tiny is random-init" in plumbing.output


# ---------------------------------------------------------------------------------------
# 4. a damaged checkpoint


def _sft(run_dir, *extra: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "marlhf_cli.cli", "sft", "--preset", "cpu-tiny", "--max-steps", "6", "--save-every", "2",
            "--eval-every", "0", "--lr-scheduler", "constant", "--seed", "4", "--dtype", "fp32", "--report-to", "none",
            "--run-dir", str(run_dir), *extra]  # fmt: skip


def _train_rows(run_dir) -> list[dict]:
    from marlhf_cli.artifacts import read_jsonl

    return [{k: v for k, v in r.items() if k not in ("step_time", "time")} for r in read_jsonl(run_dir / "metrics" / "sft.jsonl")]


@pytest.mark.slow
def test_resume_skips_a_damaged_checkpoint_for_the_whole_one_before_it(tmp_path):
    """Truncate the newest checkpoint's model file, or empty its trainer state, after a
    SIGKILL: --resume names what is damaged, resumes from the checkpoint before it, and ends
    where the uninterrupted run ends (it was a PytorchStreamReader or JSONDecodeError
    traceback, the intact earlier checkpoint unused). One killed run, copied once per damage."""
    import shutil
    import subprocess

    from test_ppo_resume import environment, kill_once_saved, run_here

    from marlhf_cli import checkpoints

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_here(_sft(straight))
    proc = subprocess.Popen(_sft(killed), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    kill_once_saved(proc, killed / "sft" / "checkpoints" / "step-000004" / "trainer_state.json")
    assert (killed / "sft" / "checkpoints" / "step-000002" / "trainer_state.json").is_file()  # the one before stays
    for damage in ("truncate", "empty-state"):
        run_dir = tmp_path / damage
        shutil.copytree(killed, run_dir)
        newest = run_dir / "sft" / "checkpoints" / "step-000004"
        if damage == "truncate":
            model = next(newest.rglob("*model_states.pt"))
            model.write_bytes(model.read_bytes()[:1000])
            why = f"{model.relative_to(newest).as_posix()} is 1,000 bytes"
        else:
            (newest / "trainer_state.json").write_text("")
            why = "trainer_state.json is empty or not JSON"
        resumed = subprocess.run(_sft(run_dir, "--resume"), env=environment(), capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"--resume: skipped step-000004 ({why}" in resumed.stderr and "resuming from step-000002" in resumed.stderr
        assert _train_rows(run_dir) == _train_rows(straight), damage
        # the damaged one is set aside, kept to look at: never counted among the two kept, never the latest
        folder = run_dir / "sft" / "checkpoints"
        assert (folder / ".damaged-step-000004").is_dir()
        assert "damaged" not in checkpoints.latest_checkpoint(folder).name


def test_every_checkpoint_damaged_is_one_line(tmp_path):
    from marlhf_cli import checkpoints
    from marlhf_cli.checksums import write_manifest

    root = tmp_path / "run" / "sft" / "checkpoints"
    for step in (2, 4):
        folder = root / checkpoints.tag_for(step)
        folder.mkdir(parents=True)
        (folder / "weights.pt").write_bytes(b"x" * 100)
        write_manifest(folder, leave_out=(checkpoints.STATE_FILE,))
        (folder / checkpoints.STATE_FILE).write_text('{"step": %d}' % step)
        (folder / "weights.pt").write_bytes(b"y" * 100)  # the same size, other bytes
    found, skipped = checkpoints.resumable(root)
    assert found is None and [s.split(" ")[0] for s in skipped] == ["step-000004", "step-000002"]
    assert "weights.pt has changed since it was written" in skipped[0]
    (root / "step-000002" / "manifest.json").write_text("[]")  # JSON, but not a manifest: a reason, not a traceback
    assert checkpoints.resumable(root)[1][1] == "step-000002 (manifest.json holds no entries of sizes and checksums)"


def test_ppo_resumes_the_newest_step_whose_actor_and_critic_are_both_whole(tmp_path):
    from marlhf_cli import checkpoints
    from marlhf_cli.checksums import write_manifest
    from marlhf_cli.train.ppo.checkpointing import resumable_common

    for role in ("actor", "critic"):
        for step in (2, 4):
            folder = tmp_path / role / checkpoints.tag_for(step)
            folder.mkdir(parents=True)
            (folder / "mp_rank_00_model_states.pt").write_bytes(b"w" * 64)
            write_manifest(folder, leave_out=(checkpoints.STATE_FILE,))
            (folder / checkpoints.STATE_FILE).write_text('{"step": %d}' % step)
    (tmp_path / "critic" / "step-000004" / "mp_rank_00_model_states.pt").write_bytes(b"w" * 10)
    (found_actor, found_critic), skipped = resumable_common(tmp_path, critic=True)
    assert found_actor.name == found_critic.name == "step-000002"
    assert skipped == ["critic/step-000004: mp_rank_00_model_states.pt is 10 bytes, 64 when written"]
    (found_actor, _), skipped = resumable_common(tmp_path, critic=False)  # the actor alone is whole at step 4
    assert found_actor.name == "step-000004" and not skipped


# ---------------------------------------------------------------------------------------
# 3. a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB filesystem (tmpfs): room for one of the tiny model's checkpoints (39 MB), not two."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root, or CAP_SYS_ADMIN)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_is_one_line_that_keeps_the_last_checkpoint(small_disk):
    """It was two tracebacks, run.json "running" and a 21 MB .tmp-step-* left behind."""
    from marlhf_cli import checkpoints
    from marlhf_cli.checksums import problem

    run = small_disk / "run"
    done = _invoke("sft", "--preset", "cpu-tiny", "--max-steps", "6", "--save-every", "2", "--eval-every", "0", "--dtype", "fp32",
                   "--report-to", "none", "--run-dir", str(run))  # fmt: skip
    line = _error(done)
    assert line.startswith("error: the disk is full: the checkpoint of step 4 could not be written") and "step-000002 stands" in line
    folder = run / "sft" / "checkpoints"
    assert [p.name for p in folder.iterdir() if p.name.startswith(".tmp")] == []
    assert [p.name for p in checkpoints.list_checkpoints(folder)] == ["step-000002"]
    assert problem(folder / "step-000002", checkpoints.STATE_FILE) is None  # whole: --resume can take it
    assert _status(run, "sft") == "failed"


# ---------------------------------------------------------------------------------------
# 2. two processes on one run directory and stage


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["ppo"])
def test_a_second_writer_of_a_stage_is_refused_and_a_killed_holder_blocks_nothing(tmp_path, stage):
    """Two `marlhf ppo` runs of the same name on one run directory both exited 0 with every
    metrics row twice: the second now stops in one line naming the first's process, and once
    the first is SIGKILLed the next run starts."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_ppo_resume import environment

    run = tmp_path / "run"
    args = {"ppo": ["ppo", "--preset", "cpu-tiny", "--policy", "tiny", "--reward-model", "tiny", "--max-steps", "400",
                    "--eval-every", "0", "--save-every", "0"],
            "sft": ["sft", "--preset", "cpu-tiny", "--max-steps", "4000", "--eval-every", "0", "--save-every", "0"]}[stage]  # fmt: skip
    command = [sys.executable, "-m", "marlhf_cli.cli", *args, "--report-to", "none", "--run-dir", str(run)]
    first = subprocess.Popen(command + ["--seed", "1"], env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    try:
        metrics = run / "metrics" / (f"{stage}-fixed5.jsonl" if stage == "ppo" else "sft.jsonl")
        deadline = time.time() + 240
        while not metrics.is_file() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, "the first run ended before the second started"
        second = subprocess.run(command + ["--seed", "2"], env=environment(), capture_output=True, text=True, timeout=120)
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert second.returncode == 2 and len(errors) == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
        key = "ppo/fixed5" if stage == "ppo" else "sft"
        assert f"{key} in {run} is being written by process {first.pid}" in errors[0]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    shorter = [("1" if previous == "--max-steps" else arg) for previous, arg in zip(["", *args], args)]
    third = _invoke(*shorter, "--report-to", "none", "--run-dir", str(run))
    assert third.exit_code == 0, third.output[-2000:]


@pytest.mark.parametrize("stage", ["sft", "rm", "dpo"])
def test_every_stage_takes_its_lock_before_it_loads_anything(tmp_path, stage):
    """The other stages hold the same lock as ppo (above, with two real runs): a process that
    holds ``.locks/<stage>.lock`` (a small Python one here, no model) makes the stage stop in
    one line that names it."""
    import subprocess
    import sys

    run = tmp_path / "run"
    lock = run / ".locks" / f"{stage}.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"handle = open({str(lock)!r}, 'a+')\n"
        "fcntl.flock(handle.fileno(), fcntl.LOCK_EX)\n"
        "handle.write(f'process {os.getpid()} (a test)\\n'); handle.flush()\n"
        "print('held', flush=True); time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        if stage != "sft":  # rm and dpo start from the run's sft/: its config is enough to get to the lock
            (run / "sft").mkdir()
            (run / "sft" / "config.json").write_text("{}")
        line = _error(_invoke(stage, "--preset", "cpu-tiny", "--report-to", "none", "--run-dir", str(run)))
        assert f"{stage} in {run} is being written by process {holder.pid} (a test)" in line
    finally:
        holder.kill()
        holder.wait(timeout=30)


# ---------------------------------------------------------------------------------------
# 6. a step whose responses cannot fit


def test_a_step_too_large_for_the_machine_is_one_line_before_any_weight_loads(tmp_path):
    """--tree-branches 1000 announced millions of responses a step and ran out of memory after
    224 s; now the responses' KV cache is weighed against the free memory first."""
    result = _invoke("ppo", "--preset", "cpu-tiny", "--policy", "tiny", "--reward-model", "tiny", "--advantage", "tree",
                     "--tree-branches", "1000", "--max-steps", "1", "--run-dir", str(tmp_path))  # fmt: skip
    line = _error(result)
    assert "a step samples 8,000,000 responses" in line and "GiB is free" in line and "--tree-branches" in line
    assert not (tmp_path / "ppo").exists() and "policy tiny, reward" not in result.output  # no model was built


def test_a_run_directory_that_cannot_be_locked_is_written_unlocked_with_a_note(tmp_path, monkeypatch, capsys):
    """A filesystem without flock (some NFS and FUSE mounts answer ENOLCK) is not another
    process holding the lock: the stage says so and writes, unlocked."""
    import errno
    import fcntl

    from marlhf_cli.artifacts import RunDir

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with RunDir(tmp_path).writing("sft"):
        written = True
    assert written and "cannot be locked (No locks available)" in capsys.readouterr().err


def test_a_diverged_loss_says_which_checkpoint_can_be_trusted():
    """The step whose loss is not finite ran on the weights of the update before it: a
    checkpoint written right after that update may hold them; an older one stands. Either way
    the way on is a new run at a lower rate (a --resume repeats the same steps)."""
    from marlhf_cli.train.loop import diverged

    right_after, older = str(diverged("sft", 5, float("nan"), 4)), str(diverged("sft", 5, float("nan"), 2))
    assert "the checkpoint of step 4 was written after the update before this loss and may hold diverged weights" in right_after
    assert "the checkpoint of step 2 stands, but a --resume would repeat these steps" in older
    assert all(message.endswith("start again with a lower --lr") for message in (right_after, older))
