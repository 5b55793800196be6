"""``load_records``: any supported source -> validated records of one split, plus a report.

Where the rows come from
  * ``load_records("tldr")`` (or ``hh``, ``webgpt``, ``apps``): the hub, through
    ``datasets.load_dataset``. When the hub cannot be reached (no network, or
    ``HF_DATASETS_OFFLINE=1`` with nothing cached) the embedded sample shipped in
    ``marlhf_cli/data/samples`` is used instead, written in the hub's own row format so the
    same adapter parses it, and ``LoadResult.notice`` says so in one line (also logged at
    INFO level on ``marlhf_cli.data``; the CLI prints the notice).
  * ``load_records("hh", data_file="hh.jsonl")``: that file, read with that dataset's
    adapter (which accepts the hub's row shape and the shapes of the real files in
    ../shared/data, e.g. Anthropic's raw HH transcripts).
  * ``load_records("rows.jsonl")`` or ``load_records("auto", data_file="rows.jsonl")``: the
    format is detected from the first row -- the paper datasets' hub or shared-file shapes
    first (TL;DR, WebGPT, APPS, raw HH transcripts), then TRL's conventions.

Splits
  SFT 20% / RM 40% / PPO 40% (APPS: SFT 20% / PPO 80%, no RM), deterministic by ``seed``,
  grouped so related rows stay together (TL;DR: the post; HH, WebGPT, TRL files: the
  prompt; APPS: the question). A source of demonstrations only (TRL ``messages`` or
  ``prompt``/``completion`` files, TL;DR's reference summaries) can feed no reward model,
  so by default it is not shared out: ``sft`` trains on all of it and ``ppo`` samples
  prompts from all of it; so is a file of TRL's text rows (sft's alone) or prompt-only
  rows (ppo's alone), and a preference file in TRL's format (each of sft, rm and ppo takes
  all of it, as TRL's trainers take the dataset they are given). ``shares`` (``--split-shares``, see
  :func:`.splits.parse_split_shares`) replaces these proportions. ``eval`` is the hub's own
  validation/test split where it has one (TL;DR ``validation``, HH ``test``, APPS
  ``test``); otherwise (WebGPT, local files, embedded samples) 10% of the groups are held
  out first, the same groups whatever the shares, and SFT/RM/PPO share the other 90%; a
  fourth ``--split-shares`` number holds out its own share instead (``0/0/2/1``: a third).
  ``split=None`` returns every record in source order. ``limit`` keeps the first N records
  of the chosen split (a random sample of it, since a split is in shuffled group order), so
  a small limit never moves rows between splits.

Bad input
  File-level problems always raise a one-line :class:`~marlhf_cli.errors.UserError` (exit
  code 2) naming the file and line: a missing file, bytes that are not UTF-8, a malformed
  JSON line, a file whose format cannot be recognised. Row-level content problems -- a
  missing or wrongly typed field, empty text, chosen identical to rejected, an HH prompt
  mismatch -- are skipped and counted in ``LoadResult.report`` (per reason, with the first
  locations); with ``strict=True`` the first one raises, naming file, line and field. Rows
  the recipe drops on purpose (WebGPT ties, ...) are counted as ``dropped``, never errors.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import UserError, bad_input
from ..wording import count
from .hub import HubSpec, HubUnreachable, first_line, load_hub_rows, offline_mode
from .local import is_data_file, read_rows
from .records import KIND_NAMES, NOT_AN_OBJECT, Dropped, Parsed, RowProblem, record_kind, type_name
from .registry import ADAPTERS, DATASETS, Adapter, detect_format
from .report import SkipReport
from .splits import DEMONSTRATION_FRACTIONS, SPLITS, TRAINING_SPLITS, eval_share, split_by_groups, with_eval

log = logging.getLogger("marlhf_cli.data")

AUTO = ("auto", "file", "local")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name on the Hugging Face Hub


@dataclass
class LoadResult:
    """Records of one split and how they were obtained.

    ``report`` describes the whole source that was read (all splits), ``source`` is
    ``"hub:<repo>"``, ``"embedded:<name>"`` or the file path, ``notice`` a one-line message
    for the user when something noteworthy happened (the hub fallback), else ``None``.
    ``dataset`` and ``variant`` name the adapter and row shape used. ``total`` counts the
    records the split was cut from (a hub's own eval split is a source of its own),
    ``available`` the split's records before ``limit``, ``fractions`` each split's share
    of ``total`` (empty when nothing was split).
    """

    records: list[dict]
    report: SkipReport
    source: str
    notice: str | None
    dataset: str
    variant: str
    split: str | None
    total: int = 0
    available: int = 0
    fractions: dict[str, float] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """'preference', 'demonstration', 'problem', 'prompt' or 'text': which stages these records can feed."""
        if self.records:
            return record_kind(self.records[0])
        return "problem" if self.dataset == "apps" else "preference"

    def require(self, stage: str, kinds: tuple[str, ...]) -> "LoadResult":
        """Itself, or a one-line error when its records are of a kind ``stage`` cannot use
        (a text file given to ``rm``, prompts alone given to ``sft``)."""
        if self.records and self.kind not in kinds:
            needs = " or ".join(KIND_NAMES[kind] for kind in kinds)
            raise UserError(f"{self.source} holds {KIND_NAMES[self.kind]}: {stage} needs {needs}")
        return self


def load_records(
    dataset: str,
    *,
    data_file: str | Path | None = None,
    split: str | None = None,
    seed: int = 0,
    strict: bool = False,
    limit: int | None = None,
    shares: dict[str, float] | None = None,
    dataset_config: str | None = None,
    dataset_split: str = "train",
) -> LoadResult:
    """Load, validate and split a dataset (see the module doc for sources, splits, bad input).

    ``shares``: SFT/RM/PPO proportions (:func:`.splits.parse_split_shares`); None for the
    defaults (the paper's, or all to SFT for demonstrations). ``dataset_config`` and
    ``dataset_split``: the configuration and split of a hub id (``--dataset owner/name``)."""
    if split is not None and split not in SPLITS:
        raise UserError(f"unknown split '{split}': expected one of {', '.join(SPLITS)}")
    if limit is not None and limit < 0:
        raise UserError(f"limit must be 0 or more, got {limit}")
    check_source(dataset, data_file)
    name = str(dataset).strip()
    if data_file is not None:
        result = _from_file(Path(data_file), ADAPTERS.get(name.lower()), split, seed, strict, shares)
    elif name.lower() in DATASETS:
        result = _from_hub(DATASETS[name.lower()], split, seed, strict, shares)
    elif is_hub_id(name):
        result = _from_hub_id(name, dataset_config, dataset_split, split, seed, strict, shares)
    else:
        result = _from_file(Path(name), None, split, seed, strict, shares)
    result.available = len(result.records)
    if limit is not None:
        result.records = result.records[:limit]
    return result


def check_source(dataset: str, data_file: str | Path | None = None) -> None:
    """One-line error for a --dataset (with or without --data-file) that names no source.

    Cheap (no file is read): the config layer calls it before any stage starts.
    """
    name = str(dataset).strip()
    if data_file is not None:
        if name.lower() not in ADAPTERS and name.lower() not in AUTO:
            raise _unknown(name)
        if not Path(data_file).expanduser().exists():  # before any stage imports torch
            raise UserError(f"{data_file}: file not found")
    elif name.lower() == "trl" or name.lower() in AUTO:
        raise UserError(f"--dataset {name} needs a file: pass --data-file PATH")
    elif name.lower() not in DATASETS and not is_data_file(name) and not is_hub_id(name):
        raise _unknown(name)


def hub_options(config: Any) -> dict[str, Any]:
    """:func:`load_records`' ``dataset_config`` and ``dataset_split`` from a stage's options
    (``--dataset-config``, ``--dataset-split``: what a hub id given as ``--dataset`` reads)."""
    return {"dataset_config": getattr(config, "dataset_config", None), "dataset_split": getattr(config, "dataset_split", "train")}


def is_hub_id(name: str) -> bool:
    """Whether a ``--dataset`` value is a Hugging Face Hub dataset id (``owner/name``) and no
    local file."""
    return bool(HUB_ID.fullmatch(name)) and not is_data_file(name)


def _from_hub_id(
    repo: str, config: str | None, hub_split: str, split: str | None, seed: int, strict: bool, shares: dict | None
) -> LoadResult:
    """Any hub dataset in a format marlhf reads (TRL's, or a paper dataset's hub shape), read
    through ``datasets.load_dataset`` (the local cache where the hub cannot be reached) and
    held out and shared like a local file: its rows are the user's, as a file's would be."""
    spec = HubSpec(repo, config, train_split=hub_split)
    source = f"hub:{repo} ({hub_split})" if config is None else f"hub:{repo} ({config}, {hub_split})"  # no brackets: rich markup
    try:
        rows = list(load_hub_rows(spec, hub_split))
    except HubUnreachable as err:
        if offline_mode():
            raise UserError(
                f"--dataset {repo}: offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and not in the local Hugging Face "
                "cache: load it once where the hub is reachable, with those variables unset"
            ) from None
        raise UserError(f"--dataset {repo}: not in the local Hugging Face cache and the hub cannot be reached ({err})") from None
    except Exception as err:  # noqa: BLE001 - the hub's answer: no such dataset, config or split
        raise UserError(f"--dataset {repo}{f' --dataset-config {config}' if config else ''} --dataset-split {hub_split}: "
                        f"{first_line(err)}") from None  # fmt: skip
    report = SkipReport()
    parsed, adapter, variant = _parse_rows(enumerate(rows, start=1), source, None, strict, report)
    fractions = with_eval(_fractions(adapter, _kind(parsed, adapter), split, shares, source), eval_share(shares))
    records = _select(parsed, fractions, split, seed)
    return LoadResult(records, report, source, None, adapter.name, variant, split, len(parsed), fractions=fractions)


def _unknown(name: str) -> UserError:
    names = ", ".join(DATASETS)
    return UserError(
        f"--dataset: unknown dataset '{name}': expected one of {names}, a .jsonl/.json/.parquet file, "
        "or a Hugging Face Hub id (owner/name)"
    )


def _from_file(
    path: Path, adapter: Adapter | None, split: str | None, seed: int, strict: bool, shares: dict | None
) -> LoadResult:
    report = SkipReport()
    parsed, adapter, variant = _parse_rows(read_rows(path), path, adapter, strict, report)
    fractions = with_eval(_fractions(adapter, _kind(parsed, adapter), split, shares, path), eval_share(shares))
    records = _select(parsed, fractions, split, seed)
    return LoadResult(records, report, str(path), None, adapter.name, variant, split, len(parsed), fractions=fractions)


def _from_hub(adapter: Adapter, split: str | None, seed: int, strict: bool, shares: dict | None) -> LoadResult:
    hub = adapter.hub
    if hub.eval_split is not None and shares and "eval" in shares:  # refused offline too: one verdict wherever it runs
        raise UserError(
            f"--split-shares: {adapter.name} is evaluated on the hub's own {hub.eval_split} split, so a fourth (held-out) "
            f"share does not apply: give three, or a file of it as --data-file"
        )
    fractions = _fractions(adapter, _kind([], adapter), split, shares, f"hub:{hub.repo}")
    report = SkipReport()
    try:
        if hub.eval_split is None:
            rows = _hub_rows(adapter, hub.train_split)
            parsed, _, variant = _parse_rows(rows, hub.source(hub.train_split), adapter, strict, report)
            fractions = with_eval(fractions, eval_share(shares))
            records, total = _select(parsed, fractions, split, seed), len(parsed)
        else:
            records, variant, total = [], "", 0
            if split != "eval":
                rows = _hub_rows(adapter, hub.train_split)
                parsed, _, variant = _parse_rows(rows, hub.source(hub.train_split), adapter, strict, report)
                records += _select(parsed, fractions, split, seed)
                total += len(parsed)
            if split in ("eval", None):
                rows = _hub_rows(adapter, hub.eval_split)
                parsed, _, variant = _parse_rows(rows, hub.source(hub.eval_split), adapter, strict, report)
                records += [p.record for p in parsed]
                total += len(parsed)
            if split == "eval":
                fractions = {"eval": 1.0}
    except HubUnreachable as err:
        return _from_sample(adapter, split, seed, strict, shares, reason=str(err))
    return LoadResult(records, report, f"hub:{hub.repo}", None, adapter.name, variant, split, total, fractions=fractions)


def _hub_rows(adapter: Adapter, hub_split: str) -> Iterable[tuple[int, Any]]:
    return enumerate(load_hub_rows(adapter.hub, hub_split), start=1)


def _from_sample(adapter: Adapter, split: str | None, seed: int, strict: bool, shares: dict | None, reason: str) -> LoadResult:
    report = SkipReport()
    path = adapter.sample_path
    parsed, _, variant = _parse_rows(read_rows(path), path, adapter, strict, report)
    fractions = with_eval(_fractions(adapter, _kind(parsed, adapter), split, shares, path), eval_share(shares))
    records = _select(parsed, fractions, split, seed)
    notice = (
        f"hub unreachable ({reason}): using the embedded {adapter.name} sample "
        f"({count(len(parsed), 'record')}) instead of {adapter.hub.repo}"
    )
    log.info(notice)
    source = f"embedded:{adapter.name}"
    return LoadResult(records, report, source, notice, adapter.name, variant, split, len(parsed), fractions=fractions)


# records no reward model can use: not shared out between the stages by default
UNSHARED_KINDS = ("demonstration", "text", "prompt")
# a file of the user's own in TRL's formats: each stage takes all of it, as TRL's trainers do
# (the paper's datasets keep the paper's 20/40/40; --split-shares shares any source out)
WHOLE_ADAPTERS = ("trl",)


def _kind(parsed: list[Parsed], adapter: Adapter) -> str:
    """Which stages the source can feed (a file's rows all have its first row's shape)."""
    if parsed:
        return record_kind(parsed[0].record)
    return "problem" if adapter.name == "apps" else "preference"


def _fractions(adapter: Adapter, kind: str, split: str | None, shares: dict | None, source: object) -> dict[str, float]:
    """The training splits' shares of the source (no eval yet), checked against ``split``:
    ``shares`` without its zeros, or by default the adapter's; demonstrations feed no reward
    model, so by default ``sft`` and ``ppo`` each take all of them (likewise text rows, which
    only ``sft`` reads, and prompt-only rows, which only ``ppo`` reads); a preference file in
    TRL's format goes whole to each stage too (WHOLE_ADAPTERS)."""
    if split == "rm" and kind in UNSHARED_KINDS:
        raise UserError(f"{source} holds {KIND_NAMES[kind]}, which cannot train a reward model: rm needs {KIND_NAMES['preference']}")
    if shares is None and (kind in UNSHARED_KINDS or adapter.name in WHOLE_ADAPTERS):  # each stage takes all of it
        fractions = {split: 1.0} if split in TRAINING_SPLITS else DEMONSTRATION_FRACTIONS
    elif shares is None:
        fractions = adapter.fractions
    elif shares.get("rm") and "rm" not in adapter.fractions:
        raise UserError(f"--split-shares: {adapter.name} trains no reward model: give rm a share of 0 (e.g. 20/0/80)")
    else:
        fractions = {name: share for name, share in shares.items() if share > 0 and name != "eval"}
    if split is None or split == "eval" or split in fractions:
        return dict(fractions)
    if shares is None:
        have = ", ".join([*fractions, "eval"])
        raise UserError(f"{adapter.name} has no '{split}' split (it has {have}): the paper trains no reward model on it")
    shown = "/".join(f"{100 * shares[name]:g}" for name in ("sft", "rm", "ppo"))
    raise UserError(f"{source}: --split-shares {shown} gives {split} no records")


def _select(parsed: list[Parsed], fractions: dict, split: str | None, seed: int) -> list[dict]:
    if split is None:
        return [p.record for p in parsed]
    parts = split_by_groups([p.record for p in parsed], [p.group for p in parsed], fractions, seed)
    return parts.get(split, [])


def _parse_rows(
    rows: Iterable[tuple[int, Any]], path: object, adapter: Adapter | None, strict: bool, report: SkipReport
) -> tuple[list[Parsed], Adapter, str]:
    """Run the adapter over every row, counting (or, under ``strict``, raising on) bad ones."""
    parsed: list[Parsed] = []
    variant: str | None = None
    for line, row in rows:
        report.rows += 1
        if not isinstance(row, dict):
            detail = f"expected a JSON object, got {type_name(row)}"
            if strict:
                raise bad_input(detail, path, line)
            report.add_skip(NOT_AN_OBJECT, path, line, None, detail)
            continue
        if variant is None:
            adapter, variant = _recognise(row, adapter, path, line)
        try:
            parsed.append(adapter.parse(row, variant))
        except RowProblem as problem:
            if strict:
                raise bad_input(f"{problem.detail} (strict mode)", path, line, problem.field) from None
            report.add_skip(problem.reason, path, line, problem.field, problem.detail)
        except Dropped as drop:
            report.add_drop(drop.reason)
    report.kept += len(parsed)
    if not parsed:
        detail = report.summary() if report.rows else "no rows"
        raise bad_input(f"no usable rows ({detail})", path)
    return parsed, adapter, variant or ""


def _recognise(row: dict, adapter: Adapter | None, path: object, line: int) -> tuple[Adapter, str]:
    """The row shape of a file, from its first object row (``adapter`` given: only its shapes)."""
    keys = ", ".join(sorted(row)) or "(none)"
    if adapter is not None:
        variant = adapter.detect(row)
        if variant is None:
            raise bad_input(
                f"does not look like {adapter.name} data ({adapter.description}); found fields {keys}."
                " Pass the file alone (--dataset PATH) to detect its format",
                path,
                line,
            )
        return adapter, variant
    found = detect_format(row)
    if found is None:
        raise bad_input(
            "cannot tell the format from the fields "
            f"{keys}: expected TRL's prompt/chosen/rejected, chosen/rejected, prompt/completion, messages, prompt or text, "
            "or a paper dataset's fields (tldr, hh, webgpt, apps)",
            path,
            line,
        )
    return found
