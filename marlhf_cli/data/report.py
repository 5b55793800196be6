"""What a load kept, skipped and dropped, so that no row ever disappears silently."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..errors import where
from ..wording import count

EXAMPLES_PER_REASON = 3


@dataclass
class SkipReport:
    """Counts of rows read, kept, skipped (bad content) and dropped (by the recipe).

    ``skipped`` counts rows whose content was unusable (missing or wrongly typed field, empty
    text, identical responses...), ``dropped`` rows the paper's recipe leaves out on purpose
    (WebGPT ties, CNN/DM articles in the TL;DR comparisons, APPS problems without tests).
    ``examples`` keeps the first few locations per skip reason, e.g.
    ``data.jsonl:12: field 'chosen': empty text``.
    """

    rows: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def add_skip(self, reason: str, path: object, line: int | None, field_name: str | None, detail: str) -> None:
        self.skipped[reason] += 1
        seen = self.examples.setdefault(reason, [])
        if len(seen) < EXAMPLES_PER_REASON:
            loc = where(path, line, field_name)
            seen.append(f"{loc}: {detail}" if loc else detail)

    def add_drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def first_example(self) -> str | None:
        for reason, _ in self.skipped.most_common():
            if self.examples.get(reason):
                return self.examples[reason][0]
        return None

    def summary(self) -> str:
        """One line for the CLI, e.g. 'kept 40 of 44 rows; skipped 3 (2 empty text, ...)'."""
        parts = [f"kept {self.kept} of {count(self.rows, 'row')}"]
        if self.skipped:
            reasons = ", ".join(f"{n} {r}" for r, n in self.skipped.most_common())
            parts.append(f"skipped {self.total_skipped} bad ({reasons}; first: {self.first_example()})")
        if self.dropped:
            reasons = ", ".join(f"{n} {r}" for r, n in self.dropped.most_common())
            parts.append(f"dropped {self.total_dropped} by design ({reasons})")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        """A JSON-ready form for run.json / metrics files."""
        return {
            "rows": self.rows,
            "kept": self.kept,
            "skipped": dict(self.skipped),
            "dropped": dict(self.dropped),
            "examples": {k: list(v) for k, v in self.examples.items()},
        }
