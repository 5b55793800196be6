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
