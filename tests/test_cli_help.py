"""Every command and every option explains itself in --help."""

import pytest
import typer
from typer.testing import CliRunner

from marlhf_cli.cli import app

COMMAND = typer.main.get_command(app)
COMMANDS = sorted(COMMAND.commands)


def test_all_stage_commands_exist():
    assert {"sft", "rm", "ppo", "segment", "bon", "judge"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name):
    command = COMMAND.commands[name]
    assert command.help and command.help.strip(), f"{name} has no description"
    for param in command.params:
        if param.param_type_name == "option":
            assert getattr(param, "help", None), f"{name} {param.opts[0]} has no help text"
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for param in command.params:
        if param.param_type_name == "option":
            assert param.opts[0] in result.output, f"{param.opts[0]} missing from '{name} --help'"


@pytest.mark.parametrize("name", ["sft", "rm", "ppo", "segment", "bon", "judge"])
def test_common_options_everywhere(name):
    options = {opt for param in COMMAND.commands[name].params for opt in param.opts}
    assert {"--config", "--preset", "--seed", "--dry-run", "--debug"} <= options
    if name != "segment":  # segment previews text and writes nothing to a run directory
        assert "--run-dir" in options


def test_defaults_are_visible_in_help():
    out = CliRunner().invoke(app, ["segment", "--help"], env={"COLUMNS": "200"}).output
    assert "[default: fixed]" in out and "[default: 42]" in out


@pytest.mark.parametrize("name", COMMANDS)
def test_help_points_only_at_what_the_repository_has(name):
    """A user has only the repository: no help text may send them to ../shared."""
    command = COMMAND.commands[name]
    texts = [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]
    assert [text for text in texts if "shared/" in text] == []


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_sits_in_a_named_panel(name):
    """Grouped help (marlhf_cli/help_panels.py): a new flag must be given its panel."""
    from marlhf_cli.help_panels import ORDER

    command = COMMAND.commands[name]
    for param in command.params:
        if param.param_type_name == "option":
            assert getattr(param, "rich_help_panel", None) in ORDER, f"{name} {param.opts[0]} has no panel"
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"})
    headings = [line[:-1] for line in result.output.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert "Options" not in headings  # nothing left ungrouped, --help included
    assert [h for h in headings if h != "Arguments"] == [p for p in ORDER if p in headings]  # in the table's order


def test_ppo_help_is_grouped_as_a_trl_user_looks_for_it():
    result = CliRunner().invoke(app, ["ppo", "--help"], env={"COLUMNS": "80"})
    headings = [line[:-1] for line in result.output.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert headings == ["Arguments", "Data", "Model", "Episodes", "Macro actions", "Advantage", "Optimisation", "Sampling", "Evaluation",
                        "Checkpoints", "Distributed and memory", "Compare runs", "Output", "Run"]  # fmt: skip
    section = result.output.split("\nSampling:\n")[1].split("\n\n")[0]
    assert all(flag in section for flag in ("--temperature", "--top-k", "--generation", "--max-new-tokens"))
    assert "--lr-scheduler" not in section
