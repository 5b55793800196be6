"""PPO throughput of marlhf against TRL 1.12.0's PPOTrainer, and GRPO's against TRL's current
GRPOTrainer (``--algorithm grpo``): same models, prompts and settings.

    python3 -m venv benchmarks/.venv-trl \\
      && benchmarks/.venv-trl/bin/pip install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu \\
      && benchmarks/.venv-trl/bin/pip install trl==1.12.0
    python benchmarks/vs_trl.py [--steps 12] [--rounds 2] [--threads 1] [--device cpu|cuda] [--dtype fp32|bf16]
                                [--hidden 256 --layers 4 | --model smollm2-135m] [--marlhf-dtype bf16]
                                [--trl-dtype fp32|bf16|bf16-mixed] [--batch 8] [--new-tokens 64] [--no-shipped]
                                [--trl-python PYTHON] [--json FILE] [--flops]

TRL removed PPO in 1.13, so TRL runs from its own virtualenv (``--trl-python``, default
``benchmarks/.venv-trl/bin/python``; torch first, so pip keeps the CPU build). This script
saves one random-init Llama policy and one reward model (``--hidden``/``--layers``; default:
the ``tiny`` alias, 3.2M parameters, SmolLM2's 49k vocabulary and tokenizer) and the prompt ids
(HH-RLHF prompts cut to their last ``--prompt-tokens`` tokens) to a temporary folder, then
runs, alternately, ``rounds`` times each, a fresh marlhf process (``ppo.run``, vanilla PPO:
``--termination fixed --n 1``) and a fresh TRL process (``_trl_worker.py``) on them:
batch 8, one PPO epoch, one minibatch, 64 new tokens at temperature 0.8 with no top-k/top-p
(TRL's sampler has none), stop at EOS, KL 0.05 (k1), clip 0.2, lr 1.5e-5, fp32 on a CPU.
``--model smollm2-135m`` uses real weights instead: the policy as is, the reward model (and
so both critics) the same backbone with a new scalar head; ``--model random:smollm2-1.7b``
(or ``-135m``, ``-360m``) a random-init model of SmolLM2's shape, saved in ``--dtype``.
Prompts: HH-RLHF from ../shared/data, else the package's embedded samples.

On a GPU (``--device cuda``, where TRL is installed beside marlhf: ``--trl-python python3``)
each tool's peak GPU memory (``torch.cuda.max_memory_allocated`` over its whole run) and
achieved model TFLOP/s (``_flops.py``) with its share of the GPU's dense bf16 peak are
printed too (``--flops`` prints TFLOP/s on a CPU); ``--json FILE`` writes every figure.

Each round runs three fresh processes (order reversed every other round): marlhf, TRL with
``gc.collect()`` made a no-op in its process ("trl-core": TRL calls it twice per step, work
that is not PPO's and that a user removes the same way), and TRL as shipped ("trl-shipped",
skipped with ``--no-shipped``). Step time is wall clock between consecutive steps (each
tool's logging included); the first ``--warmup`` steps of each run are dropped. Tokens per
second = real response tokens per step (up to and including EOS, for both tools) / median
step time. Each tool's step is broken
into generation, scoring forwards (+ credit: GAE), update, gc and other (marlhf: its own
per-step timings; TRL: see ``_trl_worker.py``). The headline is marlhf over trl-core, with
the ratio of every round (each round's marlhf run against the same round's TRL run); marlhf
over trl-shipped is reported too, labelled. ``--marlhf-dtype bf16`` runs marlhf in bf16
against TRL in ``--dtype``.

``--algorithm grpo`` (issue 44) sets ``marlhf ppo --advantage grpo`` against the
``GRPOTrainer`` of TRL's newest release, the trainer a single-GPU user picks today (TRL removed
PPO in 1.13), from its own virtualenv (``--trl-grpo-python``, default
``benchmarks/.venv-trl-new/bin/python``: ``pip install torch==2.13.0`` then ``trl``), through
``_trl_grpo_worker.py``. Like for like: the same policy and reward model, the same prompt
texts (cut to ``--prompt-tokens`` tokens and decoded, so neither tool cuts them again),
``--batch`` completions per step in groups of ``--group``, the same length limit,
temperature 0.8 with no top-k/top-p, KL 0.05 as a k3 loss term against the reference, clip
0.2, group-normalised scores, token-mean loss (TRL's ``dapo``), lr 1.5e-5 constant, one
iteration per batch, in ``--dtype``. TRL generates with ``model.generate``, or with
transformers' continuous batching with ``--paged`` (its fast path without vLLM, for a GPU).
Per step: tokens per second and generation's share, for both.

Differences that stay (each tool's design): TRL samples with ``model.generate`` and trains
policy and value with one optimizer and one backward; marlhf samples with its own KV-cached
loop (``--generation``: on CUDA by default its compiled sampler, each token's step one replayed
CUDA graph) and trains actor and critic as two DeepSpeed engines. Both take the old log-probs
from the sampling pass.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as H  # noqa: E402

TRL_PYTHON = H.BENCH_DIR / ".venv-trl" / "bin" / "python"
TRL_NEW_PYTHON = H.BENCH_DIR / ".venv-trl-new" / "bin" / "python"  # TRL's newest release: its GRPOTrainer
SETTINGS = dict(batch=8, new_tokens=64, temperature=0.8, group=4, kl_coef=0.05)


def prepare(work: Path, args) -> dict:
    """Policy and reward-model folders (with the tokenizer), the prompts as text and ids."""
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    from marlhf_cli.models import TINY_SEED, load_tokenizer, tiny_config

    tokenizer = load_tokenizer("tiny", padding_side="left")
    if args.model:  # real weights: the policy as is, the reward model with a fresh scalar head
        from marlhf_cli.models import load_causal_lm, load_reward_model

        # saved in bf16 for a bf16 comparison (half the bytes of a 1.7B model to write and read)
        dtype = "bf16" if args.dtype == "bf16" else None
        policy = load_causal_lm(args.model, dtype=dtype)
        params = sum(p.numel() for p in policy.parameters())
        for name, model in (("policy", policy), ("reward", load_reward_model(args.model, dtype=dtype))):
            model.save_pretrained(work / name)
            tokenizer.save_pretrained(work / name)
            del model
        return write_prompts(work, args, tokenizer, params)
    overrides = {}
    if args.hidden:
        overrides.update(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 128))
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    for name, cls, extra in (("policy", LlamaForCausalLM, {}), ("reward", LlamaForSequenceClassification, {"num_labels": 1})):
        torch.manual_seed(TINY_SEED)
        model = cls(tiny_config(tokenizer, **overrides, **extra))
        model.save_pretrained(work / name)
        tokenizer.save_pretrained(work / name)
    params = sum(p.numel() for p in LlamaForCausalLM(tiny_config(tokenizer, **overrides)).parameters())
    return write_prompts(work, args, tokenizer, params)


def write_prompts(work: Path, args, tokenizer, params: int) -> dict:
    """HH-RLHF prompts as text (marlhf's dataset) and as ids (TRL's), cut the same way."""
    from marlhf_cli.encode import encode_prompt

    if H.HH_HELPFUL.is_file():
        rows = [json.loads(line) for line in H.HH_HELPFUL.read_text(encoding="utf-8").splitlines()]
        texts = [row["chosen"][: row["chosen"].rfind("\n\nAssistant:") + len("\n\nAssistant:")] for row in rows]
        source = str(H.HH_HELPFUL)
    else:  # e.g. on a GPU machine without ../shared: the prompts of the samples the package ships
        from marlhf_cli.data.loader import load_records

        texts = [r["prompt"] for name in ("tldr", "hh", "webgpt") for r in load_records(name).records]
        source = "the embedded tldr, hh and webgpt samples"
    prompts = [t for t in texts if len(tokenizer(t, add_special_tokens=False)["input_ids"]) >= args.prompt_tokens + 4]
    if len(prompts) < 64:
        sys.exit(f"need 64 prompts of {args.prompt_tokens + 4}+ tokens from {source} (found {len(prompts)})")
    prompts = prompts[:400]
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": " ok"}) + "\n" for p in prompts))
    ids = [encode_prompt(tokenizer, p, args.prompt_tokens) for p in prompts]
    (work / "prompt_ids.json").write_text(json.dumps(ids))
    # GRPO: the cut prompts as text, which both tools tokenize whole (TRL's GRPOTrainer cuts nothing)
    cut = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    (work / "prompts-cut.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": " ok"}) + "\n" for p in cut))
    return {"params": params, "prompts": len(prompts), "source": source}


def marlhf_config(work: Path, args, *, steps: int):
    """The stage's config for the comparison: vanilla PPO (or GRPO) with the settings above."""
    if args.algorithm == "grpo":
        group = SETTINGS["group"]
        return H.ppo_config(
            work / f"marlhf-run-{time.time_ns()}", policy=str(work / "policy"), reward_model=str(work / "reward"),
            dataset=str(work / "prompts-cut.jsonl"), advantage="grpo", samples_per_prompt=group,
            rollout_batch_size=SETTINGS["batch"] // group, mini_batch_size=SETTINGS["batch"], ppo_epochs=1,
            max_new_tokens=SETTINGS["new_tokens"], max_prompt_length=4 * args.prompt_tokens, temperature=SETTINGS["temperature"],
            top_k=0, top_p=1.0, kl_coef=SETTINGS["kl_coef"], clip_range=0.2, actor_lr=1.5e-5, lr_scheduler="constant",
            dtype=args.dtype, max_steps=steps, generation=args.generation, eval_every=0, eval_prompts=0, save_every=0, seed=0,
        )  # fmt: skip
    return H.ppo_config(
        work / f"marlhf-run-{time.time_ns()}", policy=str(work / "policy"), reward_model=str(work / "reward"),
        dataset=str(work / "prompts.jsonl"),
        termination="fixed", n=1, rollout_batch_size=SETTINGS["batch"], mini_batch_size=SETTINGS["batch"], ppo_epochs=1,
        max_new_tokens=SETTINGS["new_tokens"], max_prompt_length=args.prompt_tokens, temperature=SETTINGS["temperature"],
        top_k=0, top_p=1.0, kl_coef=0.05, kl_estimator="k1", clip_range=0.2, value_clip_range=0.2,
        actor_lr=1.5e-5, critic_lr=1.5e-5, dtype=args.dtype, max_steps=steps, generation=args.generation,
        eval_every=0, eval_prompts=0, save_every=0, seed=0,
    )  # fmt: skip


