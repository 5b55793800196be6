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


def test_metrics_keep_small_learning_rates(tmp_path):
    from marlhf_cli.artifacts import RunDir, read_jsonl
    from marlhf_cli.train.monitor import Monitor

    monitor = Monitor(RunDir(tmp_path), "sft", total_steps=2, start_step=0, enabled=False)
    monitor.enabled = True  # the JSONL only: no progress bar, no TensorBoard
    monitor.log(1, {"lr": 3.21e-8, "loss": 1.234567891})
    row = read_jsonl(monitor.path)[0]
    assert row["lr"] == 3.21e-8 and row["loss"] == 1.234568


def _stats_summaries() -> list[dict]:
    """What 'segment --rule all --stats' tabulates, with this machine's speeds (millions of tokens/s)."""
    rows = []
    for rule, speed, fallbacks in (("fixed", 3183123.0, 0), ("randomized", 436808.0, 0), ("ppl", 2925712.0, 0),
                                   ("parsing", 3929.0, 0), ("code", 1978745.0, 1231)):  # fmt: skip
        rows.append({
            "rule": rule, "responses": 12345, "segments": 1231123, "tokens": 6155615, "mean": 4.9, "median": 5,
            "max": 156, "max_without_whitespace": 150, "cutoff": 10 if rule == "code" else 5, "over_cutoff": 0.308,
            "fallbacks": fallbacks, "tokens_per_second": speed,
            "histogram": {"1": 5, "2": 55, "3": 124, "4-5": 480123, "6-10": 58, "11-20": 2, ">=21": 14},
        })  # fmt: skip
    return rows


def test_segment_stats_tables_at_80_columns(capsys, monkeypatch):
    """The issue's 'respons…' and '1,231,1…': every header and figure whole."""
    monkeypatch.setenv("COLUMNS", "80")
    from marlhf_cli.segment import print_stats

    print_stats(_stats_summaries(), as_json=False)
    out = capsys.readouterr().out
    _no_cuts(out)
    for word in ("responses", "segments", "fallbacks", "tokens/s", "randomized", "parsing", "largest*", "> C*"):
        assert word in out, word
    for figure in ("12,345", "1,231,123", "3,183,123", "436,808", "1,231", "480,123", "30.8%", "4.90"):
        assert figure in out, figure


def test_ppo_final_table_at_80_columns(capsys, monkeypatch):
    """Nine columns (gen tokens came with mc): every header and figure whole; a long run name
    folds onto more lines rather than cutting a figure."""
    monkeypatch.setenv("COLUMNS", "80")
    from rich.console import Console

    from marlhf_cli.train.ppo import report

    rows = [
        {"step": 0, "split": "eval", "score": -0.0123, "response_length": 24.0},
        {"step": 60, "split": "train", "score": 0.5, "kl": -0.0041, "segment_length": 3.0, "step_time": 12.34,
         "generated_tokens": 12345678},
        {"step": 60, "split": "eval", "score": -11.2345, "response_length": 124.0},
    ]  # fmt: skip
    summaries = [report.summary_row(name, rows) for name in ("mc-fixed8-m4-b3-sequence-mean-k8", "vanilla")]
    Console().print(report._table("ppo: final evaluation", summaries))
    out = capsys.readouterr().out
    _no_cuts(out)
    for figure in ("12,345,678", "-0.012", "-11.235", "124.0", "-0.004", "3.00", "12.34", "vanilla", "mc-fixed8"):
        assert figure in out, figure
    for header in ("steps", "tokens", "start", "length", "KL", "s/step"):
        assert header in out, header
    assert "critic" not in out  # no run with a critic: no column for its fit
    # the legend: left-aligned, within the table's width (its rule), not centred and ragged
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("gen tokens:"))
    width = max(len(line) for line in lines[:start])  # the table's own lines
    assert all(len(line.rstrip()) <= width and not line.startswith(" ") for line in lines[start:] if line.strip())

    # with a critic: ten columns, a PPO run's token count (SmolLM2 at 8 x 64 tokens, 120 steps)
    fit = {"return": 0.1, "value": 0.05, "return_variance": 0.04, "residual_variance": 0.05, "response_tokens": 512}
    critic_rows = [rows[0], dict(rows[1], generated_tokens=61440, step=120, **fit), dict(rows[2], step=120)]
    Console().print(report._table("ppo: final evaluation", [report.summary_row("fixed5-first", critic_rows)]))
    out = capsys.readouterr().out
    _no_cuts(out)
    for figure in ("61,440", "-0.012", "-11.235", "124.0", "-0.004", "3.00", "12.34", "fixed5-f", "-0.25"):
        assert figure in out, figure
    assert "critic" in out and "EV" in out


