"""What every command shares: the common flags, config resolution and user-error handling."""

from __future__ import annotations

import functools
import inspect
import signal
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping, Optional, get_args

import typer
from rich.console import Console
from typer.core import TyperGroup

try:  # typer 0.2x ships its own copy of click; its errors are not click's
    from typer._click.exceptions import NoArgsIsHelpError, NoSuchOption, UsageError
except ImportError:  # an older typer on the real click
    from click.exceptions import NoArgsIsHelpError, NoSuchOption, UsageError

from . import config as config_module
from .errors import Terminated, UserError

console = Console(stderr=True)

def opt(name: str, help: str):
    """A flag with no shown default: defaults live in the config and are written in ``help``."""
    return typer.Option(name, help=help, show_default=False)


def switch(name: str, help: str):
    """A boolean ``--x/--no-x`` flag (None when not given, so the config's value stands)."""
    return typer.Option(f"{name}/--no-{name[2:]}", help=help, show_default=False)


RunDirOption = Annotated[
    Optional[Path],
    typer.Option("--run-dir", help="Run directory shared by all stages. [default: runs/default]", show_default=False),
]
ConfigOption = Annotated[
    Optional[Path],
    typer.Option("--config", help="YAML file of options (top-level keys and per-stage sections); flags win over it."),
]
PresetOption = Annotated[
    Optional[str],
    typer.Option(
        "--preset",
        help="Named settings from templates/presets (tldr, hh, webgpt, apps: the paper's; cpu-tiny: every stage in minutes; cpu-real: ppo on SmolLM2-135M, a real model learning on a CPU); --config and flags win over it.",
    ),
]
SeedOption = Annotated[Optional[int], typer.Option("--seed", help="Random seed. [default: 42]", show_default=False)]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print the resolved configuration as YAML and exit.")
]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")]
AllowNewHeadOption = Annotated[
    Optional[bool],
    typer.Option("--allow-new-head", help="Start a model in a role its head does not fit, on purpose: a causal LM as the reward model (its score head new: a random reward) or a reward model as the policy. [default: refused]", show_default=False),
]

# flag groups several commands take whole (with_flags adds them to a command's signature)
RUN_DIR = {"run_dir": RunDirOption}
ALLOW_NEW_HEAD = {"allow_new_head": AllowNewHeadOption}  # ppo, dpo, bon, judge
COMMON = {"seed": SeedOption, "config_file": ConfigOption, "preset": PresetOption, "dry_run": DryRunOption, "debug": DebugOption}


