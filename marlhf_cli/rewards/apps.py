"""The compiler-signal reward for program synthesis (APPS) and the unbiased pass@k estimator.

Reward (docs/method.md "Program rewards", the paper's APPS setting, after CodeRL/PPOCoder), per response:

    -1.0                               the program does not compile (SyntaxError)
    -0.6                               a test ends in a runtime error, timeout, memory or output limit
    -0.3 + 1.3 * passed / (passed + failed)   otherwise (failed = wrong answers)

so a program passing every test earns 1.0 and one that runs cleanly but answers nothing
right earns -0.3. Each test runs in its own sandboxed process (:mod:`.sandbox`), all tests
of all responses in a batch in parallel; once a test of a program errs its reward is fixed
at -0.6, so its tests still waiting are cancelled.

pass@k (Chen et al., 2021): with n samples of which c pass every test,
``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1..n} (1 - k/i)`` so that no
binomial coefficient is ever formed (they overflow floats for n in the hundreds).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from . import sandbox as sb
from .compare import parse_tolerance, stdout_matches, value_matches

PASSED = "passed"
WRONG_ANSWER = "wrong_answer"
SKIPPED = "skipped"  # not run: an earlier error already fixed the reward
ERRORS = (sb.RUNTIME_ERROR, sb.TIMEOUT, sb.MEMORY_LIMIT, sb.OUTPUT_LIMIT)

COMPILE_REWARD = -1.0
ERROR_REWARD = -0.6
BASE_REWARD = -0.3
PASS_SPAN = 1.3

DIFFICULTIES = ("introductory", "interview", "competition")

_FENCE = re.compile(r"^[ \t]*```[^\n`]*$", re.MULTILINE)


def extract_program(response: str) -> str:
    """The program in a response: the first fenced block's body when there is a fence
    (an unclosed fence, as in a truncated response, runs to the end), else the whole text."""
    match = _FENCE.search(response)
    if match is None:
        return response
    body = response[match.end() :].lstrip("\n")
    closing = _FENCE.search(body)
    return body[: closing.start()] if closing else body


# ---------------------------------------------------------------------------------------
# tests of a record


@dataclass(frozen=True)
class TestCase:
    stdin: str
    call_args: Any
    expected: Any


def test_cases(record: Mapping[str, Any], max_tests: int | None = None) -> list[TestCase]:
    """The record's tests; stdin inputs stored as lists of lines are joined with newlines."""
    call = bool(record.get("fn_name"))
    cases = []
    for given, expected in zip(record.get("inputs") or [], record.get("outputs") or []):
        if call:
            cases.append(TestCase("", given, expected))
        else:
            text = "\n".join(map(str, given)) if isinstance(given, list) else str(given)
            cases.append(TestCase(text, None, expected))
    return cases[:max_tests] if max_tests else cases


def judge(execution: sb.Execution, case: TestCase, fn_name: str | None, tolerance: float | None) -> str:
    """One test's outcome: passed, wrong_answer, or the execution's error status."""
    if execution.status != sb.OK:
        return execution.status
    if fn_name:
        try:
            value = json.loads(execution.stdout)
        except ValueError:
            return sb.RUNTIME_ERROR  # the harness wrote no result (e.g. the program exited early)
        return PASSED if value_matches(value, case.expected, tolerance) else WRONG_ANSWER
    return PASSED if stdout_matches(execution.stdout, case.expected, tolerance) else WRONG_ANSWER


# ---------------------------------------------------------------------------------------
# one program's result and its reward


@dataclass
class ProgramResult:
    """Per-test outcomes of one program (``compile_error`` set when it never ran)."""

    outcomes: list[str] = field(default_factory=list)
    compile_error: str | None = None
    details: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.outcomes.count(PASSED)

    @property
    def failed(self) -> int:
        return self.outcomes.count(WRONG_ANSWER)

    @property
    def errors(self) -> int:
        return sum(self.outcomes.count(status) for status in ERRORS)

    @property
    def status(self) -> str:
        """compile_error, runtime_error (any test erred), passed (all tests) or wrong_answer."""
        if self.compile_error is not None:
            return sb.COMPILE_ERROR
        if self.errors:
            return sb.RUNTIME_ERROR
        return PASSED if self.outcomes and self.passed == len(self.outcomes) else WRONG_ANSWER

    @property
    def all_passed(self) -> bool:
        return self.status == PASSED

    @property
    def reward(self) -> float:
        return reward(self)


def reward(result: ProgramResult) -> float:
    """The compiler-signal reward of the module doc."""
    if result.compile_error is not None:
        return COMPILE_REWARD
    if result.errors:
        return ERROR_REWARD
    judged = result.passed + result.failed
    return BASE_REWARD + PASS_SPAN * (result.passed / judged if judged else 0.0)


