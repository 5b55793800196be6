"""Load a paper dataset from the Hugging Face Hub through ``datasets.load_dataset``.

Only "the hub cannot be reached" is turned into :class:`HubUnreachable` (the caller then
falls back to the embedded sample): a connection or DNS error, a timeout, or offline mode
(``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``) without a cached copy. Offline mode still
goes through ``load_dataset`` so that a dataset already in the local cache is used (except
for a repository read as raw files, APPS, whose ``hf://`` paths ignore offline mode: offline
means the sample there). Any other failure (a renamed repository, a schema change)
propagates: hiding it behind a sample would make a real run silently train on 50 toy rows.

Before the first network request a quick reachability probe (DNS and a TCP connect, three
seconds) spares the user huggingface_hub's retry loop (about 25 s) on a machine with no
network; it is skipped when a proxy is configured, since the proxy may reach what we cannot.
:mod:`marlhf_cli.models` uses the same probe before loading a model or tokenizer by hub id.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 3.0
OFFLINE_REASON = "offline mode"
_UNREACHABLE_NAMES = {
    "ConnectionError",
    "OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "TimeoutException",
    "Timeout",
    "MaxRetryError",
    "NameResolutionError",
    "gaierror",
}


class HubUnreachable(Exception):
    """The hub could not be reached and the dataset is not in the local cache."""


@dataclass(frozen=True)
class HubSpec:
    """Where a paper dataset lives on the hub and which of its splits play which part.

    ``train_split`` is divided into SFT/RM/PPO; ``eval_split`` (when the hub has one) is the
    held-out evaluation set. ``data_files`` loads raw files through the generic ``json``
    builder, for repositories that only ship a loading script (no longer supported by
    ``datasets`` >= 4).
    """

    repo: str
    config: str | None = None
    train_split: str = "train"
    eval_split: str | None = None
    data_files: dict[str, str] = field(default_factory=dict)

    def source(self, split: str) -> str:
        return f"hub:{self.repo}[{split}]"


def load_hub_rows(spec: HubSpec, split: str) -> Iterator[dict[str, Any]]:
    """The rows of one hub split, or :class:`HubUnreachable`. Whether the hub can be had is
    settled before ``datasets`` is imported (with pandas and pyarrow, most of a second), so a
    run that falls back to the embedded sample does not pay for it."""
    offline = offline_mode()
    if offline and spec.data_files:
        # hf:// file paths go through HfFileSystem, which ignores offline mode: do not touch the network
        raise HubUnreachable(OFFLINE_REASON)
    if offline and not _cached_anywhere(spec.repo):
        raise HubUnreachable(f"{OFFLINE_REASON}, not in the local cache")
    if not offline:
        problem = probe_endpoint()
        if problem:
            raise HubUnreachable(problem)
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - a dependency of the package
        raise HubUnreachable(f"the 'datasets' package is not installed ({err})") from err
    try:
        with _datasets_offline(datasets, offline):
            dataset = _load(datasets, spec, split)
    except Exception as err:  # noqa: BLE001 - classified below, re-raised unless unreachable
        if is_unreachable(err):
            raise HubUnreachable(f"{OFFLINE_REASON}, not in the local cache" if offline else first_line(err)) from err
        raise
    return iter(dataset)


def _cached_anywhere(repo: str) -> bool:
    """Whether an offline ``load_dataset(repo)`` could find anything: a prepared copy where
    ``datasets`` keeps them (``HF_DATASETS_CACHE``, else ``HF_HOME/datasets``; a folder
    ``owner___name``, the name snake-cased: any folder of the owner counts, so as never to miss
    one) or the hub's download cache (``HF_HUB_CACHE``: ``datasets--owner--name``). Neither:
    nothing is cached, and ``datasets`` need not be imported to find that out."""
    from huggingface_hub import constants

    prepared = Path(os.path.expanduser(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets"))
    owner = repo.split("/")[0] if "/" in repo else ""
    if any(prepared.glob(f"{owner}___*")) if owner else (prepared / repo).exists():
        return True
    return (Path(constants.HF_HUB_CACHE) / f"datasets--{repo.replace('/', '--')}").exists()


def _load(datasets: Any, spec: HubSpec, split: str) -> Any:
    if spec.data_files:
        files = {name: f"hf://datasets/{spec.repo}/{path}" for name, path in spec.data_files.items()}
        return datasets.load_dataset("json", data_files={split: files[split]}, split=split)
    try:
        return datasets.load_dataset(spec.repo, spec.config, split=split)
    except RuntimeError as err:
        if "scripts are no longer supported" not in str(err):
            raise
        # the hub's automatic Parquet export of a script-based repository
        return datasets.load_dataset(spec.repo, spec.config, split=split, revision="refs/convert/parquet")


def is_unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or anything in its cause chain) says the hub cannot be reached."""
    seen = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, TimeoutError, socket.gaierror)):
            return True
        if type(current).__name__ in _UNREACHABLE_NAMES:
            return True
        current = current.__cause__ or current.__context__
    return False


def probe_endpoint(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """``None`` when the hub's host accepts a TCP connection, else why not (one line)."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:
        return f"cannot connect to {host}:{port} ({err.strerror or type(err).__name__})"


def offline_mode() -> bool:
    truthy = {"1", "ON", "YES", "TRUE"}
    return any(os.environ.get(name, "").upper() in truthy for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


@contextmanager
def _datasets_offline(datasets: Any, offline: bool) -> Iterator[None]:
    """Make ``datasets`` honour an offline flag set after it was imported (it reads it once)."""
    config = datasets.config
    saved = (config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE)
    if offline:
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE = saved


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
