"""The ``marlhf`` command line: one thin function per command, wiring flags to a stage."""

from __future__ import annotations

from typing import Annotated

import typer

from . import __version__

app = typer.Typer(
    name="marlhf",
    help=(
        "MA-RLHF from the command line: supervised fine-tuning, reward models, PPO and MA-PPO "
        "(RLHF with macro actions), and previews of macro-action segmentation. "
        "All stages share one run directory (--run-dir)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"marlhf {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """MA-RLHF: RLHF with macro actions."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