def marlhf_worker(args) -> None:
    """One marlhf process: vanilla PPO with the settings above; per-step wall times to --out."""
    H.apply_device_args(args)
    from marlhf_cli.train import ppo

    config = marlhf_config(Path(args.work), args, steps=args.steps)
    run_dir = config.run_dir
    ppo.run(config)
    import torch

    from transformers import AutoConfig

    rows = H.train_rows(run_dir, ppo.run_name(config))
    stamps = [row["time"] for row in rows]
    result = {
        "tool": "marlhf",
        "generation": config.generation,  # as the stage resolved --generation
        "generation_captures": rows[-1].get("generation_captures", 0),
        "threads": torch.get_num_threads(),
        "step_times": [rows[0]["step_time"]] + [b - a for a, b in zip(stamps, stamps[1:])],
        "stage_step_times": [row["step_time"] for row in rows],
        "tokens_per_step": [row["response_tokens"] for row in rows],
        "phases": {k: [row[k] for row in rows] for k in ("generation_time", "scoring_time", "credit_time", "training_time")},
        "response_length": [row["response_length"] for row in rows],
        "model_config": AutoConfig.from_pretrained(Path(args.work) / "policy").to_dict(),
    }
    if torch.cuda.is_available():
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    Path(args.out).write_text(json.dumps(result))


