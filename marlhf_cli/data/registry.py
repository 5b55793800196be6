"""The dataset adapters by name, and the format detection that picks one for a local file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

from . import apps, hh, tldr, trl, webgpt
from .hub import HubSpec
from .records import Parsed
from .splits import APPS_FRACTIONS, PAPER_FRACTIONS

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"


@dataclass(frozen=True)
class Adapter:
    """One source format: how to recognise its rows, parse them, and split the result.

    ``hub`` and ``sample`` are set for the paper's datasets (the hub repository and the
    embedded fallback sample shipped in ``marlhf_cli/data/samples``).
    """

    name: str
    description: str
    detect: Callable[[dict], str | None]
    parse: Callable[[dict, str], Parsed]
    fractions: dict
    hub: HubSpec | None = None
    sample: str | None = None

    @property
    def sample_path(self) -> Path | None:
        return SAMPLES_DIR / self.sample if self.sample else None


def _adapter(module: ModuleType, fractions: dict) -> Adapter:
    return Adapter(
        name=module.NAME,
        description=module.DESCRIPTION,
        detect=module.detect,
        parse=module.parse,
        fractions=fractions,
        hub=module.HUB,
        sample=module.SAMPLE,
    )


# The paper's datasets: loadable by name from the hub, with an embedded fallback sample.
DATASETS: dict[str, Adapter] = {
    "tldr": _adapter(tldr, PAPER_FRACTIONS),
    "hh": _adapter(hh, PAPER_FRACTIONS),
    "webgpt": _adapter(webgpt, PAPER_FRACTIONS),
    "apps": _adapter(apps, APPS_FRACTIONS),
}
TRL = _adapter(trl, PAPER_FRACTIONS)
ADAPTERS: dict[str, Adapter] = {**DATASETS, "trl": TRL}

# Most specific first: TL;DR's flat rows and raw HH transcripts also have chosen/rejected,
# which alone would read as TRL's implicit-prompt format.
DETECTION_ORDER = ("tldr", "webgpt", "apps", "hh", "trl")


def detect_format(row: dict) -> tuple[Adapter, str] | None:
    """The adapter and row shape that fit ``row`` (a file's first row), or ``None``."""
    for name in DETECTION_ORDER:
        variant = ADAPTERS[name].detect(row)
        if variant:
            return ADAPTERS[name], variant
    return None
