"""Steps every training stage takes before and after its loop: processes, data, run.json.

Kept apart from the loop so each stage module reads as "what is special about this stage".
"""

from __future__ import annotations

from typing import Any

from .. import checkpoints
from .. import config as config_module
from .. import engine as eng
from ..artifacts import RunDir


def start(config: Any) -> None:
    """Re-run under torchrun for ``--nproc`` > 1, else start the process group and seed."""
    code = eng.maybe_relaunch(config.nproc)
    if code is not None:
        raise SystemExit(code)
    eng.check_engine_config(config)
    eng.init_distributed(config.debug)
    resolve_dtype(config)
    eng.set_seed(config.seed)
    if not config.debug:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" bars between our own lines


def resolve_dtype(config: Any) -> None:
    """``--dtype auto`` becomes fp32 or bf16 for this machine's device, and the user is told
    which and why. Resolved before anything is fingerprinted, so resuming on a machine where
    ``auto`` means something else is refused like any other changed option."""
    from .. import precision

    config.dtype, why = precision.resolve(config.dtype)
    if why is not None:
        say(f"precision: {config.dtype} (--dtype auto: {why})")


def say(message: str) -> None:
    """A line for the user on stderr, from rank 0 only."""
    if eng.is_main():
        from rich.console import Console

        Console(stderr=True).print(message, highlight=False, soft_wrap=True)


def split_seed(config: Any) -> int:
    """The seed of the SFT/RM/PPO split: the same for every stage, so splits never overlap.

    ``--seed`` changes initialisation and data order, not which records a stage may see.
    """
    return int(getattr(config, "split_seed", 0) or 0)


def load_split(config: Any, split: str, limit: int | None, *, report: bool = True):
    """Records of one split, with the loader's notice and (``report``) its skip counts shown.

    The report covers the whole source, so a stage shows it for one of its splits only.
    """
    from ..data import load_records

    result = load_records(
        config.dataset, data_file=config.data_file, split=split, seed=split_seed(config),
        strict=config.strict, limit=limit,
    )  # fmt: skip
    if result.notice and report:
        say(result.notice)
    if report and (result.report.total_skipped or result.report.total_dropped):
        say(f"{result.source}: {result.report.summary()}")
    return result


def inputs_entry(config: Any, model: str, train, evaluation, **extra: Any) -> dict[str, Any]:
    """The ``inputs`` of a run.json stage entry: what was read, and how much of it."""
    return {
        "model": model,
        "dataset": config.dataset,
        "data_file": config.data_file,
        "source": train.source,
        "train_records": len(train.records),
        "eval_records": len(evaluation.records) if evaluation is not None else 0,
        "rows": train.report.to_dict(),
        "processes": eng.world_size(),
        **extra,
    }


def record(run: RunDir, stage: str, config: Any, inputs: dict, metrics: dict | None, status: str) -> None:
    """The stage's run.json entry; once it says finished, the stage's resume checkpoints
    shrink to their trainer state (checkpoints.retire): the exported model is the result."""
    if eng.is_main():
        run.record_stage(stage, config=config_module.to_dict(config), inputs=inputs, metrics=metrics, status=status)
        if status == "finished":
            checkpoints.retire(run.stage_dir(*stage.split("/")) / "checkpoints")


def clear_previous_outputs(run: RunDir, stage: str, name: str | None = None) -> None:
    """A fresh run, options checked: the same stage's earlier outputs go (rank 0), and the
    user is told, so an interrupted run never leaves an older finished model looking current."""
    if eng.is_main():
        removed = run.clear_outputs(stage, name)
        if removed:
            where = run.stage_dir(stage, name)
            say(f"fresh run: removed the previous outputs of {where} ({len(removed)} files or folders; pass --resume to continue a run)")
    eng.barrier()