class Judge:
    """Runs programs against their records' tests on a shared sandbox pool."""

    def __init__(
        self,
        sandbox: sb.Sandbox | None = None,
        *,
        limits: sb.Limits | None = None,
        max_workers: int | None = None,
        max_tests: int | None = None,
        stop_on_error: bool = True,
    ):
        self.sandbox = sandbox or sb.Sandbox(limits, max_workers)
        self._owns_sandbox = sandbox is None
        self.max_tests = max_tests
        self.stop_on_error = stop_on_error

    def check(self, programs: Sequence[str], records: Sequence[Mapping[str, Any]]) -> list[ProgramResult]:
        """One result per (program, record) pair; all tests of all programs run in parallel."""
        if len(programs) != len(records):
            raise ValueError(f"{len(programs)} programs for {len(records)} records")
        results = [ProgramResult() for _ in programs]
        jobs: dict[Any, tuple[int, int]] = {}
        by_program: dict[int, list[Any]] = {}
        cases: list[list[TestCase]] = []
        for index, (program, record) in enumerate(zip(programs, records)):
            tests = test_cases(record, self.max_tests)
            cases.append(tests)
            problem = sb.compile_error(program)
            if problem is not None:
                results[index].compile_error = problem
                continue
            results[index].outcomes = [SKIPPED] * len(tests)
            results[index].details = [""] * len(tests)
            fn_name = record.get("fn_name") or None
            for number, case in enumerate(tests):
                job = sb.Job(program, stdin=case.stdin, fn_name=fn_name, call_args=case.call_args)
                future = self.sandbox.submit(job)
                jobs[future] = (index, number)
                by_program.setdefault(index, []).append(future)
        for future in as_completed(list(jobs)):
            if future.cancelled():
                continue
            index, number = jobs[future]
            record = records[index]
            execution = future.result()
            outcome = judge(execution, cases[index][number], record.get("fn_name") or None, tolerance_of(record))
            results[index].outcomes[number] = outcome
            results[index].details[number] = execution.detail
            if outcome == sb.COMPILE_ERROR:  # the sandbox's interpreter disagreed with ours
                results[index].compile_error = execution.detail or "compile error"
            if self.stop_on_error and outcome in ERRORS + (sb.COMPILE_ERROR,):
                for sibling in by_program[index]:
                    sibling.cancel()  # only those not started yet; they stay "skipped"
        return results

    def close(self) -> None:
        if self._owns_sandbox:
            self.sandbox.close()


def tolerance_of(record: Mapping[str, Any]) -> float | None:
    return parse_tolerance(record.get("output_validator_flags"))


# ---------------------------------------------------------------------------------------
# the PPO stage's reward function


class AppsReward:
    """The compiler signal as a PPO reward function (``RewardFn`` of :mod:`marlhf_cli.scoring.rewards`).

    Needs only ``batch.responses`` and ``batch.records`` (with ``inputs``/``outputs`` and,
    for call-based problems, ``fn_name``). The last batch's per-program results stay in
    ``last_results`` for metrics.
    """

    name = "apps-tests"

    def __init__(self, *, limits: sb.Limits | None = None, max_workers: int | None = None, max_tests: int | None = None):
        self.judge = Judge(limits=limits, max_workers=max_workers, max_tests=max_tests)
        self.last_results: list[ProgramResult] = []

    def score(self, responses: Sequence[str], records: Sequence[Mapping[str, Any]]) -> list[float]:
        self.last_results = self.judge.check([extract_program(r) for r in responses], records)
        return [result.reward for result in self.last_results]

    def __call__(self, batch: Any) -> Any:
        import torch

        return torch.tensor(self.score(batch.responses, batch.records), dtype=torch.float32)

    def close(self) -> None:
        self.judge.close()


# ---------------------------------------------------------------------------------------
# pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k)/C(n, k), in product form."""
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    all_fail = 1.0
    for i in range(n - c + 1, n + 1):
        all_fail *= 1.0 - k / i
    return 1.0 - all_fail


def passk_table(
    results: Mapping[str, Sequence[bool]], difficulties: Mapping[str, str], ks: Sequence[int]
) -> list[dict[str, Any]]:
    """Rows of the paper's Table 3: mean pass@k per difficulty, then ``all``.

    ``results`` maps a problem to one bool per sample (it passed every test); difficulties
    other than APPS's three get rows of their own, after them. Values are fractions in [0, 1].
    """
    groups: dict[str, list[str]] = {name: [] for name in DIFFICULTIES}
    for problem in results:
        groups.setdefault(str(difficulties.get(problem) or "unknown"), []).append(problem)
    groups["all"] = list(results)
    rows = []
    for name, problems in groups.items():
        row: dict[str, Any] = {"difficulty": name, "problems": len(problems)}
        row["samples"] = sum(len(results[p]) for p in problems)
        for k in ks:
            values = [pass_at_k(len(results[p]), sum(map(bool, results[p])), k) for p in problems]
            row[f"pass@{k}"] = sum(values) / len(values) if values else None
        rows.append(row)
    return rows
