"""The credit-assignment study, second edition: pre-registered, powered, censoring-aware, priced in tokens.

    python benchmarks/credit_study2.py [--quick] [--workers 2] [--threads 1] [--tasks target,units,prefix]
                                       [--report-only] [--out benchmarks/credit_study]

The design is benchmarks/credit_study/PROTOCOL.md, and its machine-readable half
benchmarks/credit_study/protocol.yaml is all this script takes it from: tasks, arms, the
steps ladder of the calibration, tuning seeds and learning-rate grids with their extension
rule, reported seeds, threshold, statistics and the decision rule. Task by task it calibrates
and tunes on the tuning seeds, runs the reported seeds at the chosen rates (20 seeds for each
family's best arm, 5 for the others), and reports: reach rates with exact intervals,
Kaplan-Meier curves and restricted mean cost to threshold on three cost axes (steps,
responses, generated tokens), the log-rank test of each decided comparison with Holm's
correction over tasks, the power of each comparison, every deviation from the protocol, and
the README's sentence as the decision rule writes it.

Resumable: every finished run is a small JSON file under ``<out>/<mode folder>/<task>/``,
skipped on a rerun, so the study can stop and go on (also on another machine: every run
records its CPU, and only steps and tokens are compared, never seconds). ``--quick`` is the
same code path with fewer seeds, steps and tokens (the protocol's quick mode, its own
folder); ``--report-only`` reads the saved runs and trains nothing (a task with runs missing
stops where they end, and the report says so). The first edition stays
``benchmarks/credit_study.py`` with its runs in ``benchmarks/credit_study/full/``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness as H  # noqa: E402
import yaml  # noqa: E402
from credit2 import analysis as A  # noqa: E402
from credit2 import estimate, plots, report  # noqa: E402
from credit2.protocol import PROTOCOL_FILES, load  # noqa: E402
from credit2.runs import run_jobs, saved  # noqa: E402
from credit2.study import plan_task  # noqa: E402


def fail(message: str) -> None:
    """A user's error: one line, exit status 2 (as marlhf's own commands)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the protocol's quick mode: the same code path in ~15 minutes")
    parser.add_argument("--tasks", default=None, help="comma-separated subset of the protocol's tasks (default: all; "
                        "leaving one out is a deviation the report prints)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="runs side by side, one process each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--out", type=Path, default=H.BENCH_DIR / "credit_study", help="folder of the mode folders (saved runs, figures)")
    parser.add_argument("--edition", type=int, choices=sorted(PROTOCOL_FILES), default=2, help="which edition's committed "
                        "protocol: 2 (issue 28, steps) or 3 (issue 35: token budgets, the segment value sigma)")  # fmt: skip
    parser.add_argument("--protocol", type=Path, default=None, help="a protocol file (default: the edition's committed one)")
    parser.add_argument("--report-only", action="store_true", help="report from the saved runs; train nothing")
    parser.add_argument("--estimate", action="store_true", help="time one tuning run per arm and task (runs the study "
                        "keeps) and project the whole study's hours; nothing else")  # fmt: skip
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    args.protocol = args.protocol or PROTOCOL_FILES[args.edition]
    try:
        protocol = load("quick" if args.quick else "full", args.protocol)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as error:
        fail(f"cannot read the protocol {args.protocol}: {error}")
    tasks = list(protocol.tasks) if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(protocol.tasks))
    if unknown:
        fail(f"unknown task(s) {', '.join(unknown)}: the protocol has {', '.join(protocol.tasks)}")
    if args.workers < 1 or args.threads < 1:
        fail("--workers and --threads must be at least 1")
    root = args.out / protocol.folder
    print(H.machine_line())
    print(f"# {protocol.summary()}; {args.workers} worker(s) x {args.threads} thread(s); runs under {root}", flush=True)
    started = time.perf_counter()

    if args.estimate:
        if protocol.edition >= 3:
            fail("--estimate times the second edition's steps; the third edition's cost is in its PROTOCOL.md")
        records = run_jobs(estimate.timing_jobs(protocol), root, args.workers, args.threads, "timing")
        for line in estimate.project(protocol, records, args.workers):
            print(line)
        return
    if args.report_only:
        def runner(jobs, label):
            return saved(root, jobs)
    else:
        def runner(jobs, label):
            return run_jobs(jobs, root, args.workers, args.threads, label)

    plans, finished, comparisons = [], {}, []
    for task in tasks:  # task by task: a study stopped part-way has whole tasks to show
        plan = plan_task(protocol, task, runner)
        plans.append(plan)
        report.print_calibration(protocol, plan)
        if not plan.complete:
            print(f"# {task}: tuning runs missing: no result yet (run without --report-only to go on)")
            continue
        report.print_tuning(protocol, plan)
        if not plan.reported:
            continue
        arms, horizon = A.task_results(protocol, plan)
        report.print_arms(protocol, plan, arms, horizon)
        finished[task] = (arms, plan.decided_arms, horizon)
        comparisons += A.compare(protocol, plan, arms, horizon)

    A.decide(protocol, comparisons)
    if comparisons:
        report.print_comparisons(protocol, comparisons)
    if finished:
        for name, draw in (("kaplan_meier.png", plots.kaplan_meier_figure), ("restricted_means.png", plots.restricted_mean_figure)):
            draw(protocol, finished, root / name)
            print(f"# figure: {root / name}")
    print(f"\n# machines: {report.machines(protocol, plans)}")
    print(f"# wall time {time.perf_counter() - started:.0f} s; load average at the end {H.load_average()}")
    found = report.deviations(protocol, plans)
    print(f"\n## deviations from protocol {protocol.digest()}: {len(found) or 'none'}")
    for line in found:
        print(f"- {line}")
    partial = any(not p.reported_complete for p in plans) or len(plans) < len(protocol.tasks)
    print("\n## the README's statement (the protocol's decision rule)" + (" - PARTIAL" if partial else ""))
    for line in A.sentences(protocol, comparisons, partial):
        print(line)
    rule = A.default_value_function(protocol, comparisons, partial)
    if rule:
        print("\n## the segment value's default (the protocol's rule)")
        for line in rule:
            print(line)


if __name__ == "__main__":
    main()
