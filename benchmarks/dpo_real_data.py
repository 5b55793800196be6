"""``marlhf dpo`` on real data: SmolLM2-135M on HH-RLHF pairs, a short run, its held-out
implicit-reward accuracy beside the length rules on the same pairs.

    python benchmarks/dpo_real_data.py [--steps 40] [--lr 1e-6] [--beta 0.1] [--threads 1] [--out DIR] [--quick]

Both HH-RLHF samples of ../shared/data (harmless-base and helpful-base, Anthropic's raw
transcripts) as one file, read by marlhf's own HH adapter through its command line as a user
runs it: ``marlhf dpo --dataset hh --data-file FILE --policy smollm2-135m`` (the instruct model
as its own reference: no SFT step), the paper's shares (DPO trains on the PPO share), the
held-out ``eval`` split (by prompt) for ``--eval-records`` pairs, prompts cut to their last 192
tokens and responses to 96, bf16, batch 8 pairs, a constant rate. Then, on the held-out pairs
the stage evaluated: its implicit-reward accuracy (``rewards/accuracies``: the share of pairs
whose chosen response's reward beta x (log pi - log pi_ref) is the higher) with a Wilson 95%
interval, and the two length rules (the longer response wins; the shorter wins) with theirs.
Exits with a reason when ../shared/data is absent. ``--quick``: the tiny model on the embedded
HH sample, 4 steps: the same path in seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402  (offline environment first)
from _outcomes import wilson  # noqa: E402

SOURCES = ("harmless-base", "helpful-base")


def combined_file(work: Path, quick: bool) -> tuple[str, str]:
    """(a data file for --dataset hh, what it holds)."""
    if quick:
        from marlhf_cli.data.registry import SAMPLES_DIR

        return str(SAMPLES_DIR / "hh.jsonl"), "the embedded HH sample"
    folder = H.SHARED_DATA / "hh-rlhf"
    files = [folder / f"{name}-sample.jsonl" for name in SOURCES]
    if not all(path.is_file() for path in files):
        sys.exit(f"no HH-RLHF samples in {folder}: this benchmark needs ../shared/data beside the repository")
    path = work / "hh-both.jsonl"
    path.write_text("".join(p.read_text(encoding="utf-8") for p in files), encoding="utf-8")
    return str(path), " and ".join(f"{name}-sample.jsonl" for name in SOURCES)


def length_rules(run_dir: Path, data_file: str, policy: str, eval_records: int, max_response: int) -> dict:
    """On the held-out pairs the stage read (the eval split's first ``eval_records``): the share
    each length rule gets right, responses cut as the stage cut them (a tie counts a half)."""
    from marlhf_cli.data import load_records
    from marlhf_cli.models import load_tokenizer

    tokenizer = load_tokenizer(policy)
    records = load_records("hh", data_file=data_file, split="eval", limit=eval_records).records

    def cut(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"][:max_response]

    # the stage's pairs: responses cut to the limit, a pair left out where the two then coincide
    pairs = [(len(c), len(r)) for c, r in ((cut(x["chosen"]), cut(x["rejected"])) for x in records) if c != r]
    out = {}
    for rule, sign in (("longer", 1), ("shorter", -1)):
        right = sum(0.5 if c == r else float(sign * (c - r) > 0) for c, r in pairs)
        out[rule] = {"accuracy": right / len(pairs), "interval": wilson(round(right), len(pairs))}
    return out | {"pairs": len(pairs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--eval-records", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="keep the run directory here (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="the tiny model on the embedded HH sample, 4 steps")
    args = parser.parse_args(argv)
    policy = "tiny" if args.quick else "smollm2-135m"
    steps, eval_records = (4, 8) if args.quick else (args.steps, args.eval_records)
    work = Path(tempfile.mkdtemp(prefix="marlhf-dpo-real-"))
    run_dir = args.out or work / "run"
    data_file, source = combined_file(work, args.quick)
    print(H.machine_line())
    print(f"# CPU flags: {H.cpu_flags()}")
    prompt, response = (48, 16) if args.quick else (192, 96)
    command = [sys.executable, "-m", "marlhf_cli.cli", "dpo", "--dataset", "hh", "--data-file", data_file, "--policy", policy,
               "--run-dir", str(run_dir), "--max-steps", str(steps), "--batch-size", "8", "--lr", str(args.lr), "--beta", str(args.beta),
               "--lr-scheduler", "constant", "--max-prompt-length", str(prompt), "--max-response-length", str(response),
               "--eval-records", str(eval_records), "--eval-every", str(max(steps // 4, 1)), "--save-every", "0",
               "--dtype", "fp32" if args.quick else "bf16", "--report-to", "tensorboard", "--seed", "0"]  # fmt: skip
    print(f"# {source}; $ marlhf {' '.join(command[3:])}", flush=True)
    done = subprocess.run(command, env=H.child_env(args.threads))
    if done.returncode:
        sys.exit(f"marlhf dpo failed (exit {done.returncode})")
    entry = json.loads((Path(run_dir) / "run.json").read_text())["stages"]["dpo"]
    metrics, inputs = entry["metrics"], entry["inputs"]
    pairs = int(metrics["eval_pairs"])
    accuracy = metrics["eval_rewards/accuracies"]
    rules = length_rules(Path(run_dir), data_file, policy, eval_records, response)
    if rules["pairs"] != pairs:
        sys.exit(f"the length rules read {rules['pairs']} pairs, the stage evaluated {pairs}: not the same pairs")
    low, high = wilson(round(accuracy * pairs), pairs)
    print(f"\n| on {pairs} held-out HH pairs | accuracy | 95% Wilson interval |")
    print("|---|---:|---|")
    print(f"| DPO's implicit reward after {steps} steps | {accuracy:.3f} | {low:.3f}-{high:.3f} |")
    for rule in ("longer", "shorter"):
        r = rules[rule]
        print(f"| the {rule} response wins | {r['accuracy']:.3f} | {r['interval'][0]:.3f}-{r['interval'][1]:.3f} |")
    print(f"\n# held-out margin {metrics['eval_rewards/margins']:.4f}, loss {metrics['eval_loss']:.4f} (log 2 = 0.6931 at the start), "
          f"chosen {metrics['eval_lengths/chosen']:.1f} and rejected {metrics['eval_lengths/rejected']:.1f} tokens; "
          f"{inputs['train_pairs']} training pairs, reference pass {inputs['reference_seconds']:.0f} s, "
          f"{metrics.get('seconds_per_step', float('nan')):.1f} s/step")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
