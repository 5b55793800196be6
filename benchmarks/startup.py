"""How long each command takes to answer before any work: its --help, a bad input, and
`segment`'s whole run with the rules that need no model.

    python benchmarks/startup.py [--repeats 5] [--json out.json]

Every call is a fresh `python -m marlhf_cli.cli ...` process (what a user's shell starts),
timed from launch to exit; the table gives the median and the range over the repeats, and
whether the process imported torch (a wrapper reports ``sys.modules`` at exit). The bad
inputs are the first mistakes a user makes: a data file that does not exist, a reward model
folder that does not exist, a misspelt flag. Each must be answered by the option and file
checks, before torch, transformers or a model is loaded. Times depend on the machine and
its load: the first line says which, and only figures of one run compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness as H  # noqa: E402

# runs the CLI as `marlhf` would, then says on stderr whether torch was imported
WRAPPER = (
    "import sys\n"
    "from marlhf_cli.cli import main\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    print('TORCH-IMPORTED' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
)


def cases(work: Path) -> list[tuple[str, list[str]]]:
    text = work / "responses.txt"
    text.write_text(
        "The cat sat on the mat because it was warm. Then it slept until noon.\n"
        "def add(a, b):\n    return a + b\n",
        encoding="utf-8",
    )
    missing = str(work / "missing.jsonl")
    out = [(f"{command} --help", [command, "--help"]) for command in
           ("sft", "rm", "ppo", "segment", "bon", "judge", "passk", "push")]  # fmt: skip
    out += [
        ("segment fixed,randomized,code (whole run)", ["segment", str(text), "--rule", "fixed,randomized,code"]),
        ("sft: data file missing", ["sft", "--run-dir", str(work / "run"), "--data-file", missing]),
        ("rm: data file missing", ["rm", "--run-dir", str(work / "run"), "--data-file", missing]),
        ("ppo: reward model folder missing", ["ppo", "--run-dir", str(work / "run"), "--policy", "tiny",
                                              "--reward-model", str(work / "no-rm")]),  # fmt: skip
        ("ppo: policy folder missing",
         ["ppo", "--run-dir", str(work / "run"), "--policy", str(work / "no-policy")]),
        ("rm: no sft/ in the run directory", ["rm", "--run-dir", str(work / "run")]),
        ("ppo: no sft/ in the run directory", ["ppo", "--run-dir", str(work / "run")]),
        ("passk: no sft/ in the run directory", ["passk", "--run-dir", str(work / "run")]),
        ("bon: no sft/ in the run directory", ["bon", "--run-dir", str(work / "run")]),
        ("bon: misspelt flag", ["bon", "--temperatur", "0.7"]),
        ("judge: answers file missing", ["judge", missing, missing]),
    ]
    return out


def time_once(arguments: list[str]) -> tuple[float, int, bool]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, *arguments], capture_output=True, text=True)
    return time.perf_counter() - started, done.returncode, "TORCH-IMPORTED" in done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (default %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    print(H.machine_line())
    rows = []
    with tempfile.TemporaryDirectory(prefix="marlhf-startup-") as folder:
        for label, arguments in cases(Path(folder)):
            time_once(arguments)  # warm the file cache
            runs = [time_once(arguments) for _ in range(args.repeats)]
            seconds = [r[0] for r in runs]
            rows.append({"case": label, "median_s": statistics.median(seconds), "min_s": min(seconds),
                         "max_s": max(seconds), "exit": runs[0][1], "torch": runs[0][2]})  # fmt: skip
            row = rows[-1]
            print(f"{label:<45} {row['median_s']:5.2f} s  ({row['min_s']:.2f}-{row['max_s']:.2f})  "
                  f"exit {row['exit']}  {'torch' if row['torch'] else 'no torch'}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"machine": H.machine_line(), "rows": rows}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