def with_flags(*groups: Mapping[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the flags of ``groups`` (parameter name -> annotated option type) after
    its own parameters; it receives them in its ``**`` parameter (``**shared`` in cli.py).

    Typer reads a command's flags from its signature, so flags shared by several commands
    would otherwise be spelled out in each one. A flag defaults to None (not given: the
    config's value stands), a plain boolean flag to False.
    """

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        shared = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=False if get_args(annotation)[0] is bool else None)
            for group in groups for name, annotation in group.items()
        ]  # fmt: skip

        @functools.wraps(command)
        def wrapper(**flags: Any) -> Any:
            return command(**flags)

        wrapper.__signature__ = signature.replace(parameters=[*own, *shared])  # type: ignore[attr-defined]
        return wrapper

    return decorate


def fail(message: str, debug: bool = False) -> None:
    """Print a one-line error (or the traceback with --debug) and exit with code 2."""
    if debug:
        traceback.print_exc()
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


class OneLineErrors(TyperGroup):
    """The app's group: a value click rejects (``--n abc``, an unknown flag, a missing
    argument) is one line and exit code 2, like every other user error, instead of a usage
    block and a boxed message."""

    def make_context(self, info_name, args, parent=None, **extra):
        if parent is None:  # the whole command line, before click consumes it
            from .provenance import remember_invocation

            remember_invocation(args)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except UsageError as err:
            _usage_error(err)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UsageError as err:
            _usage_error(err)


# flags that name the same thing on different commands: the model a stage starts from
SAME_THING = ({"--model": "the model to start from", "--policy": "the model to start from"},)


def _usage_error(err: UsageError) -> None:
    if isinstance(err, NoArgsIsHelpError):  # 'marlhf' alone: the help, as click shows it
        raise err
    where = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
    message = err.format_message()
    if isinstance(err, NoSuchOption) and err.ctx is not None:
        message = unknown_option(err.option_name, err.ctx)
    fail(message + where)


def unknown_option(flag: str, ctx) -> str:
    """'No such option' with hints that know the command's own flags (close spellings of
    them), the flag this command takes for the same thing (``--policy`` on ``rm``: ``--model``)
    and the commands the flag belongs to."""
    import difflib

    command = ctx.command
    own = [opt for param in command.params for opt in getattr(param, "opts", ()) if opt.startswith("--")]
    hints = []
    for group in SAME_THING:
        if flag in group:
            here = [other for other in group if other != flag and other in own]
            if here:
                hints.append(f"'marlhf {command.name}' takes {group[flag]} as {here[0]}")
    close = difflib.get_close_matches(flag, own, n=3, cutoff=0.75)
    if close and not hints:
        hints.append("did you mean " + " or ".join(close) + "?")
    root = ctx.find_root().command
    elsewhere = sorted(
        name for name, other in getattr(root, "commands", {}).items()
        if name != command.name and any(flag in getattr(p, "opts", ()) for p in other.params)
    )  # fmt: skip
    if elsewhere:
        hints.append(f"{flag} is an option of {', '.join(f'marlhf {name}' for name in elsewhere)}")
    return f"No such option: {flag}" + (f" ({'; '.join(hints)})" if hints else "")


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _on_sigterm() -> Any:
    """Handle SIGTERM as an interruption, unless someone chose otherwise (an ignored SIGTERM
    stays ignored, as does a handler a library or a test installed). Returns what to restore."""
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _raise_terminated)
        return previous
    except ValueError:  # not the main thread (a command invoked from a worker thread): leave it
        return None


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:  # a command called in-process (a test, a library) leaves no handler behind
        signal.signal(signal.SIGTERM, previous)


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn :class:`UserError` (and unreadable input) into one line and exit code 2; Ctrl-C
    and SIGTERM into "interrupted" in run.json and exit code 130 or 143."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("debug")) or "--debug" in sys.argv
        previous = _on_sigterm()
        try:
            return command(*args, **kwargs)
        except OSError as err:  # a full disk where marlhf writes its small files (metrics, run.json, logs)
            import errno

            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            from .artifacts import mark_unfinished

            try:
                mark_unfinished("failed")
            except OSError:  # run.json itself cannot be written: the line below says why
                pass
            fail(f"the disk is full: {err.filename or 'a file'} could not be written ({err.strerror}); free some space, then "
                 "rerun with --resume", debug)  # fmt: skip
        except UserError as err:
            from .artifacts import mark_unfinished

            mark_unfinished("failed")  # a stage the error stopped says so in run.json
            details = getattr(err, "details", "")  # UserCodeError: the traceback of the user's own code
            if details and not debug:
                print(details, file=sys.stderr)
            fail(str(err), debug)
        except KeyboardInterrupt as stop:
            from .artifacts import mark_unfinished

            if previous is not None:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the record short
            stages = mark_unfinished("interrupted")
            terminated = isinstance(stop, Terminated)
            marked = f" ({', '.join(stages)} marked {'interrupted' if terminated else 'so'} in run.json)" if stages else ""
            from .checkpoints import interrupted_checkpoint

            cut = interrupted_checkpoint()  # Ctrl-C while a checkpoint was written: say what a resume does
            console.print(("terminated" if terminated else "interrupted") + marked + (f": {cut}" if cut else ""), style="yellow")
            raise typer.Exit(code=128 + signal.SIGTERM if terminated else 130) from None
        finally:
            _restore_sigterm(previous)

    return wrapper


def resolve_config(
    stage: str,
    *,
    preset: str | None,
    config_file: Path | None,
    dry_run: bool,
    **flags: Any,
) -> Any:
    """Resolve a stage's config (defaults < preset < --config < flags); print and exit on --dry-run.

    A flag not given is None (``--debug`` off included), so the preset's or the file's value stands.
    Stages that read records also print, as YAML comments, how their first record will read
    under ``--chat-template`` (:func:`marlhf_cli.chat.preview`)."""
    if flags.get("run_dir") is not None:
        flags["run_dir"] = str(flags["run_dir"])
    flags["debug"] = flags.get("debug") or None
    resolved = config_module.resolve(stage, preset=preset, config_file=config_file, flags=flags)
    if dry_run:
        typer.echo(config_module.to_yaml(resolved), nl=False)
        if stage in RENDERS_RECORDS:
            from .chat import preview

            typer.echo(preview(resolved, stage), nl=False)
        raise typer.Exit(code=0)
    if stage != "segment":  # every other command writes into the run directory
        from .artifacts import check_run_dir

        check_run_dir(resolved.run_dir)
    return resolved


RENDERS_RECORDS = ("sft", "rm", "ppo", "dpo", "bon", "passk")  # stages whose --dry-run shows a rendered record
