"""The ``marlhf`` command line: one thin function per command, wiring flags to a stage."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import __version__, options

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


@app.command()
@options.user_errors
def segment(
    file: Annotated[
        str,
        typer.Argument(
            help="Plain text (one response), or JSONL with a 'response' or 'text' field per line; '-' reads stdin.",
            show_default=False,
        ),
    ],
    rule: Annotated[
        Optional[str],
        typer.Option(
            "--rule",
            help="Termination rule: fixed, randomized, ppl, parsing, code; several comma-separated, or 'all'. [default: fixed]",
            show_default=False,
        ),
    ] = None,
    n: Annotated[
        Optional[str],
        typer.Option("--n", help="Segment length of the fixed rule, and the fallback of the text rules; 'inf' = whole response. [default: 5]", show_default=False),
    ] = None,
    cutoff: Annotated[
        Optional[int],
        typer.Option("--cutoff", help="Largest segment, in tokens, of the parsing rule (C) and the code rule (C_code). [default: 5 for parsing, 10 for code]", show_default=False),
    ] = None,
    tokenizer: Annotated[
        Optional[str],
        typer.Option("--tokenizer", help="Tokenizer: hub id, local path, or alias 'tiny'/'smollm2-135m' (SmolLM2's, offline). [default: tiny]", show_default=False),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option("--model", help="Reference model for the ppl rule (must share the tokenizer's vocabulary). [default: smollm2-135m]", show_default=False),
    ] = None,
    backend: Annotated[
        Optional[str],
        typer.Option("--backend", help="Parser of the parsing rule: auto (stanza if its English model is installed, else spaCy), stanza, spacy. [default: auto]", show_default=False),
    ] = None,
    output_format: Annotated[
        Optional[str],
        typer.Option("--format", help="text: segments joined with @@ (coloured on a terminal); json: one JSON object per response and rule. [default: text]", show_default=False),
    ] = None,
    stats: Annotated[
        bool, typer.Option("--stats", help="Print segment-length statistics (count, mean, histogram) per rule instead of the segments.")
    ] = False,
    seed: options.SeedOption = None,
    config_file: options.ConfigOption = None,
    preset: options.PresetOption = None,
    dry_run: options.DryRunOption = False,
    debug: options.DebugOption = False,
) -> None:
    """Preview the macro actions (segments) a termination rule makes of any text.

    Examples: marlhf segment answer.txt --rule parsing;
    marlhf segment samples.jsonl --rule all --stats; echo 'x = 1' | marlhf segment - --rule code
    """
    from . import segment as preview

    config = options.resolve_config(
        "segment", preset=preset, config_file=config_file, dry_run=dry_run,
        rule=rule, n=n, cutoff=cutoff, tokenizer=tokenizer, model=model, backend=backend,
        format=output_format, stats=stats or None, seed=seed, debug=debug or None,
    )
    preview.run(config, file)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
