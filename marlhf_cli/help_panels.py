"""Grouped ``--help``: every command's options under headed panels (Data, Model, Macro
actions, ...) instead of one flat list (``ppo --help`` had 70 options in 256 lines).

Each option's panel is Typer's ``rich_help_panel``, set here from one table, so the whole
grouping is readable in one place and a new flag without a panel fails
tests/test_cli_help.py. The panels are printed by click's plain formatter
(:class:`GroupedHelp`), not by rich: the app keeps ``rich_markup_mode=None`` because rich's
table cuts long flag names below ~120 columns, and the help must be whole at 80.
"""

from __future__ import annotations

from typer.core import TyperCommand

# The order panels are printed in; a command shows the ones its options use.
ORDER = (
    "Data", "Model", "Episodes", "Preference loss", "Segmentation", "Macro actions", "Advantage", "Optimisation", "Sampling", "Evaluation",
    "Judge", "Requests", "Reward model", "Sandbox", "Checkpoints", "Distributed and memory", "Compare runs",
    "Output", "Run",
)  # fmt: skip

# sft, rm and ppo (and every command, where a flag means the same there)
SHARED = {
    **dict.fromkeys(("--dataset", "--dataset-config", "--dataset-split", "--data-file", "--strict", "--max-records", "--chat-template", "--split-shares",
                     "--max-prompt-length", "--max-response-length", "--packing"), "Data"),
    **dict.fromkeys(("--model", "--policy", "--reward-model", "--reward", "--reward-weights", "--trainable-layers", "--dtype", "--lora-rank",
                     "--lora-alpha", "--lora-targets", "--lora-dropout", "--allow-new-head"), "Model"),
    **dict.fromkeys(("--env", "--max-turns", "--max-episode-tokens", "--env-timeout"), "Episodes"),
    **dict.fromkeys(("--termination", "--n", "--cutoff", "--value-function", "--ratio", "--parser-backend",
                     "--parse-workers"), "Macro actions"),
    **dict.fromkeys(("--advantage", "--samples-per-prompt", "--mc-rollouts", "--mc-max-boundaries", "--tree-branches", "--tree-depth", "--gamma", "--lam",
                     "--lam-alpha", "--critic-lambda",
                     "--kl-coef", "--kl-estimator", "--reward-clip", "--whiten-advantages", "--missing-eos-penalty"),
                    "Advantage"),
    **dict.fromkeys(("--lr", "--batch-size", "--epochs", "--max-steps", "--rollout-batch-size", "--mini-batch-size",
                     "--ppo-epochs", "--actor-lr", "--critic-lr", "--value-head-init", "--critic-warmup-steps",
                     "--clip-range", "--value-clip-range",
                     "--loss-aggregation", "--gradient-accumulation-steps", "--gradient-checkpointing",
                     "--lr-scheduler", "--warmup-ratio", "--weight-decay", "--max-grad-norm"), "Optimisation"),
    **dict.fromkeys(("--temperature", "--top-k", "--top-p", "--max-new-tokens", "--generation"), "Sampling"),
    **dict.fromkeys(("--eval-every", "--eval-records", "--eval-prompts", "--show-samples"), "Evaluation"),
    **dict.fromkeys(("--save-every", "--resume"), "Checkpoints"),
    **dict.fromkeys(("--zero-stage", "--nproc", "--offload-optimizer", "--offload-params", "--offload-frozen"),
                    "Distributed and memory"),
    **dict.fromkeys(("--compare", "--x-axis"), "Compare runs"),
    **dict.fromkeys(("--report-to", "--push-to-hub"), "Output"),
    **dict.fromkeys(("--name", "--run-dir", "--seed", "--config", "--preset", "--dry-run", "--debug", "-h", "--help"), "Run"),
}  # fmt: skip

