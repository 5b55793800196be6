"""The run directory: its layout, atomic writes, the run.json manifest, stage look-ups.

Every stage of one experiment shares one directory (``--run-dir``)::

    run.json            resolved config, inputs, library versions and final metrics per stage
    sft/  rm/           Hugging Face ``save_pretrained`` folders (plus checkpoints/ for resume)
    ppo/<name>/         the PPO actor and critic of the run called <name>
    samples/<name>.jsonl  responses for ``judge``     bon/  judge/  metrics/  plots/

Writes go to a temporary file in the same folder followed by ``os.replace``, so a killed
process leaves either the old file or the new one, never half of one. The temporary file is
created private (0600) and the rename would keep that, so it is given the mode any other new
file gets under the process's umask first: colleagues on a shared machine can read results.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from . import provenance
from .errors import UserError


LAYOUT = ("sft", "rm", "ppo", "samples", "bon", "judge", "metrics", "plots")

# What produces each stage's output, for the "run this first" message.
PRODUCERS = {
    "sft": "marlhf sft",
    "rm": "marlhf rm",
    "ppo": "marlhf ppo",
    "samples": "marlhf ppo",
}


# run.json entries this process marked "running" and has not finished: what Ctrl-C leaves
_RUNNING: dict[tuple[Path, str], "RunDir"] = {}
# (run directory, stage) whose outputs this process holds the lock on (RunDir.writing)
_HELD: set[tuple[Path, str]] = set()


# ---------------------------------------------------------------------------------------
# atomic writes


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel tells it (Linux >= 4.7).

    ``os.umask`` can only be read by setting it; the fallback sets and restores it at once,
    which another thread creating a file in between could observe.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | Path) -> None:
    """Give ``path`` (and, for a folder, everything under it) the mode a plain new file or
    folder gets: writers that go through a private temporary file (``mkstemp``,
    ``mkdtemp``, safetensors) otherwise leave 0600/0700 behind."""
    path = Path(path)
    mask = current_umask()
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in items:
        if item.is_symlink():
            continue
        os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    On any exception (or a kill) the temporary file is removed or left as an orphan ``.tmp``
    file, and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # flush the data to disk before the rename makes it visible
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        honour_umask(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> Path:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return Path(path)


def write_figure(path: str | Path, fig) -> Path:
    """Save a matplotlib figure as PNG atomically, then close it (figures hold memory)."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def append_jsonl(path: str | Path, row: Any) -> None:
    """Append one line (metrics streams): a torn last line is tolerated by :func:`read_jsonl`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        handle.flush()


def read_jsonl(path: str | Path) -> list[Any]:
    """Read a JSONL stream written by this package; a torn final line (a kill) is dropped."""
    rows = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if index == len(lines) - 1:
                break
            raise
    return rows


# ---------------------------------------------------------------------------------------
# the run directory


def check_run_dir(path: str | Path, flag: str = "--run-dir") -> None:
    """One-line error when nothing could be written at ``path``; creates nothing.

    Checked when the options are, so a typo fails before a model loads. A path that is, or
    runs through, a regular file can never be a folder. Otherwise the folder that would
    hold it (``path`` itself, or its nearest existing parent) must take a new entry: tried
    with an empty folder made and removed at once, since permission bits say nothing for
    root, who can still not write to a read-only mount or to /sys.
    """
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a dangling link: its target is missing
            raise UserError(f"{flag} {path}: {existing} is a link to a missing {os.readlink(existing)}")
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".marlhf-write-test-", dir=existing))
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot write in {existing} ({err.strerror or err})") from None


class RunDir:
    """One experiment's directory; knows where every stage reads and writes."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    # layout -----------------------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @contextlib.contextmanager
    def writing(self, key: str) -> Iterator[None]:
        """Hold, for the block, the lock on stage ``key``'s outputs (``sft``, ``ppo/<name>``, ...):
        a second process writing the same stage of the same run directory is refused in one
        line naming the holder (its process id, since when, its command). An advisory
        ``flock`` on ``.locks/<key>.lock``: the kernel drops it when the holder exits, killed or
        not, so a killed run never blocks the next one. Only rank 0 of a process group takes
        it; a process that holds it already (a stage calling another) goes on."""
        import fcntl
        import shlex
        import sys

        held = (self.root.resolve(), key)
        # (--nproc's children: the process that relaunched them holds it: launch.LOCK_HELD)
        if int(os.environ.get("RANK", "0") or 0) != 0 or held in _HELD or os.environ.get("MARLHF_LOCK_HELD"):
            yield
            return
        path = self.path(".locks", safe_name(key.replace("/", "-")) + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            elsewhere = "--run-dir, or --name" if key.startswith("ppo/") else "--run-dir"
            raise UserError(f"{key} in {self.root} is being written by {holder}: wait for it to end, or write elsewhere ({elsewhere})") from None
        except OSError as error:  # a filesystem without locks (some NFS and FUSE mounts): say so, write unlocked
            handle.close()
            print(f"note: {path.parent} cannot be locked ({error.strerror or error}): nothing stops a second run from "
                  f"writing {key} beside this one", file=sys.stderr)
            handle = None
        if handle is None:
            yield
            return
        handle.seek(0)
        handle.truncate()
        since = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        handle.write(f"process {os.getpid()} (since {since}: {shlex.join(sys.argv[:8])})\n")
        handle.flush()
        _HELD.add(held)
        try:
            yield
        finally:
            _HELD.discard(held)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    def stage_dir(self, stage: str, name: str | None = None) -> Path:
        if stage == "ppo":
            if not name:
                raise ValueError("a ppo stage directory needs a run name")
            return self.path("ppo", name)
        return self.path(stage)

    def metrics_path(self, stage: str) -> Path:
        return self.path("metrics", f"{stage}.jsonl")

    def plot_path(self, name: str) -> Path:
        return self.path("plots", f"{name}.png")

    def samples_path(self, name: str) -> Path:
        return self.path("samples", f"{name}.jsonl")

    @property
    def manifest_path(self) -> Path:
        return self.path("run.json")

    # what earlier stages left -------------------------------------------------------------
    def require(self, stage: str, name: str | None = None) -> Path:
        """The finished output of ``stage``, or a one-line error naming the command to run."""
        target = self.stage_dir(stage, name) if stage != "samples" else self.samples_path(name or "")
        done = target.is_file() if stage == "samples" else (target / "config.json").is_file()
        if not done:
            command = PRODUCERS.get(stage, f"marlhf {stage}")
            if stage in ("ppo", "samples") and name:
                command += f" --name {name}"
            raise UserError(
                f"{target} is missing: run '{command} --run-dir {self.root}' first"
            )
        return target

    def policy(self, value: str | None) -> tuple[str, str]:
        """(model folder or id, a name for its results) of a --policy or --model that may name
        a stage of this run: sft (the default), dpo, ppo (the one PPO run), ppo/<name>, a folder
        of the run; anything else is a folder or hub id as it is."""
        value = value or "sft"
        if value in ("sft", "dpo"):
            return str(self.require(value)), value
        if value == "ppo":
            names = sorted(p.name for p in self.path("ppo").glob("*") if (p / "config.json").is_file())
            if len(names) != 1:
                found = ", ".join(f"ppo/{n}" for n in names) or "none"
                raise UserError(f"--policy ppo is ambiguous: name one of the PPO runs in {self.root} (found: {found})")
            value = f"ppo/{names[0]}"
        if value.startswith("ppo/") and not Path(value).exists():
            name = value.split("/", 1)[1]
            return str(self.require("ppo", name)), f"ppo-{name}"
        if (self.path(value) / "config.json").is_file():
            return str(self.path(value)), safe_name(value)
        return value, safe_name(Path(value).name or value)

    def clear_outputs(self, stage: str, name: str | None = None) -> list[Path]:
        """Remove what an earlier run of ``stage`` (``ppo``: of run ``name``) left behind: its
        model folder (all but ``checkpoints/``, which resume handles), samples, plots and
        TensorBoard log. A fresh run calls this once its options are checked, so that when it
        is interrupted no earlier run's finished model sits beside its own "running" entry.
        ``config.json``, the mark of a finished stage (:meth:`require`), goes first.
        Returns what was removed.
        """
        import shutil

        folder = self.stage_dir(stage, name)
        prefix = f"{stage}-{name}" if stage == "ppo" else stage  # the monitor's name for the stage
        found = []
        if folder.is_dir():
            found += sorted((p for p in folder.iterdir() if p.name != "checkpoints"), key=lambda p: p.name != "config.json")
        if stage == "ppo" and name:
            found.append(self.samples_path(name))
        # plots/<prefix>-<metric>.png; a metric has no '-', so ppo-a-<metric> never takes ppo-a-b's plots
        plots = self.path("plots")
        if plots.is_dir():
            found += [p for p in plots.glob(f"{prefix}-*.png") if "-" not in p.name[len(prefix) + 1 : -len(".png")]]
        found.append(self.path("tb", prefix))
        removed = []
        for path in found:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            else:
                continue
            removed.append(path)
        return removed

    # the manifest ---------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        if not self.manifest_path.is_file():
            return {"stages": {}}
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            raise UserError(f"{self.manifest_path}: not valid JSON; fix or remove it") from None

    def record_stage(
        self,
        stage: str,
        *,
        config: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        status: str = "finished",
    ) -> dict[str, Any]:
        """Write (or update) one stage's entry in run.json, atomically."""
        manifest = self.manifest()
        entry = manifest.setdefault("stages", {}).setdefault(stage, {})
        entry["status"] = status
        entry["updated"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        made_with = provenance.provenance()
        entry["versions"] = made_with.pop("versions")
        entry["provenance"] = made_with  # marlhf's commit, the command, the CPU, the GPUs
        if config is not None:
            entry["config"] = config
        if inputs is not None:
            entry["inputs"] = inputs
        if metrics is not None:
            entry["metrics"] = metrics
        write_json(self.manifest_path, manifest)
        if status == "running":
            _RUNNING[(self.root, stage)] = self
        else:
            _RUNNING.pop((self.root, stage), None)
        return entry


def mark_unfinished(status: str) -> list[str]:
    """Each run.json entry this process left "running" says ``status`` instead: "interrupted"
    after Ctrl-C or SIGTERM, "failed" after an error the command reports (a killed process
    cannot say anything, and its entry stays "running"). Returns the stages."""
    stages = []
    for (_, stage), run in list(_RUNNING.items()):
        try:
            run.record_stage(stage, status=status)
        except (OSError, UserError):  # the run directory went away or was damaged meanwhile
            continue
        stages.append(stage)
    return stages


def safe_name(name: str) -> str:
    """``name`` as a file name: runs of anything but letters, digits, '.', '_' and '-' become '-'."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "policy"
