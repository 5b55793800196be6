"""``--push-to-hub REPO`` and ``marlhf push RUN_DIR/STAGE REPO``: a stage's export on the Hub,
with a model card.

The export (``sft/``, ``rm/``, ``dpo/``, ``ppo/<name>/`` with its ``critic/``) is a ``save_pretrained``
folder; what is uploaded is that folder without its resume checkpoints, plus ``README.md``:
a model card written from the run directory's ``run.json`` entry of the stage (the base
model, the stage, the termination rule and estimator, the dataset, the steps, the final
figures and the command that trained it). A LoRA export keeps the adapter's own card in
``adapter/README.md``. Upload is ``huggingface_hub``'s ``create_repo`` and ``upload_folder``;
with no network (or ``HF_HUB_OFFLINE``) it is a one-line error before anything is sent.
:func:`plan` is the file list and the card without uploading (``marlhf push --dry-run``),
which is what the tests check: the upload itself needs the Hub.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import UserError

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
LEFT_OUT = ("checkpoints",)  # resume state, not the model


def check_repo_id(text: str) -> str:
    """``owner/name`` as the Hub spells a repository; ValueError otherwise."""
    if not REPO_ID.fullmatch(str(text)) or ".." in str(text):
        raise ValueError(text)
    return str(text)


def stage_of(folder: Path) -> tuple[Path, str]:
    """(run directory, run.json's stage key) of an export folder: ``RUN/sft`` -> (RUN, 'sft'),
    ``RUN/ppo/NAME`` -> (RUN, 'ppo/NAME')."""
    folder = Path(folder)
    if folder.parent.name == "ppo":
        return folder.parent.parent, f"ppo/{folder.name}"
    return folder.parent, folder.name


def _entry(folder: Path) -> tuple[str, dict]:
    run, key = stage_of(folder)
    manifest = run / "run.json"
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder}: no exported model here (config.json is missing): finish the stage first")
    stages = json.loads(manifest.read_text()).get("stages", {}) if manifest.is_file() else {}
    if key not in stages or stages[key].get("status") != "finished":
        raise UserError(f"{folder}: {manifest} has no finished '{key}' stage to describe")
    return key, stages[key]


def card(folder: Path, repo: str) -> str:
    """The model card of an export, from its run.json entry."""
    key, entry = _entry(folder)
    config, inputs, metrics = entry.get("config", {}), entry.get("inputs", {}), entry.get("metrics") or {}
    base = inputs.get("policy") or config.get("model") or inputs.get("model") or "?"
    lines = [
        "---", "library_name: transformers", "tags:", "- marlhf", "- rlhf" if key.startswith("ppo") else f"- {key}", "---", "",
        f"# {repo}", "",
        f"Trained with marlhf `{key.split('/')[0]}` (MA-RLHF: RLHF with macro actions, Chai et al., ICLR 2025).",
        "", "| | |", "|---|---|", f"| stage | `{key}` |", f"| base | `{base}` |",
    ]  # fmt: skip
    if key.startswith("ppo"):
        lines += [f"| credit assignment | {inputs.get('credit_assignment', '?')} |", f"| reward | {inputs.get('reward', '?')} |"]
        if config.get("advantage", "gae") == "gae":  # rloo, grpo, mc and tree train no critic
            lines.append(f"| critic from | `{inputs.get('reward_model', '?')}` |")
    source = inputs.get("source") or config.get("data_file") or config.get("dataset")
    lines += [f"| dataset | `{config.get('dataset')}` ({source}) |", f"| steps | {metrics.get('steps', '?')} |", ""]
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if shown:
        lines += ["## Final figures", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in shown.items()]
        lines.append("")
    command = (entry.get("provenance") or {}).get("command")
    if command:
        lines += ["## Command", "", "```bash", command if isinstance(command, str) else " ".join(command), "```", ""]
    commit = (entry.get("provenance") or {}).get("commit")
    lines += [f"marlhf {(entry.get('provenance') or {}).get('marlhf', '?')}" + (f", commit {commit}" if commit else "") + "."]
    return "\n".join(lines) + "\n"


def plan(folder: Path, repo: str) -> tuple[list[str], str]:
    """(the files an upload sends, relative to the export folder, with README.md; the card)."""
    folder = Path(folder)
    text = card(folder, check_repo_id(repo))
    files = sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*")
        if p.is_file() and not any(part in LEFT_OUT for part in p.relative_to(folder).parts)
    )  # fmt: skip
    return sorted(set(files) | {"README.md"}), text


def push(folder: Path, repo: str, say, *, after_stage: bool = True) -> str:
    """Upload the export with its card; the repository's URL. One line when the Hub is
    unreachable, in the words of what asked: a stage's ``--push-to-hub`` (``after_stage``,
    which points to ``marlhf push`` for later) or ``marlhf push`` itself."""
    from .data.hub import offline_mode, probe_endpoint

    files, text = plan(folder, repo)
    why = "offline mode (HF_HUB_OFFLINE)" if offline_mode() else probe_endpoint()
    if why and after_stage:
        raise UserError(f"--push-to-hub {repo}: the Hub is unreachable ({why}); nothing was uploaded "
                        f"(marlhf push {folder} {repo} uploads it later)")  # fmt: skip
    if why:
        raise UserError(f"marlhf push: the Hub is unreachable ({why}); nothing was uploaded (the export stays in {folder})")
    import tempfile

    from huggingface_hub import HfApi

    api = HfApi()
    try:
        url = api.create_repo(repo, exist_ok=True, repo_type="model")
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "README.md").write_text(text, encoding="utf-8")
            api.upload_file(path_or_fileobj=str(Path(tmp, "README.md")), path_in_repo="README.md", repo_id=repo)
        api.upload_folder(folder_path=str(folder), repo_id=repo, ignore_patterns=[f"{p}/**" for p in LEFT_OUT] + ["README.md"],
                          commit_message=f"marlhf: {stage_of(folder)[1]}")  # fmt: skip
    except Exception as error:  # noqa: BLE001 - one line, whatever the Hub answered
        first = (str(error).strip().splitlines() or [""])[0][:200]
        asked = f"--push-to-hub {repo}" if after_stage else "marlhf push"
        raise UserError(f"{asked}: the upload failed ({type(error).__name__}: {first})") from None
    say(f"pushed {folder} ({len(files)} files) to {url}")
    return str(url)