def test_bon_table_at_80_columns(capsys, monkeypatch):
    """The README's example (--n 4,8,16,32 --temperature 0.2,0.6,1.0): every figure whole on one line."""
    monkeypatch.setenv("COLUMNS", "80")
    from rich.console import Console

    from marlhf_cli.evaluate import tables

    monkeypatch.setattr(tables, "console", Console())  # reads COLUMNS now
    temps, ns = (0.2, 0.6, 1.0), (4, 8, 16, 32)
    curves = {t: {n: {"mean": -1.2345 - t + n / 100, "sem": 0.0123 * n} for n in ns} for t in temps}
    tables.bon_table("ppo-ppl", curves, {t: -1.5 - t for t in temps}, samples=32, prompts=64)
    out = capsys.readouterr().out
    _no_cuts(out)
    for t in temps:
        for n in ns:
            figure = curves[t][n]
            assert f"{figure['mean']:.4f}" in out and f"{figure['sem']:.4f}" in out, (t, n)
        assert f"{-1.5 - t:.4f}" in out
    for header in ("temperature", "N=1", "N=4", "N=32"):
        assert header in out, header


def test_bon_table_with_many_n_still_fits(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    from rich.console import Console

    from marlhf_cli.evaluate import tables

    monkeypatch.setattr(tables, "console", Console())
    temps, ns = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2), (1, 2, 4, 8, 16, 32, 64, 128)
    curves = {t: {n: {"mean": -10.2345 + n / 10, "sem": 0.0123} for n in ns} for t in temps}
    tables.bon_table("sft", curves, {t: -1.5 for t in temps}, samples=128, prompts=64)
    out = capsys.readouterr().out
    _no_cuts(out)
    assert all(f"{curves[t][n]['mean']:.4f}" in out for t in temps for n in ns)


def _progress_lines(tmp_path, columns: str, monkeypatch, capsys) -> list[str]:
    monkeypatch.setenv("COLUMNS", columns)
    from marlhf_cli.artifacts import RunDir
    from marlhf_cli.train.monitor import Monitor

    # the terminal's bar (pytest's stderr is no terminal: rich draws it once, when it stops)
    monitor = Monitor(RunDir(tmp_path), "ppo-fixed5", total_steps=100, start_step=0, enabled=True, live=True)
    monitor.advance(37, {"score": -0.123456, "kl": 0.0123456, "seg": 4.8734, "s/step": 12.345})
    monitor.close()
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_progress_bar_is_one_line_at_80_columns(tmp_path, capsys, monkeypatch):
    """The metrics that fit, whole, on the bar's one line; the rest are in metrics/*.jsonl."""
    (line,) = _progress_lines(tmp_path, "80", monkeypatch, capsys)
    _no_cuts(line)
    assert line.startswith("ppo-fixed5") and re.search(r"37/100 \d:\d\d:\d\d < [-\d]:[-\d]{2}:[-\d]{2}", line), line
    assert "score -0.1235" in line  # the first metric always fits
    shown = [name for name in ("score", "kl", "seg", "s/step") if f" {name} " in f"{line} "]
    assert shown == ["score", "kl", "seg", "s/step"][: len(shown)]  # a prefix: dropped from the end


def test_progress_bar_shows_every_metric_when_wide(tmp_path, capsys, monkeypatch):
    (line,) = _progress_lines(tmp_path, "160", monkeypatch, capsys)
    assert all(part in line for part in ("score -0.1235", "kl 0.01235", "seg 4.873", "s/step 12.35")), line
