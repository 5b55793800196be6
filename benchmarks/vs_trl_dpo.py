"""DPO step time of marlhf against TRL's current DPOTrainer: same model, pairs, lengths,
dtype and threads.

    python3 -m venv benchmarks/.venv-trl-new && benchmarks/.venv-trl-new/bin/pip install torch==2.13.0 trl
    python benchmarks/vs_trl_dpo.py [--models tiny,smollm2-135m] [--rounds 3] [--steps 8] [--warmup 2]
                                    [--batch 8] [--prompt-tokens 96] [--response-tokens 48] [--threads 1]
                                    [--device cpu|cuda] [--dtype fp32|bf16] [--marlhf-only]
                                    [--trl-python PYTHON] [--json FILE]

For each model (``tiny``: the random-init 3.2M alias; ``smollm2-135m``: SmolLM2-135M-Instruct's
real weights, offline) the policy is saved once, and the same pairs are written once as text:
HH-RLHF helpful-base pairs from ../shared/data (else the embedded samples), each prompt cut to
its last ``--prompt-tokens`` tokens and each response to its first ``--response-tokens``, then
decoded, so neither tool cuts anything (marlhf's limits and TRL's ``max_length`` sit above every
pair). Then ``--rounds`` rounds, every model's in turn, each round a fresh process per tool
(order reversed every other round):

- ``marlhf``: ``marlhf dpo`` (the stage's own ``dpo.run``), fp32, the sigmoid loss, beta 0.1,
  a constant rate, no evaluation, no checkpoints; the reference's log-probs computed once per
  pair before the first step (its time reported apart: run.json's ``reference_seconds``);
- ``trl``: DPOTrainer as shipped (``precompute_ref_log_probs=False``: the reference runs at every
  step), with gradient checkpointing off (TRL turns it on by default; marlhf does not);
- ``trl-precompute``: DPOTrainer with ``precompute_ref_log_probs=True``, the reference once up
  front, as marlhf does.

Per tool: the median step time over every run's steps after ``--warmup``, tokens per second
(the pairs' mean prompt + chosen + prompt + rejected tokens x ``--batch`` / median step time),
the peak resident memory of the process, the reference's one pass (marlhf and trl-precompute),
and marlhf's speed over each TRL's, with every round's ratio. ``--device cuda --dtype bf16``
runs both on a GPU in bf16 (each tool's peak GPU memory reported too); ``--marlhf-only`` times
marlhf alone (the GPU suite's DPO row, where no TRL of 1.13 or later is installed).
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

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))
import _harness as H  # noqa: E402  (offline environment first)

TRL_PYTHON = BENCH / ".venv-trl-new" / "bin" / "python"
TOOLS = ("marlhf", "trl", "trl-precompute")


def prepare(work: Path, model: str, args) -> dict:
    """The policy folder and the cut pairs of one model; their mean tokens per pair."""
    from marlhf_cli.data.hh import split_transcript
    from marlhf_cli.models import load_causal_lm, load_tokenizer

    folder = work / model
    tokenizer = load_tokenizer(model)
    load_causal_lm(model).save_pretrained(folder / "policy")
    tokenizer.save_pretrained(folder / "policy")
    if H.HH_HELPFUL.is_file():
        raw = [json.loads(line) for line in H.HH_HELPFUL.read_text(encoding="utf-8").splitlines() if line.strip()]
        triples = []
        for row in raw:
            (prompt, chosen), (other, rejected) = split_transcript(row["chosen"]), split_transcript(row["rejected"])
            if prompt == other and chosen.strip() != rejected.strip():
                triples.append((prompt, chosen, rejected))
        source = str(H.HH_HELPFUL)
    else:
        from marlhf_cli.data.loader import load_records

        triples = [(r["prompt"], r["chosen"], r["rejected"]) for r in load_records("hh").records]
        source = "the embedded HH sample"

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    pairs, tokens = [], []
    for prompt, chosen, rejected in triples:
        p, c, r = ids(prompt)[-args.prompt_tokens :], ids(chosen)[: args.response_tokens], ids(rejected)[: args.response_tokens]
        if c == r:
            continue
        pairs.append({"prompt": tokenizer.decode(p), "chosen": tokenizer.decode(c), "rejected": tokenizer.decode(r)})
        tokens.append(2 * len(p) + len(c) + len(r) + 2)  # each response gets its EOS
        if len(pairs) == args.batch * (args.steps + 4):
            break
    (folder / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    params = sum(p.numel() for p in load_causal_lm(model).parameters())
    return {"folder": folder, "source": source, "pairs": len(pairs), "tokens_per_pair": statistics.mean(tokens), "params": params}


def marlhf_worker(args) -> None:
    """One marlhf process: ``dpo.run`` on the prepared pairs; its step times to --out."""
    import resource

    import torch

    from marlhf_cli import config as config_module
    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.train import dpo

    torch.set_num_threads(args.threads)
    folder = Path(args.work)
    run_dir = folder / f"marlhf-run-{time.time_ns()}"
    if args.device == "cpu":
        import os

        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    config = config_module.resolve("dpo", flags=dict(
        run_dir=str(run_dir), policy=str(folder / "policy"), dataset=str(folder / "pairs.jsonl"), split_shares="0/0/100",
        batch_size=args.batch, max_steps=args.steps, lr=5e-7, lr_scheduler="constant", beta=0.1, dtype=args.dtype, eval_every=0,
        eval_records=0, save_every=0, max_prompt_length=args.prompt_tokens + 16, max_response_length=args.response_tokens + 16,
        seed=0,
    ))  # fmt: skip
    dpo.run(config)
    rows = [row for row in read_jsonl(run_dir / "metrics" / "dpo.jsonl") if row["split"] == "train"]
    entry = json.loads((run_dir / "run.json").read_text())["stages"]["dpo"]
    result = {"tool": "marlhf", "threads": torch.get_num_threads(), "step_times": [row["step_time"] for row in rows],
              "reference_seconds": entry["inputs"]["reference_seconds"],
              "reference_pairs": entry["inputs"]["reference_pairs"],
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip
    if torch.cuda.is_available():
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    Path(args.out).write_text(json.dumps(result))


def run_tool(tool: str, folder: Path, args, index: int) -> dict:
    out, log = folder / f"{tool}-{index}.json", folder / f"{tool}-{index}.log"
    common = ["--steps", str(args.steps), "--batch", str(args.batch), "--threads", str(args.threads), "--out", str(out),
              "--device", args.device, "--dtype", args.dtype]  # fmt: skip
    if tool == "marlhf":
        command = [sys.executable, __file__, "--marlhf-worker", "--work", str(folder), "--prompt-tokens", str(args.prompt_tokens),
                   "--response-tokens", str(args.response_tokens), *common]  # fmt: skip
    else:
        command = [str(args.trl_python), str(BENCH / "_trl_dpo_worker.py"), "--policy", str(folder / "policy"),
                   "--pairs", str(folder / "pairs.jsonl"), "--work-dir", str(folder), *(["--precompute"] if tool == "trl-precompute" else []),
                   *common]  # fmt: skip
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=H.child_env(args.threads)).returncode
    if code != 0 or not out.is_file():
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-15:])
        sys.exit(f"{tool} run failed (exit {code}); last lines of {log}:\n{tail}")
    return json.loads(out.read_text()) | {"process_seconds": time.perf_counter() - started}


def report(model: str, info: dict, runs: dict[str, list[dict]], args) -> dict:
    """The table of one model: each tool's median step, tokens per second, memory and reference pass."""
    medians = {tool: statistics.median([t for r in rs for t in r["step_times"][args.warmup :]]) for tool, rs in runs.items()}
    tokens = info["tokens_per_pair"] * args.batch
    print(f"\n## {model} ({info['params'] / 1e6:.1f}M parameters), {info['pairs']} pairs from {info['source']}, "
          f"{tokens:,.0f} tokens per step")  # fmt: skip
    print("| tool | s / step (median) | per run | tokens / s | peak RSS (MiB) | peak GPU (GiB) | the reference |")
    print("|---|---:|---|---:|---:|---:|---|")
    setup = {tool: statistics.median(r.get("construct_seconds", 0.0) for r in rs) for tool, rs in runs.items()}
    for tool, rs in runs.items():
        per_run = " / ".join(f"{statistics.median(r['step_times'][args.warmup:]):.3f}" for r in rs)
        if tool == "marlhf":
            reference = f"once per pair, before step 1: {statistics.median(r['reference_seconds'] for r in rs):.2f} s"
        elif tool == "trl-precompute":  # DPOTrainer() tokenizes, then (with precompute) runs the reference
            reference = f"once, in DPOTrainer(): {setup[tool]:.2f} s against {setup['trl']:.2f} s without"
        else:
            reference = "a forward at every step"
        gpu = max((r["peak_memory_gib"] for r in rs if "peak_memory_gib" in r), default=None)
        print(f"| {tool} | {medians[tool]:.3f} | {per_run} | {tokens / medians[tool]:,.0f} | "
              f"{max(r['peak_rss_mib'] for r in rs):,.0f} | {'-' if gpu is None else f'{gpu:.2f}'} | {reference} |")  # fmt: skip
    per_step = statistics.median(r["reference_seconds"] * args.batch / r["reference_pairs"] for r in runs["marlhf"])
    print(f"# marlhf's reference pass, per step's {args.batch} pairs: {per_step:.3f} s, what a reference forward at every "
          f"step would add to its {medians['marlhf']:.3f} s ({100 * per_step / medians['marlhf']:.0f}%)")  # fmt: skip
    for other in [tool for tool in ("trl", "trl-precompute") if tool in runs]:
        rounds = [statistics.median(t["step_times"][args.warmup :]) / statistics.median(m["step_times"][args.warmup :])
                  for m, t in zip(runs["marlhf"], runs[other])]  # fmt: skip
        print(f"# marlhf / {other}: {medians[other] / medians['marlhf']:.2f}x tokens per second "
              f"(per round {', '.join(f'{x:.2f}' for x in rounds)})")  # fmt: skip
    return {"medians": medians, "tokens_per_step": tokens, "runs": runs, **{k: v for k, v in info.items() if k != "folder"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2-135m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted")
    parser.add_argument("--batch", type=int, default=8, help="pairs per step")
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--response-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: on a GPU (TRL's bf16 fails on a CPU)")
    parser.add_argument("--marlhf-only", action="store_true", help="time marlhf alone (no TRL installed)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--marlhf-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.marlhf_worker:
        return marlhf_worker(args)
    tools = ("marlhf",) if args.marlhf_only else TOOLS
    if not args.marlhf_only and not args.trl_python.is_file():
        sys.exit(f"no TRL virtualenv at {args.trl_python}; create it with the commands in this script's docstring")
    print(H.machine_line())
    print(f"# CPU flags: {H.cpu_flags()}")
    work = Path(tempfile.mkdtemp(prefix="marlhf-vs-trl-dpo-"))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    infos = {model: prepare(work, model, args) for model in models}
    version = "" if args.marlhf_only else subprocess.run([str(args.trl_python), "-c", "import trl; print(trl.__version__)"],
                                                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"# TRL {version or 'not run'}; {args.device}, {args.dtype}, {args.threads} thread(s) per process, {args.batch} pairs per step, prompts cut to "
          f"{args.prompt_tokens} tokens, responses to {args.response_tokens}; {args.steps} steps per run ({args.warmup} "
          f"warm-up), {args.rounds} rounds; work dir {work}")  # fmt: skip
    runs = {model: {tool: [] for tool in tools} for model in models}
    for index in range(args.rounds):
        for model in models:
            for tool in tools if index % 2 == 0 else tools[::-1]:
                runs[model][tool].append(run_tool(tool, infos[model]["folder"], args, index))
                print(f"# {model} {tool} run {index + 1} done ({runs[model][tool][-1]['process_seconds']:.0f} s)", flush=True)
    figures = {model: report(model, infos[model], runs[model], args) for model in models}
    if args.json:
        from marlhf_cli.artifacts import write_json

        write_json(args.json, {"machine": H.machine_line(), "trl": version, "settings": vars(args) | {"trl_python": str(args.trl_python),
                                                                                                   "json": str(args.json)}, "models": figures})
        print(f"# figures written to {args.json}")


if __name__ == "__main__":
    main()
