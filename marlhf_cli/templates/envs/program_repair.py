"""Fix it from feedback: program synthesis over several turns, for ``marlhf ppo --env``.

    marlhf ppo --dataset apps --env py:templates/envs/program_repair.py:ProgramRepair \\
        --max-turns 3 --termination turn ...

The record is an APPS problem (``marlhf``'s ``apps`` records: its prompt, tests and, for
call-based problems, ``fn_name``). The first user message is the problem. Each assistant turn
is a program (the first fenced block of the reply, else the whole reply), run in marlhf's
sandbox (its limits and isolation, as the ``apps`` reward runs programs) on the problem's
**public tests**, its first two:

* all public tests pass, or this was the last of ``ATTEMPTS`` attempts: the episode ends and
  its reward is the program's pass rate on the **hidden tests**, every test after the public
  ones (all of them when the problem has no more than two);
* otherwise the next user message says what went wrong on the first public test that failed
  (the compiler's or the runtime's last error line, or the input, the expected output and
  the program's own) and asks for a fixed program; the turn's reward is 0.

So the return is in [0, 1] and comes at the end, as a unit test's verdict would; the turns
before are the model reading its own failures. Set ``--max-turns`` to ``ATTEMPTS`` (3) or
more: an episode the run's budget cuts before its last attempt gets no hidden-test reward.
"""

from __future__ import annotations

import json
import threading

from marlhf_cli.rewards import sandbox as sb
from marlhf_cli.rewards.apps import PASSED, Judge, extract_program, judge, test_cases, tolerance_of

ATTEMPTS = 3  # programs per episode at most
PUBLIC = 2  # the first tests, whose failures are shown
SHOWN_CHARS = 400  # of an input or an output in a message

_JUDGE: Judge | None = None
_LOCK = threading.Lock()


def shared_judge() -> Judge:
    """One sandbox pool per process, shared by every episode (started on first use)."""
    global _JUDGE
    with _LOCK:
        if _JUDGE is None:
            _JUDGE = Judge(stop_on_error=False)
        return _JUDGE


def _shown(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + " ..."


def _last_line(detail: str) -> str:
    lines = [line for line in (detail or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


class ProgramRepair:
    """One episode: one APPS problem, up to ``ATTEMPTS`` programs (module docstring)."""

    def __init__(self, record: dict, seed: int):
        self.record = record
        self.tests = test_cases(record)
        self.public = self.tests[:PUBLIC]
        self.hidden_record = dict(record)
        if len(self.tests) > PUBLIC:  # the hidden tests: every one after the public ones
            self.hidden_record["inputs"] = list(record["inputs"])[PUBLIC:]
            self.hidden_record["outputs"] = list(record["outputs"])[PUBLIC:]
        self.attempts = 0

    def reset(self) -> str:
        return self.record["prompt"]

    def feedback(self, program: str) -> str | None:
        """What went wrong on the first public test that failed, or None when they all pass."""
        problem = sb.compile_error(program)
        if problem is not None:
            return f"Your program does not compile: {_last_line(problem)}\nFix it and answer with the whole program."
        fn_name = self.record.get("fn_name") or None
        box = shared_judge().sandbox
        for number, case in enumerate(self.public, start=1):
            execution = box.run(sb.Job(program, stdin=case.stdin, fn_name=fn_name, call_args=case.call_args))
            outcome = judge(execution, case, fn_name, tolerance_of(self.record))
            if outcome == PASSED:
                continue
            given = _shown(case.stdin if fn_name is None else case.call_args)
            if execution.status != sb.OK:
                what = f"it ended with {execution.status.replace('_', ' ')}: {_last_line(execution.detail or execution.stderr)}"
            else:
                what = f"it printed:\n{_shown(execution.stdout)}\nbut the expected output is:\n{_shown(case.expected)}"
            return f"Public test {number} fails. Its input:\n{given}\n{what}\nFix the program and answer with the whole program."
        return None

    def step(self, reply: str) -> tuple[str | None, float, bool]:
        self.attempts += 1
        program = extract_program(reply)
        said = self.feedback(program)
        if said is not None and self.attempts < ATTEMPTS:
            return said, 0.0, False
        result = shared_judge().check([program], [self.hidden_record])[0]
        hidden = len(test_cases(self.hidden_record))
        return None, result.passed / hidden if hidden else 0.0, True
