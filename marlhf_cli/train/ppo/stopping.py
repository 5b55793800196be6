"""When the reward fails: a user's reward function (``--reward py:...``) can raise or return
nonsense in the middle of a run. Then every process stops together, nothing is lost and the
user is told how to go on.

Where it can fail, and what is consistent then:

* scoring a step's rollout (``make_experience``): before that step's update, so actor, critic
  and optimizers are exactly as the previous step left them;
* scoring a held-out evaluation: after its step's update, which is complete.

In both cases the last completed step is checkpointed (unless its checkpoint exists), so a
``--resume`` after fixing the function continues from there; ``run.json`` records the stage
as ``failed``. Processes agree before anyone moves on to a collective (the update's
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
    failed = error is not None
    if eng.world_size() > 1:
        import torch

        failed = float(eng.all_reduce_sum(torch.tensor([1.0 if failed else 0.0], dtype=torch.float64))[0]) > 0
    if failed:
        error = error or UserError("the reward failed on another process (its error is printed above)")
        error.every_process = True  # what run() stops on (stop): no process is left behind
        raise error


def stopped_everywhere(error: BaseException) -> bool:
    """Whether ``error`` came through :func:`agree`, so every process is handling it."""
    return getattr(error, "every_process", False)


def stop(ctx: Any, error: UserError, root: Path, completed: int, saved: int, state: dict) -> UserError:
    """Checkpoint the last completed step if it is not yet (every process), and return the
    error with a word on how to go on. ``completed``: steps whose update finished;
    ``saved``: the step of the newest complete checkpoint (0: none)."""
    from .checkpointing import save

    if completed > saved:
        save(ctx, root, completed, state)
        note = f"stopped after step {completed}, whose checkpoint is saved: fix it, then rerun with --resume"
    elif saved:
        note = f"the checkpoint of step {saved} stands: fix it, then rerun with --resume"
    else:
        note = "no step had finished: fix it, then rerun"
    error.args = (f"{error.args[0] if error.args else error}; {note}", *error.args[1:])
    return error
