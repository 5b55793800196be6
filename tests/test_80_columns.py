"""Everything a user reads is whole at 80 columns: help, the judge table, the progress bar."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from marlhf_cli.cli import app

COMMAND = typer.main.get_command(app)
WIDTH = {"COLUMNS": "80"}
CUT = ("…", "...")  # what rich and click put where they cut text


def _no_cuts(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= 80, f"wider than 80 columns: {line!r}"
        # '[names]...' is click's notation for a repeated argument, not a cut
        plain = re.sub(r"(\]|\bnames)\.\.\.", "", line)
        assert not any(mark in plain for mark in CUT), f"cut: {line!r}"


@pytest.mark.parametrize("name", sorted(COMMAND.commands))
def test_help_at_80_columns_shows_every_flag_whole(name):
    result = CliRunner().invoke(app, [name, "--help"], env=WIDTH)
    assert result.exit_code == 0
    _no_cuts(result.output)
    words = set(re.findall(r"--[a-z0-9-]+", result.output))
    for param in COMMAND.commands[name].params:
        for flag in (*param.opts, *param.secondary_opts):
            if flag.startswith("--"):
                assert flag in words, f"'{name} --help' does not show {flag} whole"
    assert "<bool>" not in result.output  # a plain flag takes no value
    assert "\\[" not in result.output  # markup escapes are not for the reader


def test_command_list_at_80_columns_is_not_cut():
    result = CliRunner().invoke(app, ["--help"], env=WIDTH)
    assert result.exit_code == 0
    _no_cuts(result.output)
    for name, command in COMMAND.commands.items():
        assert f"{name}  " in result.output and command.get_short_help_str(limit=200) in result.output


def test_judge_table_at_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    from rich.console import Console

    from marlhf_cli.evaluate import tables

    monkeypatch.setattr(tables, "console", Console())  # reads COLUMNS now
    summary = {
        "pairs": 50, "win": 31, "tie": 4, "loss": 15, "win_rate": 0.62, "win_rate_ci": (0.482, 0.741),
        "win_rate_ties_half": 0.66, "length_controlled": {"win_rate": 0.5871}, "sign_test_p": 0.0237,
        "unparsed": 0, "failed": 0, "mean_words_a": 41.2, "mean_words_b": 38.9,
    }  # fmt: skip
    tables.judge_table("samples-fixed5-vs-samples-vanilla", {"gpt-4o-2024-05-13": summary, "rm": summary})
    out = capsys.readouterr().out
    _no_cuts(out)
    for header in tables.JUDGE_ROWS:
        assert header in out
    for value in ("62.0% [48.2, 74.1]", "58.7%", "0.0237", "gpt-4o-2024-05-13", "samples-fixed5-vs-samples-vanilla"):
        assert value in out


def test_progress_bar_at_80_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    from marlhf_cli.artifacts import RunDir
    from marlhf_cli.train.monitor import Monitor

    monitor = Monitor(RunDir(tmp_path), "ppo-fixed5", total_steps=100, start_step=0, enabled=True)
    monitor.advance(37, {"score": -0.123456, "kl": 0.0123456, "seg": 4.8734, "s/step": 12.345})
    monitor.close()
    err = capsys.readouterr().err
    _no_cuts(err)
    assert re.search(r"37/100 \d:\d\d:\d\d < [-\d]:[-\d]{2}:[-\d]{2}", err), err  # no estimate yet: -:--:--
    flat = " ".join(err.split())  # the metrics may wrap onto a second line
    assert all(part in flat for part in ("score -0.1235", "kl 0.01235", "seg 4.873", "s/step 12.35")), err


def test_metrics_keep_small_learning_rates(tmp_path):
    from marlhf_cli.artifacts import RunDir, read_jsonl
    from marlhf_cli.train.monitor import Monitor

    monitor = Monitor(RunDir(tmp_path), "sft", total_steps=2, start_step=0, enabled=False)
    monitor.enabled = True  # the JSONL only: no progress bar, no TensorBoard
    monitor.log(1, {"lr": 3.21e-8, "loss": 1.234567891})
    row = read_jsonl(monitor.path)[0]
    assert row["lr"] == 3.21e-8 and row["loss"] == 1.234568
