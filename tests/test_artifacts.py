import json
import multiprocessing
import os
import signal
import time

import pytest

from marlhf_cli import artifacts
from marlhf_cli.errors import UserError


def test_atomic_write_replaces_content(tmp_path):
    target = tmp_path / "a" / "f.json"
    artifacts.write_json(target, {"x": 1})
    artifacts.write_json(target, {"x": 2})
    assert json.loads(target.read_text()) == {"x": 2}
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]  # no temp file left behind


def test_exception_mid_write_leaves_old_file_intact(tmp_path):
    target = tmp_path / "f.txt"
    artifacts.write_text(target, "old")
    with pytest.raises(RuntimeError):
        with artifacts.atomic_path(target) as tmp:
            tmp.write_text("half of the new cont")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def _slow_writer(path, started):
    def rows():
        for i in range(10_000_000):
            if i == 1000:
                started.set()
            yield {"i": i, "pad": "x" * 50}

    artifacts.write_jsonl(path, rows())


def test_sigkill_mid_write_leaves_old_file_intact(tmp_path):
    target = tmp_path / "samples.jsonl"
    artifacts.write_jsonl(target, [{"old": True}])
    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()
    proc = ctx.Process(target=_slow_writer, args=(target, started))
    proc.start()
    assert started.wait(30)
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert artifacts.read_jsonl(target) == [{"old": True}]


def test_read_jsonl_tolerates_a_torn_last_line_only(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    assert artifacts.read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": \n{"a": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        artifacts.read_jsonl(path)


def test_manifest_records_config_inputs_versions(tmp_path):
    run = artifacts.RunDir(tmp_path / "run")
    run.record_stage("sft", config={"lr": 1e-3}, inputs={"dataset": "tldr"})
    run.record_stage("sft", metrics={"loss": 1.5})
    run.record_stage("rm", config={"lr": 1e-5}, status="running")
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    sft = manifest["stages"]["sft"]
    assert sft["config"] == {"lr": 1e-3} and sft["inputs"] == {"dataset": "tldr"}
    assert sft["metrics"] == {"loss": 1.5} and "torch" in sft["versions"]
    assert manifest["stages"]["rm"]["status"] == "running"


def test_require_names_the_command_to_run(tmp_path):
    run = artifacts.RunDir(tmp_path / "r")
    with pytest.raises(UserError, match=r"sft is missing: run 'marlhf sft --run-dir .*' first"):
        run.require("sft")
    with pytest.raises(UserError, match=r"run 'marlhf ppo --name vanilla"):
        run.require("ppo", "vanilla")
    (tmp_path / "r" / "sft").mkdir(parents=True)
    (tmp_path / "r" / "sft" / "config.json").write_text("{}")
    assert run.require("sft") == tmp_path / "r" / "sft"


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=["umask022", "umask077", "umask002"])
def umask(request):
    """Run the test under a given umask (restored afterwards)."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_current_umask_reads_without_changing_it(umask):
    assert artifacts.current_umask() == umask
    assert artifacts.current_umask() == umask  # reading did not reset it


def test_atomic_writes_honour_the_umask(tmp_path, umask):
    """The temporary file is 0600; renamed as is, run.json and samples were unreadable to
    colleagues whatever the umask."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = [
        artifacts.write_json(tmp_path / "run.json", {"x": 1}),
        artifacts.write_jsonl(tmp_path / "samples" / "a.jsonl", [{"x": 1}]),
        artifacts.write_text(tmp_path / "t.txt", "x"),
        artifacts.write_bytes(tmp_path / "b.bin", b"x"),
        artifacts.write_figure(tmp_path / "plots" / "p.png", plt.figure()),
    ]
    plain = tmp_path / "plain"
    plain.write_text("x")  # what the umask gives any other file
    assert _mode(plain) == 0o666 & ~umask
    assert {p.name: _mode(p) for p in written} == {p.name: 0o666 & ~umask for p in written}


def test_exported_model_files_honour_the_umask(tmp_path, umask, tokenizer):
    """save_pretrained writes model.safetensors 0600 (safetensors' own temporary file)."""
    from types import SimpleNamespace

    from marlhf_cli import checkpoints
    from marlhf_cli.models import load_causal_lm

    out = tmp_path / "ppo" / "run"
    checkpoints.export_pretrained(SimpleNamespace(module=load_causal_lm("tiny")), out, tokenizer=tokenizer)
    modes = {p.name: _mode(p) for p in out.iterdir()}
    assert "model.safetensors" in modes and "config.json" in modes
    assert modes == {name: 0o666 & ~umask for name in modes}


def test_model_cache_folders_honour_the_umask(tmp_path, umask):
    """Converted models are cached through a mkdtemp folder (0700) renamed into place."""
    from marlhf_cli.models import _fill_cache_folder

    folder = _fill_cache_folder(tmp_path / "cache" / "m", lambda tmp: (tmp / "w.bin").write_bytes(b"x"))
    assert _mode(folder) == 0o777 & ~umask
    assert _mode(folder / "w.bin") == 0o666 & ~umask
