"""Two sample files -> the pairs to judge: matched by prompt, sampled, and put in order.

Rows need ``prompt`` and ``response`` (``completion`` is accepted too, TRL's name); what
``marlhf ppo`` writes to ``samples/<name>.jsonl`` qualifies. A row without them is skipped
and counted with its file and line (``--debug`` is not needed to find it), or with
``--strict`` stops the command there; repeated prompts within one file (the first is kept)
and prompts that only one file has are counted too. When no pair is left, the error says
why: a file with no usable row names its first bad row (file, line and field).

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
from ..errors import UserError, bad_input
from ..wording import count as counted


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
    # prompt -> its turns, from rows that carry them (``marlhf ppo`` writes them for
    # conversational data), for ``judge --rm`` under a chat template
    conversations: dict[str, dict] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per thing left out, for the terminal and the result file."""
        out = []
        for path, report in self.reports.items():
            if report.total_skipped:
                out.append(f"{path}: {report.summary()}")
        for path, count in self.duplicates.items():
            if count:
                out.append(f"{path}: {counted(count, 'repeated prompt')}, the first response kept")
        for path, count in self.only_in.items():
            if count:
                out.append(f"{path}: {counted(count, 'prompt')} not in the other file, not judged")
        return out


def prompt_key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def _problem(row: object) -> tuple[str, str | None, str] | None:
    """Why a row cannot be judged (reason, field, detail), or None."""
    if not isinstance(row, dict):
        return "not an object", None, "expected a JSON object"
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return "missing prompt", "prompt", "missing, empty or not text"
    if not isinstance(row.get("response", row.get("completion")), str):
        return "missing response", "response", "missing or not text (nor 'completion')"
    return None


def read_samples(path: str | Path, strict: bool = False) -> tuple[dict[str, str], SkipReport, int, dict[str, dict]]:
    """prompt -> response (first occurrence), the skip report, the repeated-prompt count, and
    prompt -> ``conversation`` of the rows that have one.

    ``strict``: the first bad row is a one-line error naming its file, line and field.
    """
    report = SkipReport()
    responses: dict[str, str] = {}
    conversations: dict[str, dict] = {}
    repeated = 0
    for line, row in read_rows(path):
        report.rows += 1
        problem = _problem(row)
        if problem is not None:
            reason, field_name, detail = problem
            if strict:
                raise bad_input(f"{detail} (strict mode)", path, line, field_name)
            report.add_skip(reason, path, line, field_name, detail)
            continue
        prompt = row["prompt"]
        response = row.get("response", row.get("completion"))
        if prompt in responses:
            repeated += 1
            continue
        report.kept += 1
        responses[prompt] = response
        if isinstance(row.get("conversation"), dict) and isinstance(row["conversation"].get("prompt"), list):
            conversations[prompt] = row["conversation"]
    return responses, report, repeated, conversations


def match(path_a: str | Path, path_b: str | Path, strict: bool = False) -> Matched:
    """Pairs of responses to the same prompt, in file A's order."""
    a, report_a, dup_a, turns_a = read_samples(path_a, strict)
    b, report_b, dup_b, turns_b = read_samples(path_b, strict)
    for path, report in ((path_a, report_a), (path_b, report_b)):
        if report.rows == 0:
            raise UserError(f"{path}: no rows: nothing to judge")
        if report.kept == 0:
            # "share no prompt" would hide the cause: every row lacks a field
            raise UserError(f"{path}: no usable row ({report.summary()}): nothing to judge")
    pairs = [Pair(prompt_key(p), p, r, b[p]) for p, r in a.items() if p in b]
    if not pairs:
        raise UserError(f"{path_a} and {path_b} share no prompt: nothing to judge")
    return Matched(
        pairs,
        reports={str(path_a): report_a, str(path_b): report_b},
        only_in={str(path_a): sum(p not in b for p in a), str(path_b): sum(p not in a for p in b)},
        duplicates={str(path_a): dup_a, str(path_b): dup_b},
        conversations={p.prompt: turns_a.get(p.prompt) or turns_b[p.prompt] for p in pairs if p.prompt in turns_a or p.prompt in turns_b},
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
