"""Datasets for every stage: one adapter per paper dataset, one record schema, one split.

>>> result = load_records("tldr", split="sft", seed=0)     # hub, or the embedded sample
>>> result.records[0].keys()                                # prompt, chosen, rejected
>>> print(result.notice or "", result.report.summary())

See :mod:`.loader` for sources, splits and the bad-input policy, :mod:`.records` for the
schema, and the adapters (:mod:`.tldr`, :mod:`.hh`, :mod:`.webgpt`, :mod:`.apps`,
:mod:`.trl`) for each dataset's prompt format.
"""

from .loader import LoadResult, load_records
from .records import record_kind
from .registry import ADAPTERS, DATASETS, Adapter, detect_format
from .report import SkipReport
from .splits import APPS_FRACTIONS, EVAL_FRACTION, PAPER_FRACTIONS, SPLITS, split_records

__all__ = [
    "ADAPTERS",
    "APPS_FRACTIONS",
    "Adapter",
    "DATASETS",
    "EVAL_FRACTION",
    "LoadResult",
    "PAPER_FRACTIONS",
    "SPLITS",
    "SkipReport",
    "detect_format",
    "load_records",
    "record_kind",
    "split_records",
]
