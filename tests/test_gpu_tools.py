"""The GPU suite's helpers that run anywhere: the wheel check (benchmarks/gpu/check_wheels.py),
the FLOP count and bf16 peaks (benchmarks/_flops.py), and the scripts' syntax."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "gpu"))

import _flops  # noqa: E402
import check_wheels  # noqa: E402


def _wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                          *(f"Requires-Dist: {r}" for r in requires), "", "A description."])  # fmt: skip
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
    return path


def test_a_complete_set_passes_and_markers_and_extras_are_evaluated(tmp_path):
    _wheel(tmp_path, "alpha", "1.0", "beta>=2", "numpy>=1.17", "torch", "gamma; python_version < '3.10'",
           "delta; extra == 'docs'", "typing-extensions>=4.5; python_version < '3.13'")  # fmt: skip
    _wheel(tmp_path, "beta", "2.1")
    _wheel(tmp_path, "typing_extensions", "4.16.0")
    assert check_wheels.check_here(tmp_path) == []


def test_missing_outside_the_range_and_twice_are_each_named(tmp_path):
    _wheel(tmp_path, "alpha", "1.0", "beta<2", "nosuchpackage", "transformers>=6")
    _wheel(tmp_path, "beta", "2.1")
    _wheel(tmp_path, "beta", "2.2")
    problems = "\n".join(check_wheels.check_here(tmp_path))
    assert "beta twice" in problems
    assert "needs beta<2, carried beta 2.2" in problems
    assert "needs nosuchpackage: neither carried nor on the machine" in problems
    assert "the machine has transformers 5.17.0" in problems  # a version KINDS.md states


def test_carrying_what_the_machine_has_is_reported(tmp_path):
    _wheel(tmp_path, "transformers", "5.17.0")
    assert "the machine already has transformers 5.17.0" in "\n".join(check_wheels.check_here(tmp_path))


def test_installed_mode_reads_this_interpreter(tmp_path):
    _wheel(tmp_path, "pytest", "0.0.1", "pluggy>=0.1", "nosuchpackage")
    missing, outside = check_wheels.check_installed(tmp_path)
    assert any("nosuchpackage" in line for line in missing)
    assert any(line.startswith("pytest:") for line in outside)  # another pytest is found first


def test_the_pinned_list_has_one_exact_version_of_each():
    lines = [line.split("#")[0].strip() for line in (BENCH / "gpu" / "wheels.txt").read_text().splitlines()]
    pins = [line for line in lines if line]
    names = [pin.split("==")[0].lower().replace("_", "-") for pin in pins]
    assert all(pin.count("==") == 1 for pin in pins) and len(set(names)) == len(names)
    assert {"deepspeed", "datasets", "openai", "trl"} <= set(names)


@pytest.mark.parametrize("script", ["fetch_wheels.sh", "install.sh", "suite.sh"])
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu" / script)]).returncode == 0


def test_suite_refuses_a_bad_stage_or_device_in_one_line(tmp_path):
    for args in (["bench", str(tmp_path)], ["speed", str(tmp_path), "--device", "tpu"]):
        done = subprocess.run(["bash", str(BENCH / "gpu" / "suite.sh"), *args], capture_output=True, text=True)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    "name, peak",
    [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.4),
     ("NVIDIA GH200 480GB", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10", 125.0), ("NVIDIA L40S", 362.05),
     ("NVIDIA L4", 121.0), ("NVIDIA GeForce RTX 4090", 165.2), ("Tesla T4", None)],
)  # fmt: skip
def test_bf16_peak_by_device_name(monkeypatch, name, peak):
    monkeypatch.delenv(_flops.PEAK_ENV, raising=False)
    assert _flops.bf16_peak(name)[0] == peak
    monkeypatch.setenv(_flops.PEAK_ENV, "100")
    assert _flops.bf16_peak(name)[0] == 100.0


def test_flops_count_every_matrix_of_the_model():
    """2 FLOPs per weight of every block's linear layers per token, plus the vocabulary head on
    the response tokens and causal attention, counted from a real model's parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    tokens, head_tokens = 10, 4
    attention = 3 * 2 * 64 * sum(range(1, tokens + 1))  # layers x (QK^T + AV) x width x sum of contexts
    want = 2 * (linear * tokens + 64 * 100 * head_tokens + attention)
    assert _flops.sequence_forward_flops(config, tokens, head_tokens=head_tokens) == pytest.approx(want)
    # a PPO step: policy forwards for sampling and reference, three scalar-model forwards
    # (values, reward; no critic for RLOO/GRPO: one), and forward + backward of what trains
    policy = _flops.sequence_forward_flops(config, 30, head_tokens=20)
    scalar = _flops.sequence_forward_flops(config, 30)
    step = _flops.ppo_step_flops(config, responses=8, prompt_tokens=10, response_tokens=20, epochs=2)
    assert step == pytest.approx(8 * (2 * policy + 2 * scalar + 2 * 3 * (policy + scalar)))
    critic_free = _flops.ppo_step_flops(config, responses=8, prompt_tokens=10, response_tokens=20, critic=False)
    assert critic_free == pytest.approx(8 * (2 * policy + scalar + 3 * policy))
    figures = _flops.gpu_figures(2e12, 2.0, "NVIDIA A100-SXM4-80GB")
    assert figures["tflops"] == pytest.approx(1.0) and figures["share_of_peak"] == pytest.approx(1 / 312)


def test_the_suites_junit_file_keeps_recorded_properties_without_a_warning(tmp_path):
    """tests/test_gpu.py records the samplers' gaps with record_property; under the project's
    pytest settings they reach the JUnit file, and pytest does not warn about the family."""
    repo = Path(__file__).resolve().parents[1]
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_gap(record_property):\n    record_property('max_abs_gap', 0.25)\n")
    xml = tmp_path / "out.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(repo / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-W", "error::pytest.PytestWarning", "--junitxml", str(xml), str(probe)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert '<property name="max_abs_gap" value="0.25"' in xml.read_text()