TOOLS = ("marlhf", "trl-core", "trl-shipped")
GRPO_TOOLS = ("marlhf", "trl-grpo")
PHASES = ("generation_time", "scoring_time", "credit_time", "training_time", "gc_time", "other_time")


def run_tool(tool: str, work: Path, args, index: int) -> dict:
    out = work / f"{tool}-{index}.json"
    log = work / f"{tool}-{index}.log"
    common = ["--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device, "--out", str(out)]
    if tool == "marlhf":
        command = [sys.executable, __file__, "--marlhf-worker", "--work", str(work), "--dtype", args.marlhf_dtype or args.dtype,
                   "--prompt-tokens", str(args.prompt_tokens), "--batch", str(SETTINGS["batch"]), "--group", str(SETTINGS["group"]),
                   "--new-tokens", str(SETTINGS["new_tokens"]), "--generation", args.generation, "--algorithm", args.algorithm,
                   "--kl-coef", str(SETTINGS["kl_coef"]), *common]  # fmt: skip
    elif tool == "trl-grpo":
        command = [str(args.trl_grpo_python), str(H.BENCH_DIR / "_trl_grpo_worker.py"), "--policy", str(work / "policy"),
                   "--reward", str(work / "reward"), "--prompts", str(work / "prompts-cut.jsonl"), "--work-dir", str(work),
                   "--batch", str(SETTINGS["batch"]), "--group", str(SETTINGS["group"]), "--new-tokens", str(SETTINGS["new_tokens"]),
                   "--dtype", args.trl_dtype or args.dtype, "--temperature", str(SETTINGS["temperature"]),
                   "--beta", str(SETTINGS["kl_coef"]), *(["--paged"] if args.paged else []), *common]  # fmt: skip
    else:
        command = [str(args.trl_python), str(H.BENCH_DIR / "_trl_worker.py"), "--policy", str(work / "policy"),
                   "--reward", str(work / "reward"), "--prompts", str(work / "prompt_ids.json"), "--work-dir", str(work),
                   "--batch", str(SETTINGS["batch"]), "--new-tokens", str(SETTINGS["new_tokens"]), "--dtype", args.trl_dtype or args.dtype,
                   "--temperature", str(SETTINGS["temperature"]), "--gc", "noop" if tool == "trl-core" else "shipped",
                   *common]  # fmt: skip
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=H.child_env(args.threads)).returncode
    if code != 0 or not out.is_file():
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-15:])
        sys.exit(f"{tool} run failed (exit {code}); last lines of {log}:\n{tail}")
    result = json.loads(out.read_text())
    result["process_seconds"] = time.perf_counter() - started
    if tool == "marlhf":  # what the step's wall time holds besides the four phases (logging, metrics)
        timed = zip(*(result["phases"][k] for k in PHASES[:4]))
        result["phases"]["other_time"] = [t - sum(p) for t, p in zip(result["step_times"], timed)]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="PPO steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run not counted")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tool, alternating")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=SETTINGS["batch"], help="responses per step (default %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=SETTINGS["new_tokens"], help="response length limit (default %(default)s)")
    parser.add_argument("--model", default=None, help="real weights for policy, reference, value and reward base "
                        "(e.g. smollm2-135m; same tokenizer); default: a random-init Llama of --hidden/--layers")
    parser.add_argument("--hidden", type=int, default=None, help="model width (default: the tiny alias, 64)")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default: the tiny alias, 2)")
    parser.add_argument("--marlhf-dtype", choices=("fp32", "bf16"), default=None,
                        help="marlhf's dtype when it differs from TRL's (--dtype), e.g. marlhf bf16 against TRL fp32")
    parser.add_argument("--trl-dtype", choices=("fp32", "bf16", "bf16-mixed"), default=None,
                        help="TRL's precision when it differs from --dtype: bf16 = bf16 weights, gradients and AdamW "
                        "states (loading the models in bf16 with bf16=True); bf16-mixed = fp32 weights and optimizer "
                        "under bf16 autocast, the like of marlhf's bf16 (fp32 master weights)")
    parser.add_argument("--no-shipped", action="store_true", help="skip the runs of TRL as shipped (gc.collect on)")
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON,
                        help="an interpreter with trl 1.12.0 (default: benchmarks/.venv-trl; python3 where TRL is installed beside marlhf)")
    parser.add_argument("--algorithm", choices=("ppo", "grpo"), default="ppo",
                        help="ppo: against TRL 1.12's PPOTrainer; grpo: marlhf's --advantage grpo against TRL's current GRPOTrainer")
    parser.add_argument("--group", type=int, default=SETTINGS["group"], help="grpo: completions per prompt (default %(default)s)")
    parser.add_argument("--trl-grpo-python", type=Path, default=TRL_NEW_PYTHON,
                        help="grpo: an interpreter with TRL's newest release (default: benchmarks/.venv-trl-new)")
    parser.add_argument("--paged", action="store_true", help="grpo: TRL generates with transformers' continuous batching")
    parser.add_argument("--kl-coef", type=float, default=SETTINGS["kl_coef"], help="grpo: beta of the k3 KL loss, both tools "
                        "(0: neither loads nor runs a reference; default %(default)s)")  # fmt: skip
    parser.add_argument("--generation", choices=("auto", "eager", "compiled"), default="auto",
                        help="marlhf's sampler (--generation; auto: compiled on CUDA, eager on a CPU)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--flops", action="store_true", help="TFLOP/s on a CPU too (always shown on a GPU)")
    parser.add_argument("--marlhf-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    H.add_device_args(parser)
    args = parser.parse_args()
    SETTINGS.update(batch=args.batch, new_tokens=args.new_tokens, group=args.group, kl_coef=args.kl_coef)
    if args.marlhf_worker:
        return marlhf_worker(args)
    trl_python = args.trl_grpo_python if args.algorithm == "grpo" else args.trl_python
    if not Path(trl_python).is_file():
        sys.exit(f"no TRL virtualenv at {trl_python}; create it with the commands in this script's docstring")
    if args.algorithm == "grpo" and SETTINGS["batch"] % SETTINGS["group"]:
        sys.exit(f"--batch {SETTINGS['batch']} must be a multiple of --group {SETTINGS['group']}")
    H.apply_device_args(args)
    print(H.machine_line(args))
    work = Path(tempfile.mkdtemp(prefix="marlhf-vs-trl-"))
    info = prepare(work, args)
    if args.device == "cuda":  # random: models are built on the GPU; leave its memory to the workers
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    tools = GRPO_TOOLS if args.algorithm == "grpo" else TOOLS[:2] if args.no_shipped else TOOLS
    print(f"# prompts from {info['source']}")
    if args.algorithm == "grpo":
        print(f"# GRPO: {SETTINGS['batch']} completions per step, {SETTINGS['group']} per prompt, KL 0.05 (k3, in the loss), "
              f"token-mean loss, group-normalised scores; TRL generates with {'continuous batching' if args.paged else 'model.generate'}")  # fmt: skip
    print(f"# {args.model or 'random-init Llama'}, {info['params'] / 1e6:.1f}M params (policy; reference, value and reward models alike), "
          f"batch {SETTINGS['batch']}, {SETTINGS['new_tokens']} new tokens, prompts of {args.prompt_tokens} tokens, "
          f"{args.steps} steps per run ({args.warmup} warm-up), {args.rounds} alternating runs per tool; "
          f"marlhf {args.marlhf_dtype or args.dtype}, TRL {args.trl_dtype or args.dtype}; work dir {work}")  # fmt: skip
    if args.algorithm == "ppo":
        print("# trl-core: TRL with gc.collect() made a no-op in its process (TRL calls it twice per step; not PPO work); "
              "trl-shipped: TRL as installed")  # fmt: skip
    results: dict[str, list[dict]] = {tool: [] for tool in tools}
    for index in range(args.rounds):
        for tool in (tools if index % 2 == 0 else tools[::-1]):
            results[tool].append(run_tool(tool, work, args, index))
            print(f"# {tool} run {index + 1} done ({results[tool][-1]['process_seconds']:.0f} s for the whole process)", flush=True)
    report(results, args)
    figures = flops_report(results, args) if (args.device == "cuda" or args.flops) and args.algorithm == "ppo" else {}
    if args.json:
        from marlhf_cli.artifacts import write_json

        write_json(args.json, {"machine": H.machine_line(args), "model": args.model, "params": info["params"],
                               "algorithm": args.algorithm, "settings": SETTINGS, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
                               "dtype": {"marlhf": args.marlhf_dtype or args.dtype, "trl": args.trl_dtype or args.dtype},
                               "tools": {tool: {"step_median": statistics.median([t for r in runs for t in r["step_times"][args.warmup:]]),
                                                "tokens_per_step": statistics.mean(tokens_of(r) for r in runs),
                                                "runs": runs, **figures.get(tool, {})}
                                         for tool, runs in results.items()}})  # fmt: skip
        print(f"# figures written to {args.json}")


def flops_report(results: dict[str, list[dict]], args) -> dict[str, dict]:
    """Per tool: achieved model TFLOP/s (its share of the bf16 peak) and peak GPU memory."""
    from transformers import LlamaConfig

    from _flops import gpu_figures, ppo_step_flops

    config = LlamaConfig(**results["marlhf"][0]["model_config"])
    import torch

    name = torch.cuda.get_device_name(0) if args.device == "cuda" else H.cpu_model()
    out = {}
    for tool, runs in results.items():
        step = statistics.median([t for r in runs for t in r["step_times"][args.warmup:]])
        tokens = statistics.mean(tokens_of(r) for r in runs) / SETTINGS["batch"]
        flops = ppo_step_flops(config, responses=SETTINGS["batch"], prompt_tokens=args.prompt_tokens, response_tokens=tokens)
        figures = gpu_figures(flops, step, name)
        peaks = [r["peak_memory_gib"] for r in runs if "peak_memory_gib" in r]
        figures["peak_memory_gib"] = max(peaks) if peaks else None
        share = f"{100 * figures['share_of_peak']:.1f}% of the bf16 peak" if figures["share_of_peak"] is not None else "peak unknown"
        memory = f"{figures['peak_memory_gib']:.2f} GiB" if peaks else "n/a"
        print(f"{tool}: {figures['tflops']:.3f} model TFLOP/s ({share}), peak GPU memory {memory}")
        out[tool] = figures
    print(f"# model TFLOP/s: benchmarks/_flops.py over the median step; peak: {out['marlhf']['peak_source']}")
    return out


def step_median(run: dict, warmup: int) -> float:
    return statistics.median(run["step_times"][warmup:])


def report(results: dict[str, list[dict]], args) -> None:
    """Speed per tool, the phase table, and the ratios with their per-round values."""
    w = args.warmup
    print(f"{'tool':<26}{'s/step median':>14}{'per run':>22}{'tokens/step':>12}{'tokens/s':>10}")
    speed = {}
    for tool, runs in results.items():
        steps = [t for r in runs for t in r["step_times"][w:]]
        tokens = statistics.mean(tokens_of(r) for r in runs)
        speed[tool] = tokens / statistics.median(steps)
        name = tool if tool == "marlhf" else f"{tool} ({runs[0]['tool']})"
        per_run = " / ".join(f"{step_median(r, w):.3f}" for r in runs)
        print(f"{name:<26}{statistics.median(steps):>14.3f}{per_run:>22}{tokens:>12.0f}{speed[tool]:>10.0f}")
    print("# phases, median seconds per step over every counted step (share of the median step); scoring includes "
          "TRL's GAE, marlhf's is 'credit'; TRL's update includes its per-step metrics")  # fmt: skip
    print(f"{'tool':<14}" + "".join(f"{k.replace('_time', ''):>16}" for k in PHASES))
    for tool, runs in results.items():
        step = statistics.median([t for r in runs for t in r["step_times"][w:]])
        cells = []
        for key in PHASES:
            values = [v for r in runs for v in r["phases"].get(key, [])[w:]]
            cells.append(f"{statistics.median(values):.3f} ({100 * statistics.median(values) / step:.0f}%)" if values else "-")
        print(f"{tool:<14}" + "".join(f"{c:>16}" for c in cells))
    eos = [e for tool in tools_of(results) for r in results[tool] for e in r.get("eos_tokens", [])]
    lengths = [x for r in results["marlhf"] for x in r["response_length"]]
    print(f"# responses: marlhf mean length {statistics.mean(lengths):.1f} tokens; TRL EOS tokens per step {max(eos, default=0):.0f} at most")
    sampler = results["marlhf"][0]
    print(f"# marlhf sampled with --generation {sampler.get('generation', '?')} "
          f"({sampler.get('generation_captures', 0):.0f} static-cache bucket(s) made per run)")  # fmt: skip
    print(f"# load average at the end {H.load_average()}")
    for peer in tools_of(results):
        per_round = [
            (tokens_of(m) / step_median(m, w)) / (tokens_of(t) / step_median(t, w))
            for m, t in zip(results["marlhf"], results[peer])
        ]
        label = {"trl-core": "TRL core (gc.collect no-op), the like-for-like figure", "trl-shipped": "TRL as shipped"}.get(
            peer, f"{results[peer][0]['tool']}, like for like")
        print(f"marlhf / {label}: tokens per second = {speed['marlhf'] / speed[peer]:.2f}x "
              f"(per round {', '.join(f'{x:.2f}' for x in per_round)})")  # fmt: skip


def tools_of(results: dict) -> list[str]:
    return [tool for tool in results if tool != "marlhf"]


def tokens_of(run: dict) -> float:
    tokens = run["tokens_per_step"]
    return statistics.mean(tokens) if isinstance(tokens, list) else float(tokens)


if __name__ == "__main__":
    main()
