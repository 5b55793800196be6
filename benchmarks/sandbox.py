"""Sandbox throughput: programs executed per second (reference solutions x their tests).

    python benchmarks/sandbox.py [--rounds 5] [--workers 2]

Jobs are the APPS reference solutions of ../shared/data/apps (stdin and call-based) and
five hand-written Code Jam solutions, each run once per test, through the same path the
reward takes (:class:`marlhf_cli.rewards.apps.Judge`: compile check, sandboxed process,
comparison). Every isolation mode this machine allows is measured, and so is a baseline in
the same run: the same programs under plain ``python -I -S`` with no isolation, limits or
harness, on the same number of workers. The last line is the headline: programs per second
of the default mode on ``--workers`` workers, and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from marlhf_cli.data import load_records  # noqa: E402
from marlhf_cli.rewards import apps  # noqa: E402
from marlhf_cli.rewards import sandbox as sb  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def jobs() -> tuple[list[str], list[dict]]:
    """(programs, records): one entry per reference solution; each is run on all its tests."""
    programs, records = [], []
    apps_file = SHARED / "apps" / "apps-sample.jsonl"
    source = str(apps_file) if apps_file.is_file() else None
    for record in load_records("apps", data_file=source).records:
        for solution in record.get("solutions", []):
            programs.append(solution)
            records.append(record)
    code_jam = SHARED / "codejam" / "problems.jsonl"
    try:  # the hand-written Code Jam solutions live with their test
        from test_apps_reward import CODE_JAM_SOLUTIONS
    except ImportError:
        CODE_JAM_SOLUTIONS = {}
    if code_jam.is_file():

        by_id = {r["problem_id"]: r for r in load_records("apps", data_file=str(code_jam)).records}
        for pid, program in CODE_JAM_SOLUTIONS.items():
            programs.append(program)
            records.append(by_id[pid])
    return programs, records


def measure_sandbox(programs, records, mode: str | None, workers: int, rounds: int) -> tuple[int, float, int]:
    """(test runs, seconds, runs that did not pass) over ``rounds`` repetitions."""
    judge = apps.Judge(sb.Sandbox(sb.Limits(time=10.0), max_workers=workers, mode=mode), stop_on_error=False)
    judge.check(programs[:2], records[:2])  # warm-up: the isolation probe, page cache
    runs = failed = 0
    began = time.perf_counter()
    for _ in range(rounds):
        for result in judge.check(programs, records):
            runs += len(result.outcomes)
            failed += len(result.outcomes) - result.passed
    seconds = time.perf_counter() - began
    judge.sandbox.close()
    return runs, seconds, failed


def measure_baseline(programs, records, workers: int, rounds: int) -> tuple[int, float]:
    """The same stdin programs under bare ``python -I -S`` (call-based ones via a tiny caller)."""
    python = sb.isolation().python
    work = []
    for program, record in zip(programs, records):
        for case in apps.test_cases(record):
            if record.get("fn_name"):
                caller = f"{program}\nimport json\nfrom typing import *\nprint(json.dumps({record['fn_name']}(*{case.call_args!r}) if 'Solution' not in dir() else getattr(Solution(), {record['fn_name']!r})(*{case.call_args!r})))"
                work.append((caller, ""))
            else:
                work.append((program, case.stdin))

    def one(item):
        source, stdin = item
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "solution.py")
            Path(path).write_text("from typing import *\n" + source)
            subprocess.run([python, "-I", "-S", path], input=stdin.encode(), capture_output=True, timeout=30, cwd=tmp)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, work[:2]))
        began = time.perf_counter()
        for _ in range(rounds):
            list(pool.map(one, work))
        seconds = time.perf_counter() - began
    return len(work) * rounds, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="repetitions of the whole job list")
    parser.add_argument("--workers", type=int, default=2, help="parallel programs (the headline's)")
    args = parser.parse_args()

    programs, records = jobs()
    default = sb.isolation()
    modes = [m for m in sb.MODES if _works(m)]
    print(f"{len(programs)} reference programs, {sum(len(apps.test_cases(r)) for r in records)} test runs per round, "
          f"{args.rounds} rounds; {os.cpu_count()} CPUs; sandbox python {default.python}")  # fmt: skip
    print(f"{'setting':<34}{'workers':>8}{'runs':>7}{'seconds':>9}{'programs/s':>12}")
    base_runs, base_seconds = measure_baseline(programs, records, args.workers, args.rounds)
    baseline = base_runs / base_seconds
    print(f"{'bare python -I -S (baseline)':<34}{args.workers:>8}{base_runs:>7}{base_seconds:>9.2f}{baseline:>12.1f}")
    headline = None
    for mode in modes:
        for workers in sorted({1, args.workers}):
            runs, seconds, failed = measure_sandbox(programs, records, mode, workers, args.rounds)
            rate = runs / seconds
            note = f"  ({failed} runs did not pass)" if failed else ""
            print(f"{'sandbox: ' + mode:<34}{workers:>8}{runs:>7}{seconds:>9.2f}{rate:>12.1f}{note}")
            if mode == default.mode and workers == args.workers:
                headline = rate
    print(f"headline: {headline:.1f} programs/s in the sandbox ({default.mode}) on {args.workers} workers, "
          f"{headline / baseline:.2f}x the rate of unsandboxed python")  # fmt: skip


def _works(mode: str) -> bool:
    try:
        sb.isolation(mode)
        return True
    except sb.SandboxUnavailable:
        return False


if __name__ == "__main__":
    main()
