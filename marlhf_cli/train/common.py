"""Steps every training stage takes before and after its loop: processes, data, run.json.

Kept apart from the loop so each stage module reads as "what is special about this stage".
"""

from __future__ import annotations

from typing import Any

from .. import checkpoints
from .. import config as config_module
from .. import console
from .. import engine as eng
from .. import launch
from ..artifacts import RunDir
from ..wording import count


def start(config: Any) -> None:
    """Re-run under torchrun for ``--nproc`` > 1, else start the process group and seed.
    Options that go together or not are checked first, so a refusal is one line, not one per process."""
    eng.check_engine_config(config)
    code = launch.maybe_relaunch(config.nproc)
    if code is not None:
        raise SystemExit(code)
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
    if eng.zero_stage_run(config) != config.zero_stage:
        say(
            f"precision: bf16 with --gradient-accumulation-steps {config.gradient_accumulation_steps}: DeepSpeed runs "
            f"ZeRO stage {eng.zero_stage_run(config)} in place of {config.zero_stage}, so that gradients add up in fp32 "
            "(one process holds the same there)"
        )


def say(message: str) -> None:
    """A line for the user on stderr, from rank 0 only (:func:`marlhf_cli.console.say`)."""
    console.say(message)


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
    from ..data.loader import hub_options
    from ..data.splits import parse_split_shares

    shares = parse_split_shares(config.split_shares) if getattr(config, "split_shares", None) else None
    result = load_records(
        config.dataset, data_file=config.data_file, split=split, seed=split_seed(config),
        strict=config.strict, limit=limit, shares=shares, **hub_options(config),
    )  # fmt: skip
    if result.notice and report:
        say(result.notice)
    if report and (result.report.total_skipped or result.report.total_dropped):
        say(f"{result.source}: {result.report.summary()}")
    if report:
        _check_shares_agree(config, split, result)
    return result


def describe_records(stage: str, train, evaluated: str, shares_given: bool = False) -> str:
    """The start-up line on the data: how many records of how many the stage trains on,
    the shares of the split, and ``evaluated`` (what is held out for evaluation); where the
    source went whole to the stage by default (not by ``--split-shares``), how to share it."""
    shares = ", ".join(f"{name} {100 * share:.3g}%" for name, share in train.fractions.items())
    if _whole(train.fractions) and stage in ("sft", "rm", "ppo") and not shares_given:
        shares += ": every stage takes all of it (--split-shares shares it out)"
    if len(train.records) < train.available:
        shares += f"; --max-records keeps {len(train.records)} of its {train.available}"
    where = f" ({shares})" if shares else ""
    return f"{stage}: training on {len(train.records)} of the {count(train.total, 'record')} of {train.source}{where}, {evaluated}"


def _whole(fractions: dict[str, float]) -> bool:
    """The source is not shared out: one training split takes all of it (beside eval)."""
    return len([name for name in fractions if name != "eval"]) == 1


def _check_shares_agree(config: Any, split: str, result) -> None:
    """A note when another stage of the run directory read the same source with other
    shares (--split-shares): their records may then overlap."""
    if split == "eval" or not eng.is_main() or not result.fractions:
        return
    stages = RunDir(config.run_dir).manifest().get("stages", {})
    for key, entry in sorted(stages.items()):
        inputs = entry.get("inputs") or {}
        theirs = inputs.get("split_shares")
        if key == split or key.startswith(f"{split}/") or inputs.get("source") != result.source or not theirs:
            continue
        if _whole(theirs) and _whole(result.fractions):  # each takes all of it: overlap is what was asked
            continue
        if set(theirs) != set(result.fractions) or any(abs(theirs[k] - v) > 1e-9 for k, v in result.fractions.items()):
            say(f"note: '{key}' of this run directory read {result.source} with other --split-shares: their records may overlap")


def inputs_entry(config: Any, model: str, train, evaluation, **extra: Any) -> dict[str, Any]:
    """The ``inputs`` of a run.json stage entry: what was read, and how much of it."""
    return {
        "model": model,
        "dataset": config.dataset,
        "data_file": config.data_file,
        "source": train.source,
        "source_records": train.total,
        "split_shares": train.fractions,
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


def push_if_asked(config: Any, folder) -> None:
    """``--push-to-hub REPO``: the finished stage's export to the Hub, with its model card
    (marlhf_cli/hub_push.py); a failure is one line, and the export stays where it is."""
    if getattr(config, "push_to_hub", None) and eng.is_main():
        from .. import hub_push

        hub_push.push(folder, config.push_to_hub, say)


def clear_previous_outputs(run: RunDir, stage: str, name: str | None = None) -> None:
    """A fresh run, options checked: the same stage's earlier outputs go (rank 0), and the
    user is told, so an interrupted run never leaves an older finished model looking current."""
    if eng.is_main():
        removed = run.clear_outputs(stage, name)
        if removed:
            where = run.stage_dir(stage, name)
            say(f"fresh run: removed the previous outputs of {where} ({count(len(removed), 'file or folder', 'files or folders')}; pass --resume to continue a run)")
    eng.barrier()
