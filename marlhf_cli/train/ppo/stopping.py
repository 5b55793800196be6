"""When the reward fails: a user's reward function (``--reward py:...``) can raise or return
nonsense in the middle of a run. Then every process stops together, nothing is lost and the
user is told how to go on.

Where it can fail, and what is consistent then:

* scoring a step's rollout (``make_experience``): before that step's update, so actor, critic
  and optimizers are exactly as the previous step left them;
* scoring a held-out evaluation: after its step's update, which is complete.

In both cases the last completed step is checkpointed (unless its checkpoint exists), so a
``--resume`` after fixing the function continues from there; ``run.json`` records the stage
as ``failed``. Numbers that are not finite stop a run the same way (:func:`not_finite`): a
score that is not finite, where the state is sound (the step before is checkpointed); the
policy's or the critic's own numbers, or the update's losses, where the weights have
diverged: then nothing of the present state is saved (the error is ``poisoned``) and the
newest checkpoint stands. Processes agree before anyone moves on to a collective (the update's
all-reduce, a checkpoint), so one process's error never leaves the others waiting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ... import engine as eng
from ...errors import UserError


def agree(error: UserError | None) -> None:
    """Raise on every process if scoring failed on any: its own error where it failed, a
    pointer to the other process's error elsewhere. A collective when there are several."""
    failed, poisoned = error is not None, float(getattr(error, "poisoned", 0) or 0)
    if eng.world_size() > 1:  # and the step since which a process's weights diverged (every process then keeps none)
        import torch

        flags = eng.all_reduce_sum(torch.tensor([float(failed), float(poisoned > 0), poisoned], dtype=torch.float64)).tolist()
        # (the processes that see a divergence see it at the same step: their mean is that step)
        failed, poisoned = flags[0] > 0, flags[2] / flags[1] if flags[1] else 0.0
    if failed:
        error = error or UserError("the reward failed on another process, or the step there (its error is printed above)")
        error.every_process = True  # what run() stops on (stop): no process is left behind
        error.poisoned = int(poisoned)
        raise error


def not_finite(experience, update_stats: dict[str, float] | None, step: int) -> UserError | None:
    """The error of a step whose numbers are not finite, or None. Before the update
    (``update_stats`` None) the rollout's: its scores (a reward that broke: the state is
    sound), its log-probs and values (the previous update diverged: the state is not). After
    it, the update's losses."""
    import math

    import torch

    def bad(x) -> int:
        return 0 if x is None else int((~torch.isfinite(x[experience.mask.bool()] if x.dim() == 2 else x)).sum())

    if update_stats is not None:
        losses = {k: v for k, v in update_stats.items() if k.endswith("loss") and not math.isfinite(v)}
        if not losses:
            return None
        error = UserError(f"step {step}: the update's {', '.join(f'{k} {v}' for k, v in losses.items())} (not finite): "
                          "the weights diverged; lower --actor-lr or --critic-lr")  # fmt: skip
        error.poisoned = step  # the first step whose weights are not sound: this update's
        return error
    if n := bad(experience.scores):
        return UserError(f"step {step}: {n} of {experience.batch_size} scores are not finite (the reward model's or reward's)")
    parts = {"log-probs": bad(experience.old_logp), "values": bad(experience.values), "reference log-probs": bad(experience.ref_logp)}
    if any(parts.values()):
        found = ", ".join(f"{n} {name}" for name, n in parts.items() if n)
        error = UserError(f"step {step}: the rollout has {found} that are not finite: the policy's or the critic's weights "
                          "are (they diverged at the previous update, or were so loaded)")  # fmt: skip
        error.poisoned = step - 1  # the previous update's weights
        return error
    return None


def stopped_everywhere(error: BaseException) -> bool:
    """Whether ``error`` came through :func:`agree`, so every process is handling it."""
    return getattr(error, "every_process", False)


def stop(ctx: Any, error: UserError, root: Path, completed: int, saved: int, state: dict) -> UserError:
    """Checkpoint the last completed step if it is not yet (every process), and return the
    error with a word on how to go on. ``completed``: steps whose update finished;
    ``saved``: the step of the newest complete checkpoint (0: none)."""
    from .checkpointing import save

    if getattr(error, "poisoned", 0):  # the weights diverged at that step's update: nothing of them is kept
        since = error.poisoned
        if saved and saved < since:
            # (a --resume takes the same options and would repeat the same steps: a lower rate is a new run)
            note = f"the checkpoint of step {saved} holds the last sound weights; start again with a lower --actor-lr or --critic-lr"
        elif saved:
            note = (f"the checkpoint of step {saved} holds the weights that diverged (at the update of step {since}): "
                    "start again with a lower --actor-lr or --critic-lr")  # fmt: skip
        else:
            note = "no checkpoint was written: start again with a lower --actor-lr or --critic-lr"
    elif completed > saved:
        save(ctx, root, completed, state)
        note = f"stopped after step {completed}, whose checkpoint is saved: fix it, then rerun with --resume"
    elif saved:
        note = f"the checkpoint of step {saved} stands: fix it, then rerun with --resume"
    else:
        note = "no step had finished: fix it, then rerun"
    error.args = (f"{error.args[0] if error.args else error}; {note}", *error.args[1:])
    return error
