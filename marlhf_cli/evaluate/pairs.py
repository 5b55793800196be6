"""Two sample files -> the pairs to judge: matched by prompt, sampled, and put in order.

Rows need ``prompt`` and ``response`` (``completion`` is accepted too, TRL's name); what
``marlhf ppo`` writes to ``samples/<name>.jsonl`` qualifies. A row without them is skipped
and counted with its file and line (``--debug`` is not needed to find it), and so are
repeated prompts within one file (the first is kept) and prompts that only one file has.

Randomness is a pure function of (seed, prompt): which pairs ``--sample K`` picks does not
depend on file order, and which side is shown first does not depend on which other pairs
are judged, so a rerun with another ``--sample`` reuses the cached verdicts of the pairs it
shares with the first run.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..data.local import read_rows
from ..data.report import SkipReport
from ..errors import UserError


@dataclass(frozen=True)
class Pair:
    key: str  # a short hash of the prompt: the pair's id in results and the agreement table
    prompt: str
    response_a: str
    response_b: str


@dataclass
class Matched:
    pairs: list[Pair]
    reports: dict[str, SkipReport] = field(default_factory=dict)
    only_in: dict[str, int] = field(default_factory=dict)  # file -> prompts the other lacks
    duplicates: dict[str, int] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per thing left out, for the terminal and the result file."""
        out = []
        for path, report in self.reports.items():
            if report.total_skipped:
                out.append(f"{path}: {report.summary()}")
        for path, count in self.duplicates.items():
            if count:
                out.append(f"{path}: {count} repeated prompt(s), the first response kept")
        for path, count in self.only_in.items():
            if count:
                out.append(f"{path}: {count} prompt(s) not in the other file, not judged")
        return out


def prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def read_samples(path: str | Path) -> tuple[dict[str, str], SkipReport, int]:
    """prompt -> response (first occurrence), the skip report, and the repeated-prompt count."""
    report = SkipReport()
    responses: dict[str, str] = {}
    repeated = 0
    for line, row in read_rows(path):
        report.rows += 1
        if not isinstance(row, dict):
            report.add_skip("not an object", path, line, None, "expected a JSON object")
            continue
        prompt = row.get("prompt")
        response = row.get("response", row.get("completion"))
        if not isinstance(prompt, str) or not prompt.strip():
            report.add_skip("missing prompt", path, line, "prompt", "missing, empty or not text")
            continue
        if not isinstance(response, str):
            report.add_skip("missing response", path, line, "response", "missing or not text")
            continue
        if prompt in responses:
            repeated += 1
            continue
        report.kept += 1
        responses[prompt] = response
    return responses, report, repeated


def match(path_a: str | Path, path_b: str | Path) -> Matched:
    """Pairs of responses to the same prompt, in file A's order."""
    a, report_a, dup_a = read_samples(path_a)
    b, report_b, dup_b = read_samples(path_b)
    pairs = [Pair(prompt_key(p), p, r, b[p]) for p, r in a.items() if p in b]
    if not pairs:
        raise UserError(f"{path_a} and {path_b} share no prompt: nothing to judge")
    return Matched(
        pairs,
        reports={str(path_a): report_a, str(path_b): report_b},
        only_in={str(path_a): sum(p not in b for p in a), str(path_b): sum(p not in a for p in b)},
        duplicates={str(path_a): dup_a, str(path_b): dup_b},
    )


def sample(pairs: list[Pair], k: int | None, seed: int) -> list[Pair]:
    """K pairs drawn without replacement (all when K is None or too large), in input order."""
    if k is None or k >= len(pairs):
        return list(pairs)
    if k < 1:
        raise UserError(f"--sample must be 1 or more, got {k}")
    by_key = sorted(pairs, key=lambda p: p.key)
    chosen = {p.key for p in random.Random(f"sample:{seed}").sample(by_key, k)}
    return [p for p in pairs if p.key in chosen]


def a_first(pair: Pair, seed: int) -> bool:
    """Whether file A's response is shown first (randomised per pair, reproducible by seed)."""
    digest = hashlib.sha256(f"order:{seed}:{pair.key}".encode()).digest()
    return digest[0] % 2 == 0