# where a command's flag belongs elsewhere than SHARED says
BY_COMMAND = {
    "ppo": {"--max-prompt-length": "Sampling"},
    "dpo": {**dict.fromkeys(("--beta", "--loss-type", "--label-smoothing", "--length-penalty"), "Preference loss"),
            "--reference": "Model"},
    "bon": {
        **dict.fromkeys(("--n", "--batch-size", "--max-prompt-length"), "Sampling"),
        "--normalize": "Model",
    },
    "passk": {
        **dict.fromkeys(("--n", "--batch-size", "--max-prompt-length"), "Sampling"),
        **dict.fromkeys(("--split", "--limit"), "Data"),
        "--k": "Evaluation",
        **dict.fromkeys(("--time-limit", "--memory-mb", "--workers", "--max-tests"), "Sandbox"),
    },
    "judge": {
        **dict.fromkeys(("--gpt4", "--model", "--base-url", "--api-key-env", "--task", "--template", "--both-orders",
                         "--max-tokens"), "Judge"),
        **dict.fromkeys(("--concurrency", "--timeout", "--max-retries", "--retry-wait"), "Requests"),
        **dict.fromkeys(("--rm", "--reward-model", "--max-prompt-length", "--max-response-length", "--batch-size",
                         "--chat-template"), "Reward model"),
        "--sample": "Data",
    },
    "segment": {
        **dict.fromkeys(("--rule", "--n", "--cutoff", "--tokenizer", "--model", "--backend"), "Segmentation"),
        **dict.fromkeys(("--format", "--stats"), "Output"),
    },
}  # fmt: skip


def panel_of(command: str, flag: str) -> str | None:
    """The panel of ``flag`` in ``command``'s help, or None when the table has none."""
    return BY_COMMAND.get(command, {}).get(flag) or SHARED.get(flag)


class GroupedHelp(TyperCommand):
    """A command whose ``--help`` lists its arguments, then its options panel by panel."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "option" and not getattr(param, "rich_help_panel", None):
                param.rich_help_panel = panel_of(self.name or "", param.opts[0])

    def format_options(self, ctx, formatter) -> None:
        arguments, panels = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                # (the help option is made at this point, not in __init__)
                panel = getattr(param, "rich_help_panel", None) or panel_of(self.name or "", param.opts[0])
                panels.setdefault(panel or "Options", []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        rank = {name: index for index, name in enumerate(ORDER)}
        for name in sorted(panels, key=lambda name: rank.get(name, len(ORDER))):
            with formatter.section(name):
                formatter.write_dl(panels[name])


def grouped_reference(markdown: str) -> str:
    """Typer's generated CLI reference (``typer ... utils docs``) with each command's options
    under the panels ``--help`` shows (its flat "**Options**:" list split by :func:`panel_of`,
    in :data:`ORDER`). ``python -m marlhf_cli.help_panels FILE`` regenerates docs/reference/cli.md."""
    import re

    out, command = [], ""
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        heading = re.match(r"## `marlhf (\w+)`", line)
        if heading:
            command = heading.group(1)
        if line == "**Options**:" and command:
            items, index = [], index + 2  # the blank line after the label
            while index < len(lines) and lines[index].startswith("* `"):
                items.append(lines[index])
                index += 1
            panels: dict[str, list[str]] = {}
            for item in items:
                flag = re.match(r"\* `(-[-\w]+)", item).group(1)
                panels.setdefault(panel_of(command, flag) or ("Run" if flag == "--help" else "Options"), []).append(item)
            rank = {name: position for position, name in enumerate(ORDER)}
            for name in sorted(panels, key=lambda name: rank.get(name, len(ORDER))):
                out += [f"**{name}**:", "", *panels[name], ""]
            continue
        out.append(line)
        index += 1
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":  # python -m marlhf_cli.help_panels docs/reference/cli.md
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "cli.md"
        subprocess.run([sys.executable, "-m", "typer", "marlhf_cli.cli", "utils", "docs", "--name", "marlhf", "--title",
                        "CLI reference", "--output", str(flat)], check=True, capture_output=True)  # fmt: skip
        Path(sys.argv[1]).write_text(grouped_reference(flat.read_text(encoding="utf-8")), encoding="utf-8")
