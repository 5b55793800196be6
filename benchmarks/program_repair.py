"""Fix it from feedback: a real model's pass rate after its first program and after feedback.

    python benchmarks/program_repair.py [--model smollm2-135m] [--n 4] [--out DIR] [--threads 2]

Runs ``marlhf passk --env py:templates/envs/program_repair.py:ProgramRepair --max-turns 3`` on
the embedded APPS sample (``--dataset apps --split all``: the project's ten easy problems
offline), ``--n`` episodes a problem, then reads each episode's first program back and runs
it on the same hidden tests (marlhf's sandbox), so both figures come from the same episodes:

- **after 0 turns of feedback**: the first program passes every hidden test;
- **after up to 2 turns**: the episode's last program does (its return is 1).

Each with its Wilson 95% interval over the episodes (episodes of one problem are not
independent: the per-problem counts are printed too), and the exact McNemar test of the
episodes where the two differ. The results page is docs/results/episodes.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402
from _outcomes import wilson  # noqa: E402

REPO = BENCH.parent
ENV_FILE = REPO / "templates" / "envs" / "program_repair.py"


def environment_module():
    spec = importlib.util.spec_from_file_location("program_repair_for_benchmark", ENV_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/program-repair"))
    args = parser.parse_args(argv)
    print(H.machine_line())
    samples_file = args.out / "passk" / "repair-samples.jsonl"
    if not samples_file.is_file():
        argv = ["passk", "--model", args.model, "--dataset", "apps", "--split", "all", "--env", f"py:{ENV_FILE}:ProgramRepair",
                "--max-turns", "3", "--n", str(args.n), "--k", "1", "--max-new-tokens", str(args.max_new_tokens),
                "--max-episode-tokens", str(3 * args.max_new_tokens + 1024), "--max-prompt-length", "768", "--batch-size", "8",
                "--name", "repair", "--run-dir", str(args.out)]  # fmt: skip
        print("$ marlhf " + " ".join(argv), flush=True)
        done = subprocess.run([sys.executable, "-m", "marlhf_cli.cli", *argv], cwd=REPO, env=H.child_env(args.threads))
        if done.returncode:
            return done.returncode
    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.data import load_records
    from marlhf_cli.rewards.apps import extract_program, test_cases
    from scipy.stats import binomtest

    module = environment_module()
    records = load_records("apps", split=None).records
    by_id = {str(r.get("problem_id")): r for r in records}
    rows = read_jsonl(samples_file)
    judge = module.shared_judge()
    first, last, per_problem = [], [], {}
    for row in rows:
        record = by_id[row["problem_id"].split("#")[0]]
        hidden = module.ProgramRepair(record, 0).hidden_record
        program = extract_program(next(m["content"] for m in row["episode"] if m["role"] == "assistant"))
        result = judge.check([program], [hidden])[0]
        first.append(result.passed == len(test_cases(hidden)))
        last.append(row["reward"] >= 1.0)
        counts = per_problem.setdefault(row["problem_id"], [0, 0, 0])
        counts[0] += 1
        counts[1] += first[-1]
        counts[2] += last[-1]
    episodes = len(rows)
    print(f"# {episodes} episodes: {len(per_problem)} problems x {args.n}, {args.model}, at most 3 programs each")
    print("| after | passed | rate [95% Wilson] |")
    print("|---|---:|---|")
    for label, passed in (("the first program (0 turns of feedback)", first), ("the last program (up to 2 turns of feedback)", last)):
        low, high = wilson(sum(passed), episodes)
        print(f"| {label} | {sum(passed)}/{episodes} | {sum(passed) / episodes:.3f} [{low:.3f}, {high:.3f}] |")
    fixed = sum(1 for a, b in zip(first, last) if b and not a)
    broken = sum(1 for a, b in zip(first, last) if a and not b)
    p = binomtest(fixed, fixed + broken, 0.5, alternative="greater").pvalue if fixed + broken else 1.0
    print(f"# fixed by feedback: {fixed} episodes; passed first, failed last: {broken}; exact McNemar, one-sided: p = {p:.3g}")
    print("# per problem (episodes, first passed, last passed): " + json.dumps(per_problem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
