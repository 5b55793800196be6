"""A --run-dir nothing can be written to is one line and exit code 2, before anything loads.

"Unwritable" for root, who runs the tests here: permission bits do not stop root, so the
cases are a path that is (or runs through) a regular file, a folder of a kernel file system
no one may create entries in (/sys), and a read-only mount (in a private mount namespace,
where the machine allows one); a folder without write permission where the tests do not
run as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlhf_cli.cli import app

from test_option_values import STAGES as ALL_STAGES, stages_unreachable  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent
STAGES = {command: module for command, module in ALL_STAGES.items() if command != "segment"}  # they write
ARGS = {"judge": ["a.jsonl", "b.jsonl", "--rm"], "passk": ["--model", "tiny"], "bon": ["--policy", "tiny"]}


def _invoke(command: str, run_dir: Path):
    return CliRunner().invoke(app, [command, *ARGS.get(command, []), "--run-dir", str(run_dir)], env={"COLUMNS": "80"})


def _one_line(result, *words: str) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: --run-dir"), result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", sorted(STAGES))
def test_a_file_is_no_run_directory(stages_unreachable, tmp_path, command):
    existing = tmp_path / "notes.txt"
    existing.write_text("a file")
    _one_line(_invoke(command, existing), str(existing), "is a file")
    # a path through a file: nothing can ever be created under it
    _one_line(_invoke(command, existing / "run" / "inner"), str(existing), "is a file")


def test_a_folder_no_one_may_write_in(stages_unreachable):
    if not Path("/sys").is_dir():
        pytest.skip("no /sys here")
    line = _one_line(_invoke("sft", Path("/sys/marlhf-run")), "cannot write")
    assert "/sys" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="permission bits do not stop root")
def test_a_folder_without_write_permission(stages_unreachable, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    _one_line(_invoke("sft", locked / "run"), "cannot write")


def test_a_read_only_mount_in_a_fresh_process(tmp_path):
    """The real command in a private mount namespace: a read-only tmpfs, root or not."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    mount = tmp_path / "ro"
    mount.mkdir()
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from marlhf_cli.cli import main\n"
        f"sys.argv = ['marlhf', 'sft', '--preset', 'cpu-tiny', '--run-dir', {str(mount / 'run')!r}]\n"
        "main()\n"
    )
    script = f"mount -t tmpfs -o ro tmpfs {mount} && exec {sys.executable} -c \"$0\""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(["unshare", "-m", "sh", "-c", script, code], capture_output=True, text=True, env=env, timeout=120)
    if "mount:" in result.stderr:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")
    assert result.returncode == 2, result.stderr
    error, loaded = result.stderr.strip().splitlines()
    assert error.startswith(f"error: --run-dir {mount / 'run'}: cannot write in {mount}") and "Read-only" in error
    assert loaded == "torch loaded: False"


def test_dry_run_and_segment_need_no_run_directory(tmp_path):
    existing = tmp_path / "notes.txt"
    existing.write_text("a file")
    dry = CliRunner().invoke(app, ["sft", "--run-dir", str(existing), "--dry-run"])
    assert dry.exit_code == 0 and f"run_dir: {existing}" in dry.output
    text = tmp_path / "in.txt"
    text.write_text("x = 1")
    shown = CliRunner().invoke(app, ["segment", str(text), "--tokenizer", "tiny"])
    assert shown.exit_code == 0, shown.output


def test_a_writable_run_directory_is_left_as_it_was(tmp_path):
    """The check writes nothing: no folder is created and no probe is left behind."""
    from marlhf_cli.artifacts import check_run_dir

    check_run_dir(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "run").mkdir()
    check_run_dir(tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []


def test_run_json_records_what_a_run_ran_on_and_a_resume_says_what_changed(tmp_path, monkeypatch):
    """run.json held no commit, CPU or GPU: a saved run re-executed on a CPU without AVX-512
    departed at step 4 with nothing to say why. Each stage's entry records them, checkpoints
    carry them, and --resume notes (does not refuse) what differs."""
    from marlhf_cli import checkpoints, provenance
    from marlhf_cli.artifacts import RunDir, write_json

    run = RunDir(tmp_path)
    entry = run.record_stage("sft", config={"seed": 1}, status="running")
    made = entry["provenance"]
    assert made["marlhf"] and made["command"] and made["cpu"]["model"] and isinstance(made["gpus"], list)
    assert set(made["cpu"]["flags"]) <= set(provenance.CPU_FLAGS) and entry["versions"]["torch"]
    folder = tmp_path / "checkpoint"
    then = {**provenance.provenance(), "cpu": {"model": "Intel(R) Xeon(R)", "flags": ["avx2", "avx512f"]},
            "versions": {**provenance.library_versions(), "transformers": "5.17.0"}}  # fmt: skip
    write_json(folder / checkpoints.STATE_FILE, {"config": None, "fingerprint": {}, "step": 2, "provenance": then})
    (note,) = checkpoints.check_fingerprint(folder, {})
    assert note.startswith("--resume: the checkpoint was written with transformers 5.17.0, now ")
    assert "CPU Intel(R) Xeon(R), now " in note and "may depart" in note
    write_json(folder / checkpoints.STATE_FILE, {"config": None, "fingerprint": {}, "step": 2, "provenance": provenance.provenance()})
    assert checkpoints.check_fingerprint(folder, {}) == []  # nothing changed: nothing said
