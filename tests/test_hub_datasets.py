"""``--dataset owner/name``: any Hugging Face Hub dataset in a format marlhf reads, through
``datasets.load_dataset`` (tests have no hub: the rows are handed over where the library
would fetch them, and the offline refusal runs the real library where something could be
cached)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlhf_cli.cli import app
from marlhf_cli.data import loader
from marlhf_cli.errors import UserError

ROWS = [{"prompt": f"Name a colour, {i}.", "chosen": f"Blue {i}.", "rejected": f"Soup {i}."} for i in range(30)]


@pytest.fixture
def hub(monkeypatch):
    """The hub as the loader sees it: load_hub_rows(spec, split) answers with ROWS."""
    asked = []

    def rows(spec, split):
        asked.append((spec.repo, spec.config, split))
        return iter(ROWS)

    monkeypatch.setattr(loader, "load_hub_rows", rows)
    return asked


def test_a_hub_id_reads_like_a_file_of_ones_own(hub):
    result = loader.load_records("trl-lib/toy-prefs", split="rm", dataset_config="small", dataset_split="train")
    assert hub == [("trl-lib/toy-prefs", "small", "train")]
    assert result.source == "hub:trl-lib/toy-prefs (small, train)" and result.dataset == "trl"
    held_out = loader.load_records("trl-lib/toy-prefs", split="eval", dataset_config="small")
    assert len(result.records) + len(held_out.records) == 30  # whole to each stage, 10% held out
    assert result.records[0].keys() >= {"prompt", "chosen", "rejected"}
    assert loader.is_hub_id("trl-lib/ultrafeedback_binarized") and not loader.is_hub_id("prefs.jsonl")
    loader.check_source("trl-lib/ultrafeedback_binarized")  # no longer "unknown dataset"
    with pytest.raises(UserError, match="or a Hugging Face Hub id"):
        loader.check_source("nonsense")


def test_sft_trains_on_a_hub_dataset(hub, tmp_path):
    args = ["sft", "--model", "tiny", "--dataset", "me/prefs", "--dataset-split", "train", "--max-steps", "1",
            "--batch-size", "4", "--eval-every", "0", "--save-every", "0", "--run-dir", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "training on 27 of the 30 records of hub:me/prefs (train)" in result.output
    inputs = json.loads((tmp_path / "run.json").read_text())["stages"]["sft"]["inputs"]
    assert inputs["source"] == "hub:me/prefs (train)" and inputs["dataset"] == "me/prefs"


def test_an_offline_hub_id_not_in_the_cache_is_one_line(tmp_path):
    """Offline with an empty cache (nothing for the library to look at: it is not imported):
    one line naming the id and the variable to unset, exit 2."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
    command = [sys.executable, "-m", "marlhf_cli.cli", "sft", "--model", "tiny", "--dataset",
               "trl-lib/ultrafeedback_binarized", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: --dataset trl-lib/ultrafeedback_binarized: offline (HF_HUB_OFFLINE")
    assert "Traceback" not in done.stderr


@pytest.fixture
def hf_caches(tmp_path, monkeypatch):
    """Empty Hugging Face caches: (where datasets keeps prepared copies, the hub's downloads)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "datasets", tmp_path / "hf" / "hub"


def test_offline_with_nothing_cached_answers_before_importing_datasets(hf_caches, monkeypatch):
    """datasets (with pandas and pyarrow, most of a second) is imported only where a copy could
    be: here an import would fail, so each answer says which way the loader went."""
    from marlhf_cli.data.hub import HubSpec, HubUnreachable, load_hub_rows

    prepared, downloaded = hf_caches
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    spec = HubSpec("someone/some_thing")
    with pytest.raises(HubUnreachable, match="not in the local cache"):
        load_hub_rows(spec, "train")
    for folder in (prepared / "someone___some_thing", prepared / "someone___other", downloaded / "datasets--someone--some_thing"):
        folder.mkdir(parents=True)
        with pytest.raises(HubUnreachable, match="'datasets' package is not installed"):  # it went to the library
            load_hub_rows(spec, "train")
        folder.rmdir()
    with pytest.raises(HubUnreachable, match="not in the local cache"):  # another owner's copy is not this one
        (prepared / "else___some_thing").mkdir()
        load_hub_rows(spec, "train")


def test_offline_where_a_copy_could_be_the_real_library_looks_and_refuses_in_one_line(hf_caches, monkeypatch):
    from marlhf_cli.data import hub

    prepared, _ = hf_caches
    (prepared / "marlhf-tests___another").mkdir(parents=True)  # the owner has something cached: datasets looks
    looked = []
    real_load = hub._load
    monkeypatch.setattr(hub, "_load", lambda *args: looked.append(args[1].repo) or real_load(*args))
    with pytest.raises(UserError, match=r"^--dataset marlhf-tests/no-such-dataset: offline \(HF_HUB_OFFLINE"):
        loader.load_records("marlhf-tests/no-such-dataset", split="sft")
    assert looked == ["marlhf-tests/no-such-dataset"]
