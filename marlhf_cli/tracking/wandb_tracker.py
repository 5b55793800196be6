"""``--report-to wandb``: a W&B run, offline (under ``wandb/``) unless ``WANDB_MODE`` says
otherwise or an API key is set; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads it."""

from __future__ import annotations

import os

import wandb

from . import Tracker


class WandB(Tracker):
    name = "wandb"

    def __init__(self, run):
        self.run = run
        self.id = run.id

    def log(self, step: int, values: dict[str, float], split: str) -> None:
        self.run.log({f"{split}/{key}": value for key, value in values.items()}, step=step)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        self.run.log({name: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


def start(*, run, stage, name, group, config, start_step, resume_id, say) -> WandB:
    folder = run.path("wandb")
    folder.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    if mode == "offline" and not os.environ.get("WANDB_MODE"):
        say(f"wandb: offline (no WANDB_API_KEY or WANDB_MODE): 'wandb sync {folder}/offline-run-*' uploads the run")
    tracker = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "marlhf"), name=name, group=group, dir=str(run.root), config=config,
        mode=mode, id=resume_id, resume="allow" if resume_id else None, settings=wandb.Settings(silent=True),
    )  # fmt: skip
    return WandB(tracker)
