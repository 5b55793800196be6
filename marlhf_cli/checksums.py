"""What a checkpoint folder held when it was written, and whether it still does.

:func:`write_manifest` records the size and a BLAKE2b checksum of every file of a checkpoint
once all its ranks have written (``manifest.json``, beside the trainer state, which is written
last and so is in no manifest); :func:`problem` checks a folder against it when a run resumes:
a file missing, cut short or changed, or a trainer state that is empty or not JSON, is named in
one sentence, so that ``--resume`` can skip that checkpoint for an earlier one that is whole.
A checkpoint written before manifests existed has none and is taken as it is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"
BLOCK = 1 << 22


def digest(path: Path) -> str:
    """The BLAKE2b checksum of a file's bytes (hex; 1 GiB in ~1-2 s on one core)."""
    hashed = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            hashed.update(block)
    return hashed.hexdigest()


def _files(folder: Path, leave_out: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, *leave_out))


def write_manifest(folder: str | Path, leave_out: tuple[str, ...] = ()) -> Path:
    """``folder/manifest.json``: {relative path: {"bytes": size, "blake2b": checksum}} of every
    file under ``folder`` but ``leave_out`` (the trainer state, written after it)."""
    from .artifacts import write_json

    folder = Path(folder)
    entries = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "blake2b": digest(p)} for p in _files(folder, leave_out)}
    return write_json(folder / MANIFEST, entries)


def problem(folder: str | Path, state_file: str) -> str | None:
    """Why the checkpoint ``folder`` cannot be resumed from, in a few words, or None when it
    is whole: its trainer state ``state_file`` parses, and every file its manifest lists has
    the size and checksum recorded there."""
    folder = Path(folder)
    try:
        state = json.loads((folder / state_file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{state_file} is missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"{state_file} is empty or not JSON"
    if not isinstance(state, dict):
        return f"{state_file} holds no trainer state"
    manifest = folder / MANIFEST
    if state.get("finished") or not manifest.is_file():  # a finished run keeps its state alone
        return None
    try:
        entries = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"{MANIFEST} is empty or not JSON"
    if not isinstance(entries, dict) or not all(isinstance(r, dict) and {"bytes", "blake2b"} <= set(r) for r in entries.values()):
        return f"{MANIFEST} holds no entries of sizes and checksums"
    for name, recorded in entries.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != recorded["bytes"]:
            return f"{name} is {size:,} bytes, {recorded['bytes']:,} when written"
        if digest(path) != recorded["blake2b"]:
            return f"{name} has changed since it was written (its checksum differs)"
    return None


def set_aside(root: str | Path, newer_than: str, prefix: str) -> list[str]:
    """Move the checkpoint folders under ``root`` named ``prefix...`` after ``newer_than`` (the
    ones a --resume passed over as damaged) to ``.damaged-<name>``, out of what is listed,
    pruned and resumed from, but kept to look at; their new names."""
    moved = []
    for folder in sorted(p for p in Path(root).glob(prefix + "*") if p.is_dir() and p.name > newer_than):
        target, copy = folder.with_name(f".damaged-{folder.name}"), 1
        while target.exists():
            target, copy = folder.with_name(f".damaged-{copy}-{folder.name}"), copy + 1
        folder.rename(target)
        moved.append(target.name)
    return moved
