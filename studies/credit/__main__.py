"""The credit-assignment study's runner, every edition: pre-registered, powered, censoring-aware.

    python -m studies.credit --edition {1,2,3,4,5} [--quick] [--workers 2] [--threads 1] [--pilot]
                             [--tasks target,units,prefix] [--report-only] [--out studies/credit]

From the repository root. An edition's design is its folder's ``protocol.yaml`` (with
``PROTOCOL.md`` beside it from the second edition on), and that file is all the runner takes
it from: tasks, arms, the calibration ladder (steps in the second edition, generated tokens in
the third), tuning seeds and learning-rate grids with their extension rule, reported seeds,
threshold, statistics and the decision rule. Task by task it calibrates and tunes on the
tuning seeds, runs the reported seeds at the chosen rates, and reports: reach rates with
exact intervals, Kaplan-Meier curves and restricted mean cost to threshold on three cost axes
(steps, responses, generated tokens), the log-rank test of each decided comparison with
Holm's correction, the power of each comparison, every deviation from the protocol, and the
README's sentence as the decision rule writes it. The first edition (``first.py``) tunes by
mean score and reports bootstrap means of steps to threshold.

Resumable: every finished run is a small JSON file under ``<out>/<mode folder>/<task>/``,
skipped on a rerun, so the study can stop and go on (also on another machine: every run
records its CPU, and only steps and tokens are compared, never seconds). ``--quick`` is the
same code path with fewer seeds, steps and tokens (the protocol's quick mode, its own
folder); ``--report-only`` reads the saved runs and trains nothing (a task with runs missing
stops where they end, and the report says so).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from . import analysis as A
from . import estimate, first, plots, report
from .protocol import HERE, PROTOCOL_FILES, load
from .runs import H, Workers, run_jobs, saved
from .study import plan_task


def fail(message: str) -> None:
    """A user's error: one line, exit status 2 (as marlhf's own commands)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m studies.credit", description=__doc__.splitlines()[0])
    parser.add_argument("--edition", type=int, choices=sorted(PROTOCOL_FILES) + [5], default=3, help="which edition's committed "
                        "protocol: 1 (issue 22, steps, not pre-registered), 2 (issue 28, steps), 3 (issue 35: token "
                        "budgets, the segment value sigma), 4 (issue 43: TL;DR at 135M, studies/credit/fourth.py) or 5 "
                        "(issue 55: HH-RLHF at 135M, studies/credit/fifth.py; for now its pilot, --pilot)")  # fmt: skip
    parser.add_argument("--pilot", action="store_true", help="fifth edition: its pilot (studies/credit/fifth/pilot.yaml), "
                        "from which its protocol is written")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="the protocol's quick mode: the same code path in minutes")
    parser.add_argument("--tasks", default=None, help="comma-separated subset of the protocol's tasks (default: all; "
                        "leaving one out is a deviation the report prints)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="runs side by side, one process each")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--configs", default=None, help="first edition only: comma-separated configurations (default: all)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder of the mode folders (saved runs, figures)")
    parser.add_argument("--protocol", type=Path, default=None, help="a protocol file (default: the edition's committed one)")
    parser.add_argument("--report-only", action="store_true", help="report from the saved runs; train nothing")
    parser.add_argument("--estimate", action="store_true", help="time one tuning run per arm and task (runs the study "
                        "keeps) and project the whole study's hours; nothing else")  # fmt: skip
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse(argv)
    if args.edition == 1:
        if args.estimate or args.protocol:
            fail("--estimate and --protocol are the second and third editions'")
        return first.main(args)
    if args.configs is not None:
        fail("--configs is the first edition's; the second and third pick arms by their protocol")
    if args.edition == 5:
        if not args.pilot:
            fail("the fifth edition's protocol is written from its pilot's figures: run it with --pilot first")
        from . import fifth

        return fifth.run(args)
    if args.pilot:
        fail("--pilot is the fifth edition's")
    if args.edition == 4:
        if args.estimate or args.tasks:
            fail("--estimate and --tasks are the second and third editions'; the fourth's cost is in its PROTOCOL.md")
        from . import fourth

        return fourth.run(args)
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
    workers = Workers(args.workers, args.threads, root)  # one set of worker processes for every phase

    if args.estimate:
        if protocol.edition >= 3:
            fail("--estimate times the second edition's steps; the third edition's cost is in its PROTOCOL.md")
        with workers:
            records = run_jobs(estimate.timing_jobs(protocol), root, workers, args.threads, "timing")
        for line in estimate.project(protocol, records, args.workers):
            print(line)
        return
    if args.report_only:
        def runner(jobs, label):
            return saved(root, jobs)
    else:
        def runner(jobs, label):
            return run_jobs(jobs, root, workers, args.threads, label)

    plans, finished, comparisons, same_rate = [], {}, [], []
    with workers:
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
            if protocol.edition >= 3:
                same_rate += A.same_rate(protocol, plan)

    A.decide(protocol, comparisons)
    if comparisons:
        report.print_comparisons(protocol, comparisons)
    report.print_same_rate(same_rate)
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
