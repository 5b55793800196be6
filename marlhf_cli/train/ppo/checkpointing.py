"""PPO's resume checkpoints: the actor and the critic engine, saved one after the other; a step
counts as saved only once both are complete, and resuming takes the newest such step. A
critic-free run (rloo, grpo) has the actor alone. A finished run, made longer with
``--resume --max-steps N``, goes on from its exports (train/extending.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ... import checkpoints, checksums, engine as eng
from ...artifacts import RunDir
from ...errors import UserError
from .. import common, extending
from .settings import STAGE, optimizer_steps

KEEP_CHECKPOINTS = 2  # actor and critic are saved one after the other: keep a common step


def checkpoint_root(run_dir: RunDir, name: str) -> Path:
    """``ppo/<name>/checkpoints``: the actor's and the critic's resume checkpoints."""
    return run_dir.stage_dir(STAGE, name) / "checkpoints"


def save(ctx: Any, root: Path, step: int, state: dict) -> None:
    """Actor then critic, each atomically; a step counts once both are complete."""
    state = {**state, "config": checkpoints.config_state(ctx.config)}  # what --resume compares
    checkpoints.save_checkpoint(ctx.models.actor, root / "actor", step, state, keep=KEEP_CHECKPOINTS)
    if ctx.models.critic is not None:
        checkpoints.save_checkpoint(ctx.models.critic, root / "critic", step, state, keep=KEEP_CHECKPOINTS)


def latest_common(root: Path, critic: bool = True) -> tuple[Path, Path | None] | None:
    """The newest step for which the actor and (with ``critic``) the critic checkpoint are
    complete: (actor dir, critic dir or None)."""
    actors = {p.name: p for p in checkpoints.list_checkpoints(root / "actor")}
    if not critic:
        return (actors[sorted(actors)[-1]], None) if actors else None
    critics = {p.name: p for p in checkpoints.list_checkpoints(root / "critic")}
    common_tags = sorted(set(actors) & set(critics))
    return (actors[common_tags[-1]], critics[common_tags[-1]]) if common_tags else None


def resumable_common(root: Path, critic: bool = True) -> tuple[tuple[Path, Path | None] | None, list[str]]:
    """(the newest step whose actor and (with ``critic``) critic checkpoints both match their
    manifests, or None; a line for each newer step skipped, naming what is damaged)."""
    from ...checksums import problem

    actors = {p.name: p for p in checkpoints.list_checkpoints(root / "actor")}
    critics = {p.name: p for p in checkpoints.list_checkpoints(root / "critic")} if critic else {}
    tags = sorted(set(actors) & set(critics)) if critic else sorted(actors)
    skipped = []
    for tag in reversed(tags):
        pair = (actors[tag], critics[tag] if critic else None)
        why = next((f"{folder.parent.name}/{tag}: {reason}" for folder in pair if folder is not None
                    and (reason := problem(folder, checkpoints.STATE_FILE))), None)  # fmt: skip
        if why is None:
            return pair, skipped
        skipped.append(why)
    return None, skipped


def check_resumable(root: Path, expected: dict, config: Any, *, critic: bool) -> extending.Extension | None:
    """``--resume`` needs a complete checkpoint under ``root``, written with these options, of
    a run that has not finished, or of a finished one that a larger ``--max-steps`` extends
    (returned): a one-line error otherwise, before any model is loaded (a mistyped
    ``--run-dir`` or ``--name`` must not become a run from scratch)."""
    found, skipped = resumable_common(root, critic=critic)
    if found is None:
        if skipped:
            raise UserError(checkpoints.skipped_line(skipped, None) + f" (in {root}); run without --resume to start again")
        raise checkpoints.nothing_to_resume(root)
    if skipped:
        common.say(checkpoints.skipped_line(skipped, found[0]))
        if eng.is_main():  # out of the way of what is kept, pruned and resumed next (still there to look at)
            for role in ("actor", "critic") if critic else ("actor",):
                checksums.set_aside(root / role, found[0].name, checkpoints.PREFIX)
    exports = [root.parent, root.parent / "critic"] if critic else [root.parent]  # ppo/<name>/ and its critic/
    extension = extending.find(found[0], config.max_steps, exports)
    checkpoints.check_fingerprint(found[0], expected, config, lengthen=extension is not None)  # notes: said at the start
    if extension is None:
        checkpoints.check_unfinished(found[0])
    return extension


def extend(ctx: Any, root: Path, expected: dict, extension: extending.Extension, name: str) -> int:
    """Start an extension whose engines were built on the exports: the schedules move to the
    finished run's last step, which is returned."""
    found = latest_common(root, critic=ctx.models.critic is not None)
    for note in checkpoints.check_fingerprint(found[0], expected, ctx.config, lengthen=True):
        common.say(note)
    done = optimizer_steps(ctx.config, ctx.plan, "actor", extension.finished)  # none in the critic's warm-up
    rate = extending.continue_schedule(ctx.models.actor, done)
    if ctx.models.critic is not None:
        extending.continue_schedule(ctx.models.critic, optimizer_steps(ctx.config, ctx.plan, "critic", extension.finished))
    common.say(extending.line(f"ppo/{name}", extension, ctx.config, rate=rate, lr=ctx.config.actor_lr, done=done))
    return extension.finished


def mark_finished(ctx: Any, root: Path, state: dict) -> None:
    """The finished run's trainer state at its last step, for the actor and the critic."""
    state = {**state, "config": checkpoints.config_state(ctx.config)}
    checkpoints.mark_finished(root / "actor", ctx.config.max_steps, state)
    if ctx.models.critic is not None:
        checkpoints.mark_finished(root / "critic", ctx.config.max_steps, state)


def resume(ctx: Any, root: Path, expected: dict) -> int:
    """Restore actor, critic (model, optimizer, scheduler, RNG); return the step to continue at."""
    with_critic = ctx.models.critic is not None
    found = eng.broadcast_object(resumable_common(root, critic=with_critic)[0] if eng.is_main() else None)
    if found is None:
        raise checkpoints.nothing_to_resume(root)
    actor_dir, critic_dir = found
    for note in checkpoints.check_fingerprint(actor_dir, expected, ctx.config):
        common.say(note)
    state = checkpoints.load_checkpoint(ctx.models.actor, actor_dir)
    if with_critic:
        checkpoints.load_checkpoint(ctx.models.critic, critic_dir)
    return int(state["step"])
