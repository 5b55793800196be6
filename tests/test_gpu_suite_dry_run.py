"""benchmarks/gpu/suite.sh on the CPU (--device cpu: the tiny model, a few steps), so that a
GPU's first minutes never meet a script that cannot run.

The speed stage (decode_cost.py, mc_cost.py, vs_trl.py, the report) and a failing part run with the other
slow tests. The whole dry run takes minutes on a 2-core CPU, more than the test budget allows,
so the study stage and the tests stage (here with one of tests/test_gpu.py's tests) run only
with MARLHF_SUITE_DRY_RUN=1; benchmarks/gpu/README.md gives the full dry run's commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SUITE = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "suite.sh"


# set in this process by the in-process tests' process group: a child that inherited them
# would try to listen on the port this process still holds (TRL's workers read them)
PROCESS_GROUP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _suite(stage: str, out: Path, **env: str) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if k not in PROCESS_GROUP}
    environment = dict(inherited, PYTHON=sys.executable, MARLHF_SITE=str(out / "no-site"), OMP_NUM_THREADS="1", **env)
    return subprocess.run(["bash", str(SUITE), stage, str(out), "--device", "cpu"], env=environment,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _trl_importable() -> bool:
    return subprocess.run([sys.executable, "-c", "import trl"], capture_output=True).returncode == 0


def test_first_stage(tmp_path):
    """The first minute on a GPU: every check PASS or FAIL on its own line, a JSON of them."""
    done = _suite("first", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    checks = json.loads((tmp_path / "first.json").read_text())["checks"]
    assert [c["check"] for c in checks] == ["sampling ops", "exact in fp32", "stale weights", "bf16 gap",
                                            "ms per token, batch 8", "ms per token, batch 64"]  # fmt: skip
    assert all(c["status"] == "PASS" for c in checks) and "# first contact on cpu: 6 of 6 passed" in done.stdout
    assert "# suite first passed" in done.stdout


def test_speed_stage(tmp_path):
    done = _suite("speed", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "# device: CPU" in done.stdout and "# suite speed passed" in done.stdout
    for name, batches in (("tiny", ((2, 8), (4, 16))), ("tiny-as-large", ((2, 8),))):  # a GPU's two shapes, tiny here
        decode = json.loads((tmp_path / f"decode-{name}.json").read_text())
        assert decode["dtype"] == "bf16" and decode["captures"] == len(batches)  # one bucket per batch shape, made once
        assert {(r["prompts"], r["new_tokens"], r["generation"]) for r in decode["rows"]} == {
            (p, t, g) for p, t in batches for g in ("eager", "compiled")}  # fmt: skip
        assert all(r["response_length"] > 0 and r["ms_per_token"] > 0 and 0 < r["generation_share"] < 1 for r in decode["rows"])
    lora = json.loads((tmp_path / "decode-tiny-as-large-lora4.json").read_text())
    assert lora["lora_rank"] == 4 and [r["generation"] for r in lora["rows"]] == ["compiled"]
    mc = json.loads((tmp_path / "mc_cost-tiny.json").read_text())["configs"]
    assert set(mc) == {"rloo", "mc-ppl-m2"} and mc["mc-ppl-m2"]["over_rloo"] > 1 and mc["mc-ppl-m2"]["continuation_s"] > 0
    if _trl_importable():
        tools = json.loads((tmp_path / "vs_trl-tiny.json").read_text())["tools"]
        assert set(tools) == {"marlhf", "trl-core"} and all(t["tokens_per_step"] > 0 for t in tools.values())
    else:
        assert "vs_trl tiny: SKIPPED in the dry run" in done.stdout
    summary = {row["figure"]: row for row in json.loads((tmp_path / "speed.json").read_text())}
    assert summary["tiny 2x8: ms per generated token"]["eager"] > 0 and summary["tiny 2x8: ms per generated token"]["compiled"] > 0
    assert summary["tiny 2 prompts x K=2: mc (ppl, M=2) step / rloo step"]["goal"] == "<= 2x"
    assert "tiny-as-large-lora4: LoRA rank 4 PPO peak GPU memory (GiB)" in summary  # no GPU: no figure, the row stays
    dpo = json.loads((tmp_path / "dpo-tiny.json").read_text())["models"]["tiny"]
    assert dpo["medians"]["marlhf"] > 0 and summary["tiny: DPO step, 8 pairs (s)"]["compiled"] > 0
    assert (tmp_path / "speed.png").stat().st_size > 1000
    assert (tmp_path / "speed.log").read_text() == done.stdout  # the log is what was printed


FULL = pytest.mark.skipif(os.environ.get("MARLHF_SUITE_DRY_RUN") != "1", reason="the full dry run: MARLHF_SUITE_DRY_RUN=1")


@FULL
def test_study_stage(tmp_path):
    done = _suite("study", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    study = json.loads((tmp_path / "credit_scale.json").read_text())
    assert study["seeds"] == [0] and set(study["tasks"]) == {"target", "prefix"}
    for table in study["tasks"].values():
        assert set(table) == {"ppo-lam0.95", "ppo-lam1.0", "fixed5", "grpo"}
        assert all(len(s["curves"]) == 1 and len(s["curves"][0]) == 2 for s in table.values())
    assert (tmp_path / "credit_scale.png").stat().st_size > 1000


@FULL
def test_tests_stage_runs_the_gpu_tests_on_the_cpu(tmp_path):
    done = _suite("tests", tmp_path, MARLHF_SUITE_PYTEST_ARGS="-k sampler")
    assert done.returncode == 0, done.stdout[-3000:]
    report = (tmp_path / "tests.xml").read_text()
    assert report.count("<testcase ") == 1 and 'failures="0"' in report and 'errors="0"' in report
    assert "bfloat16_max_abs_gap" in report  # the sampler's measured gap, kept for the record


def test_a_failing_part_fails_the_stage_and_the_rest_still_runs(tmp_path):
    done = _suite("tests", tmp_path, MARLHF_SUITE_PYTEST_ARGS="-k no_such_test")
    assert done.returncode == 1
    assert "# suite tests FAILED: pytest -m gpu (exit 5)" in done.stdout  # pytest: nothing collected
