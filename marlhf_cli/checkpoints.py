"""Resume checkpoints and Hugging Face exports of a DeepSpeed engine.

A resume checkpoint is everything a run needs to continue as if it had never stopped:
DeepSpeed's model, optimizer and scheduler state (each ZeRO rank writes its own shard), the
random states of every rank, and the trainer's position in the data (``state``, a small
JSON dict written by rank 0). Layout::

    <stage>/checkpoints/step-000012/   DeepSpeed files, rng-rank0.pt ..., trainer_state.json
    <stage>/checkpoints/latest         the newest complete checkpoint's name

All ranks write into ``.tmp-step-000012/`` first; rank 0 records every file's size and
checksum (``manifest.json``, :mod:`marlhf_cli.checksums`), renames the folder into place and
then updates ``latest``, so a run killed at any moment leaves the previous checkpoint intact
and never a half-written one that ``--resume`` would pick up; a write that fails (a full
disk) removes its partial folder. ``trainer_state.json`` is written last inside the folder,
so its presence marks a complete checkpoint even without ``latest``. ``--resume`` takes the
newest checkpoint whose files still match their manifest (:func:`resumable`), saying which
newer ones it skipped and why.

:func:`export_pretrained` writes a ``save_pretrained`` folder (gathering ZeRO-3 shards on
rank 0) that ``AutoModelFor...from_pretrained`` loads with no DeepSpeed at all.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from . import artifacts, checksums, engine as eng, lora, provenance
from .errors import DiskFull, UserError, full_disk

PREFIX = "step-"
STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest"


def tag_for(step: int) -> str:
    return f"{PREFIX}{step:06d}"


# ---------------------------------------------------------------------------------------
# random states


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------
# resume checkpoints


_CUT: list[tuple[Path, int]] = []  # the checkpoint an exception cut short (root, step), for the interruption's message


def interrupted_checkpoint() -> str | None:
    """What an interruption while a checkpoint was written left, once (None when none was cut
    short): that checkpoint is not complete, and a resume starts from the newest complete one."""
    if not _CUT:
        return None
    root, step = _CUT.pop()
    newest = latest_checkpoint(root)
    since = f"--resume starts from step {read_state(newest)['step']}" if newest else "no checkpoint is complete: run again without --resume"
    return f"the checkpoint of step {step} was being written and is not complete; {since}"


def save_checkpoint(engine, root: str | Path, step: int, state: dict[str, Any], keep: int = 1) -> Path:
    """Write a complete checkpoint of ``engine`` at ``step``; every rank must call this.

    ``state`` (JSON-serialisable, rank 0's copy is kept) records where the trainer is.
    The newest ``keep`` checkpoints survive; older ones are deleted once the new one is in
    place.
    """
    root = Path(root)
    try:
        return _save_checkpoint(engine, root, step, state, keep)
    except BaseException as error:  # Ctrl-C, SIGTERM, a failed write: the interruption's message says so
        _CUT[:] = [(root, step)]
        full = full_disk(error, root) if isinstance(error, Exception) else None  # (measured before the clean-up)
        if full is None:
            _remove_partial(root, step)
            raise
    # a full disk, raised outside the handler: the failed write's frames, and the file they
    # hold open (whose space the filesystem keeps until it is closed), are let go first
    _remove_partial(root, step)
    kept = list_checkpoints(root)
    before = f"the checkpoint of {kept[-1].name} stands" if kept else "no earlier checkpoint was written"
    raise DiskFull(f"the disk is full: the checkpoint of step {step} could not be written in {root} ({full}); its "
                   f"partial files were removed and {before}: free some space, then rerun with --resume")  # fmt: skip


def _remove_partial(root: Path, step: int) -> None:
    """A checkpoint cut short leaves nothing: its staging folder goes (the previous checkpoint
    was never touched)."""
    import gc

    gc.collect()  # the failed writer's file objects, held by reference cycles with its frames
    if eng.is_main():
        shutil.rmtree(root / f".tmp-{tag_for(step)}", ignore_errors=True)


def _save_checkpoint(engine, root: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    import torch

    tag = tag_for(step)
    staging = root / f".tmp-{tag}"
    if eng.is_main():
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    eng.barrier()
    # a LoRA model's frozen base is left out: resuming reloads it (lora.base_identity checks it is the same)
    engine.save_checkpoint(
        str(staging), tag=tag, client_state={"marlhf_step": step}, save_latest=False,
        exclude_frozen_parameters=lora.is_adapted(engine.module),
    )  # fmt: skip
    torch.save(rng_state(), staging / tag / f"rng-rank{eng.rank()}.pt")
    eng.barrier()
    final = root / tag
    if eng.is_main():
        checksums.write_manifest(staging / tag, leave_out=(STATE_FILE,))  # every rank's files are written by now
        # what the numbers depend on besides the options: a resume says where it changed
        artifacts.write_json(staging / tag / STATE_FILE, {**state, "step": step, "provenance": provenance.provenance()})
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging / tag, final)
        artifacts.write_text(root / LATEST_FILE, tag + "\n")
        shutil.rmtree(staging, ignore_errors=True)
        _prune(root, keep)
    eng.barrier()
    return final


def _complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and _complete(p)]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint (``latest`` if it points at one, else the highest step)."""
    root = Path(root)
    pointer = root / LATEST_FILE
    if pointer.is_file():
        candidate = root / pointer.read_text(encoding="utf-8").strip()
        if candidate.name and _complete(candidate):
            newer = [p for p in list_checkpoints(root) if p.name > candidate.name]
            return newer[-1] if newer else candidate
    found = list_checkpoints(root)
    return found[-1] if found else None


def resumable(root: str | Path) -> tuple[Path | None, list[str]]:
    """(the newest checkpoint under ``root`` whose files match its manifest, or None; a line for
    each newer one skipped, naming the file that does not)."""
    skipped = []
    for folder in reversed(list_checkpoints(root)):
        why = checksums.problem(folder, STATE_FILE)
        if why is None:
            return folder, skipped
        skipped.append(f"{folder.name} ({why})")
    return None, skipped


def skipped_line(skipped: list[str], found: Path | None) -> str:
    """The start-up line of a --resume that passed over broken checkpoints."""
    to = f"resuming from {found.name}" if found is not None else "none is left to resume from"
    return f"--resume: skipped {', '.join(skipped)} (set aside as .damaged-<name>): {to}"


def read_state(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / STATE_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{path}: empty or not JSON (a damaged checkpoint): remove its folder to resume from an earlier one") from None


# Options a resumed run may change: they decide where, how often and on what a run writes or
# evaluates, never a training step (evaluation draws from its own forked generators, and
# --strict either stops or keeps exactly the same rows). Changing one is applied and said.
RESUME_MAY_CHANGE = frozenset(
    {"resume", "run_dir", "debug", "save_every", "eval_every", "eval_records", "eval_prompts", "show_samples", "parse_workers", "strict"}
)
# What sets a run's length: extending a finished run (train/extending.py) changes it, and says so
LENGTH = frozenset({"max_steps", "epochs", "steps"})


def config_state(config: Any) -> dict[str, Any]:
    """The resolved options of a run as plain JSON data, stored in each checkpoint."""
    from . import config as config_module

    return json.loads(json.dumps(config_module.to_dict(config), default=str))


def _defaults(config: Any) -> dict[str, Any]:
    """Each option's default: what a checkpoint written before the option existed used."""
    import dataclasses

    defaults = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return json.loads(json.dumps(defaults, default=str))


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def check_fingerprint(found: Path, expected: dict[str, Any], config: Any = None, *, lengthen: bool = False) -> list[str]:
    """Refuse to resume ``found`` when it was written with other options: the resumed run
    would silently differ from an uninterrupted one. One line names every changed option
    with its old and new value.

    ``expected`` holds what the data and the schedule derive (example counts, steps);
    ``config`` (the resolved options) is compared whole, so a new option is covered the
    day it is added. Options in :data:`RESUME_MAY_CHANGE` may differ: the returned lines
    say which new values apply. With ``lengthen`` (a finished run extended) so may the
    run's length (:data:`LENGTH`), which the extension's own line reports.
    """
    state = read_state(found)
    refused, applied = [], []
    free = LENGTH if lengthen else frozenset()
    saved_config = state.get("config")
    compared = set()
    if config is not None and saved_config is not None:
        current = config_state(config)
        defaults = _defaults(config)
        for key, value in current.items():
            old = saved_config.get(key, defaults.get(key))
            compared.add(key)
            if old == value or key == "resume" or key in free:
                continue
            change = f"{_flag(key)} was {old!r}, now {value!r}"
            (applied if key in RESUME_MAY_CHANGE else refused).append(change)
    saved = state.get("fingerprint", {})
    for key, value in expected.items():
        if key not in compared and key not in free and key in saved and saved[key] != value:
            refused.append(f"{key} was {saved[key]!r}, now {value!r}")
    if refused:
        raise UserError(
            f"--resume: {found} was written with other options ({'; '.join(refused)}); "
            "rerun with the checkpoint's values, or start afresh without --resume"
        )
    notes = [f"--resume: applying {change} (no training step depends on it)" for change in applied]
    changed = provenance.differences(state.get("provenance"), provenance.provenance())
    if changed:
        notes.append(
            f"--resume: the checkpoint was written with {'; '.join(changed)}: the run goes on, and may depart "
            "from one that was never stopped"
        )
    return notes


def nothing_to_resume(root: str | Path) -> UserError:
    """The error of ``--resume`` where no checkpoint is (as Hugging Face's Trainer refuses
    ``resume_from_checkpoint=True`` then): a typo in ``--run-dir`` must not start afresh."""
    return UserError(
        f"--resume: no checkpoint in {root}: nothing to resume (check --run-dir; "
        "a run stopped before its first checkpoint starts again without --resume)"
    )


def run_length(state: dict[str, Any]) -> int | None:
    """The steps of the run a checkpoint belongs to (sft and rm: ``steps``; ppo: ``max_steps``),
    not the checkpoint's own step: the last one is saved before the end."""
    fingerprint = state.get("fingerprint") or {}
    steps = fingerprint.get("steps") or fingerprint.get("max_steps")
    return int(steps) if steps else None


def check_unfinished(folder: str | Path) -> None:
    """Refuse to resume a checkpoint that :func:`retire` emptied: its run finished."""
    state = read_state(folder)
    if state.get("finished"):
        steps = run_length(state)
        length = f" all its {steps} step{'' if steps == 1 else 's'}" if steps else ""
        raise UserError(
            f"--resume: {Path(folder).parent} belongs to a run that finished{length}; "
            "nothing to resume: run without --resume to train again, or give a larger --max-steps to extend it"
        )


def mark_finished(root: str | Path, step: int, state: dict[str, Any]) -> None:
    """A finished run's last word under ``root``: a checkpoint of its trainer state alone at
    its final ``step`` (every rank calls this; rank 0 writes). With ``--save-every 0`` it is
    the only one, and it is what ``--resume --max-steps N`` extends (train/extending.py)."""
    root = Path(root)
    if eng.is_main():
        folder = root / tag_for(step)
        folder.mkdir(parents=True, exist_ok=True)
        artifacts.write_json(folder / STATE_FILE, {**state, "step": step, "finished": True, "provenance": provenance.provenance()})
        artifacts.write_text(root / LATEST_FILE, folder.name + "\n")
    eng.barrier()


def load_checkpoint(engine, folder: str | Path) -> dict[str, Any]:
    """Restore model, optimizer, scheduler and this rank's random state; returns the trainer state."""
    import torch

    folder = Path(folder)
    check_unfinished(folder)
    engine.load_checkpoint(
        str(folder.parent), tag=folder.name, load_optimizer_states=True, load_lr_scheduler_states=True,
        load_module_strict=not lora.is_adapted(engine.module),  # a LoRA checkpoint holds no frozen base
    )  # fmt: skip
    rng_file = folder / f"rng-rank{eng.rank()}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return read_state(folder)


def clear_checkpoints(root: str | Path) -> None:
    """Remove every checkpoint under ``root`` (a fresh run must not resume an older one)."""
    root = Path(root)
    if eng.is_main() and root.is_dir():
        shutil.rmtree(root)
    eng.barrier()


def retire(root: str | Path) -> None:
    """After the stage finished: keep each checkpoint's trainer state (what ``--resume``
    checks the options against) and drop the model, optimizer and random states, which a
    finished run never reads again. They were most of a run directory: with ``--preset
    cpu-tiny``, 148 of 211 MB (model weights and both Adam moments, four times over)."""
    root = Path(root)
    if not eng.is_main() or not root.is_dir():
        return
    for stale in root.rglob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for state_file in (f for f in root.rglob(STATE_FILE) if not f.parent.name.startswith(".damaged-")):  # those stay as found
        folder = state_file.parent
        state = read_state(folder)
        for item in folder.iterdir():
            if item.name != STATE_FILE:
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        artifacts.write_json(state_file, {**state, "finished": True})


def _prune(root: Path, keep: int) -> None:
    for old in list_checkpoints(root)[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Hugging Face export


def export_pretrained(
    engine,
    out_dir: str | Path,
    *,
    tokenizer=None,
    unwrap: Callable[[Any], Any] | None = None,
    config_updates: dict[str, Any] | None = None,
    save: Callable[[Any, Path], None] | None = None,
) -> Path:
    """Write ``save_pretrained`` files into ``out_dir``; every rank must call this.

    Under ZeRO-3 the parameters are gathered (a collective) and rank 0 saves them while
    they are whole; tied weights stay tied, so they are written once. ``unwrap`` maps the
    engine's module to the Hugging Face model to save (stages that train a wrapper around
    one). ``config_updates`` are extra ``config.json`` keys. Files appear in ``out_dir``
    with ``config.json`` last, which is what marks a stage output as finished
    (:meth:`RunDir.require`); other entries of ``out_dir`` (``checkpoints/``) are kept.
    ``save(model, folder, out_dir)`` replaces ``model.save_pretrained(folder)`` (a LoRA model's
    merged weights and adapter: :func:`marlhf_cli.lora.merged_saver`); ``folder`` is staging,
    moved to ``out_dir`` once complete.
    """
    out_dir = Path(out_dir)
    model = unwrap(engine.module) if unwrap else engine.module
    staging = None
    if eng.is_main():
        for key, value in (config_updates or {}).items():
            setattr(model.config, key, value)
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        eng.release_prefetched(engine)
        with eng.gathered_params(engine):
            if eng.is_main():
                save(model, staging, out_dir) if save else model.save_pretrained(staging)
        if eng.is_main():
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
            artifacts.honour_umask(staging)  # safetensors writes model.safetensors 0600
            _move_into(staging, out_dir)
    except Exception as error:
        full = full_disk(error, out_dir)
        if full is None:
            raise
    else:
        full = None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if full is not None:  # raised outside the handler, as for a checkpoint (save_checkpoint)
        import gc

        gc.collect()
        raise DiskFull(f"the disk is full: the trained model could not be exported to {out_dir} ({full}); its partial "
                       "files were removed and the run's checkpoints stand: free some space, then rerun with --resume")  # fmt: skip
    eng.barrier()
    return out_dir


def _move_into(staging: Path, out_dir: Path) -> None:
    """Replace the model files of ``out_dir`` by those of ``staging``, config.json last."""
    (out_dir / "config.json").unlink(missing_ok=True)
    new = {p.name for p in staging.iterdir()}
    for old in out_dir.iterdir():
        if old.is_file() and old.name not in new:
            old.unlink()
    for item in sorted(staging.iterdir(), key=lambda p: p.name == "config.json"):
        if item.is_dir() and (out_dir / item.name).is_dir():  # adapter/ of an earlier export
            shutil.rmtree(out_dir / item.name)
        os.replace(item, out_dir / item.name)
