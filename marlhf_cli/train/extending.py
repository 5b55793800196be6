"""Extending a finished run: ``--resume`` with a larger ``--max-steps`` (or ``--epochs``).

A finished run keeps no optimizer state (checkpoints.retire drops it: most of a run
directory's size), so an extension cannot be the run that was never stopped. It goes on from
what is left, the same way in every stage, and its start-up line says how it differs:

* weights: the run's export (``sft/``, ``rm/``, ``ppo/<name>/`` and its ``critic/``), the model
  at its last step; with LoRA the adapters saved beside it, on the same base;
* optimizer: fresh AdamW moments (Adam's bias correction makes the first updates about
  ``lr`` in size, as at a run's start);
* learning rate: the new length's schedule from the step reached: a cosine over N steps at
  step K, where the finished run's had decayed to 0 (warmup included, where it reaches K);
* data and random draws: those of the new run from step K on (batches are indexed by step,
  ppo seeds each step; dropout is reseeded from the seed and K).

The finished run's trainer state (its options, its length) is the newest checkpoint it left:
checkpoints.mark_finished writes one at the last step. An extension stopped part-way resumes
as any run does: its own checkpoints carry the new length.
"""

from __future__ import annotations

import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .. import checkpoints, engine as eng, lora
from ..errors import UserError
from ..seeding import derived_seed


@dataclass(frozen=True)
class Extension:
    finished: int  # the finished run's steps: where the extension starts
    steps: int  # the new length
    exports: tuple[Path, ...]  # the finished run's outputs its trained models start from


def find(found: Path, steps: int, exports: Sequence[Path]) -> Extension | None:
    """An extension when ``found`` (the newest checkpoint) belongs to a finished run shorter
    than ``steps`` and its exports are still there; None otherwise (an unfinished run
    resumes, and a finished one that is not shorter is refused by checkpoints.check_unfinished)."""
    state = checkpoints.read_state(found)
    length = checkpoints.run_length(state)
    if not state.get("finished") or length is None or steps <= length:
        return None
    for export in exports:
        if not (Path(export) / "config.json").is_file():
            raise UserError(
                f"--resume: {found.parent} finished its {length} steps, but {export}, where they ended, is gone: "
                "nothing to extend from (run without --resume to train again)"
            )
    return Extension(length, steps, tuple(Path(e) for e in exports))


def start_adapters(model, export: Path) -> None:
    """A LoRA model's adapters (fresh ones, on the run's base) take the export's trained ones;
    a model without adapters is loaded from the export itself by its stage."""
    lora.load_adapter_weights(model, Path(export) / lora.ADAPTER_DIR)


def continue_schedule(engine, optimizer_steps: int) -> float:
    """Move the new length's learning-rate schedule to the step the finished run reached
    (``optimizer_steps`` of this engine); returns the rate the next step uses."""
    with warnings.catch_warnings():  # torch warns of a scheduler stepped before its optimizer: intended here
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
        for _ in range(optimizer_steps):
            engine.lr_scheduler.step()
    return eng.current_lr(engine)


def reseed(seed: int, step: int) -> None:
    """Random draws from the extension's first step on (dropout): from the seed and the step."""
    import numpy as np
    import torch

    random.seed(derived_seed(seed, step, eng.rank(), "extend"))
    np.random.seed(derived_seed(seed, step, eng.rank(), "extend") % 2**32)
    torch.manual_seed(derived_seed(seed, step, eng.rank(), "extend"))


def line(what: str, extension: Extension, config: Any, *, rate: float, lr: float, done: int | None = None) -> str:
    """The start-up line: what the extension starts from and how its schedule differs.
    ``rate``: the schedule's rate at the extension's first step; ``lr`` the peak rate;
    ``done``: the optimizer steps the finished run made (ppo's: epochs x mini-batches per
    step after the critic's warm-up), by default one per step."""
    k, n = extension.finished, extension.steps
    total = k if done is None else done
    ended = lr * eng.WarmupDecay(total, round(config.warmup_ratio * total), config.lr_scheduler)(total - 1)
    exports = ", ".join(str(e) for e in extension.exports)
    return (
        f"--resume: extending {what} from {k} to {n} steps, from the weights of {exports} with fresh AdamW moments "
        f"(a finished run keeps no optimizer state); the learning rate follows the {n}-step {config.lr_scheduler} "
        f"schedule from step {k}: {rate:.3g} (the {k}-step schedule had reached {ended:.3g}), so the result differs "
        f"from a run of {n} steps from the start"
    )
