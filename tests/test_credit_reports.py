"""The credit study's committed reports are what its committed runs give: the first edition's
report, printed again by the runner from its saved runs, holds every line of its committed raw
output; the second edition's decided tests (Kaplan-Meier and log-rank from scipy, Holm), on
its saved runs, give the z, p, restricted-mean ratios and adjusted p its committed report
printed; the third edition's 12 decided tests, Holm over all of them, and its rule's verdict
on --value-function's default do too. (A whole report, with 2,000 power simulations per
comparison, takes a minute or more: the docs say how to print it.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "credit"
LOGS = ROOT / "docs" / "results" / "logs"
VOLATILE = ("# machine:", "# plot:", "# figure:", "# wall time")  # the machine's load, the paths, the seconds


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith(VOLATILE)]


def test_the_first_editions_report_is_its_committed_output(tmp_path):
    shutil.copytree(STUDY / "first", tmp_path / "first")  # --report-only redraws the figure: not in the checkout
    done = subprocess.run([sys.executable, "-m", "studies.credit", "--edition", "1", "--report-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    printed = _lines(done.stdout)
    # the committed raw outputs are the report's tables (-2) and its closing lines (-3)
    for name in ("credit-study-reports-2.txt", "credit-study-reports-3.txt"):
        committed = _lines((LOGS / name).read_text())
        assert committed and all(line in printed for line in committed), name
    assert (tmp_path / "first" / "credit_study.png").stat().st_size > 10_000


def test_the_second_editions_decided_tests_reproduce_its_committed_report():
    from studies.credit import analysis as A
    from studies.credit import survival as S
    from studies.credit.protocol import AXES, PROTOCOL_FILES, load
    from studies.credit.runs import saved
    from studies.credit.study import plan_task

    protocol = load("full", PROTOCOL_FILES[2])
    report = (LOGS / "credit-study-reports-1.txt").read_text()
    if f"protocol {protocol.digest()}" not in report:
        pytest.skip("the committed report is of another protocol")
    tests = []  # (comparison, task, a, b, p on the decision axis)
    for task in protocol.tasks:
        plan = plan_task(protocol, task, lambda jobs, label: saved(STUDY / "second", jobs))
        assert plan.reported_complete, task
        horizon = A.horizons(protocol, plan.reported, plan.rung.steps)
        for c in protocol.comparisons:
            a, b = (plan.side_arm(protocol, side) for side in (c.a, c.b))
            runs = {arm: [r for r in plan.reported if r["arm"] == arm] for arm in (a, b)}
            for axis in AXES:
                out_a, out_b = (S.outcomes(runs[arm], axis, protocol.threshold, protocol.window) for arm in (a, b))
                z, p = S.logrank(out_a, out_b)
                ratio = S.restricted_mean(out_b, horizon[axis]) / S.restricted_mean(out_a, horizon[axis])
                line = f"    {axis:<10} log-rank z {z:+.2f}, p {p:.3g}; restricted-mean ratio {ratio:.2f}x ["
                assert line in report, (task, c.name, axis)
                if axis == protocol.axis:
                    tests.append((c.name, task, a, b, p, out_a.reached, out_b.reached))
    for name in {t[0] for t in tests}:  # the second edition's Holm: over the tasks of one comparison
        group = [t for t in tests if t[0] == name]
        for (_, task, a, b, _, reached_a, reached_b), adjusted in zip(group, S.holm([t[4] for t in group])):
            header = re.escape(f"{task}: {name}: {a} ({reached_a}/20) vs {b} ({reached_b}/20): ")
            assert re.search(header + rf"[^\n]*, adjusted p {re.escape(f'{adjusted:.3g}')}\n", report), (task, name)
    assert len(tests) == len(protocol.tasks) * len(protocol.comparisons)


def test_the_third_editions_decision_reproduces_its_committed_report(capsys):
    """The third edition's 12 decided tests (log-rank and restricted-mean ratio per axis, Holm
    over all 12, the verdicts) and the rule's verdict on --value-function's default, from its
    saved runs, are what its committed report printed; the default in the code follows it.
    The runner's own comparison and printing code, with few bootstrap resamples and power
    simulations: only the intervals and the power, which this test leaves out, depend on them."""
    from dataclasses import replace

    from marlhf_cli.config import PPOConfig
    from studies.credit import analysis as A
    from studies.credit import report as R
    from studies.credit.protocol import PROTOCOL_FILES, load
    from studies.credit.runs import saved
    from studies.credit.study import plan_task

    protocol = load("full", PROTOCOL_FILES[3])
    committed = (LOGS / "credit-study-reports-4.txt").read_text()
    if f"protocol {protocol.digest()}" not in committed:
        pytest.skip("the committed report is of another protocol")
    protocol = replace(protocol, bootstrap_resamples=20, power_simulations=10)
    comparisons = []
    for task in protocol.tasks:
        plan = plan_task(protocol, task, lambda jobs, label: saved(STUDY / "third", jobs))
        assert plan.reported_complete, task
        arms, horizon = A.task_results(protocol, plan)
        comparisons += A.compare(protocol, plan, arms, horizon)
    assert len(comparisons) == protocol.tests() == 12
    A.decide(protocol, comparisons)  # Holm over all 12
    R.print_comparisons(protocol, comparisons)
    printed = [line.split(" [")[0] if "log-rank z" in line else line
               for line in capsys.readouterr().out.splitlines() if line and "power at alpha" not in line]  # fmt: skip
    assert len(printed) == 1 + 12 * 4  # the heading, then per test its verdict and three axes
    assert all(line in committed for line in printed), [line for line in printed if line not in committed]
    (verdict,) = A.default_value_function(protocol, comparisons, partial=False)
    assert verdict in committed
    assert PPOConfig().value_function == ("first" if "becomes `first`" in verdict else "equal")
