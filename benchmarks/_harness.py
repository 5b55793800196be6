"""Plumbing the benchmark scripts share: device flags, the machine line, PPO runs.

Not a benchmark itself (the leading underscore). Every script prints ``# machine: ...`` from
:func:`machine_line` (CPU model, cores, torch threads, load average at start) so a figure
is never read without knowing what else the machine was doing.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SHARED_DATA = REPO.parent / "shared" / "data"
HH_HELPFUL = SHARED_DATA / "hh-rlhf" / "helpful-base-sample.jsonl"


def add_device_args(parser: argparse.ArgumentParser, *, threads: int = 1) -> None:
    """``--device``, ``--dtype`` and ``--threads`` (torch intra-op threads per process)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (hides any GPU) or cuda (the stage puts its engines on GPU 0)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=threads,
                        help=f"torch threads per process (default {threads}: faster than 2 for small models on a 2-core CPU)")


def apply_device_args(args: argparse.Namespace) -> None:
    """Make the process use what the flags say; exit 2 with one line if it cannot."""
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the stage picks CUDA by itself when it sees one
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU on this machine (torch " + torch.__version__ + ")")
    torch.set_num_threads(max(1, args.threads))
    os.environ["OMP_NUM_THREADS"] = str(max(1, args.threads))  # for child processes


def child_env(threads: int) -> dict[str, str]:
    """Environment for a worker subprocess: offline, ``threads`` BLAS/OpenMP threads."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    return env


def _lscpu(field: str) -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    for line in out.splitlines():
        if line.lower().startswith(field.lower() + ":"):
            return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    return _lscpu("model name") or platform.processor() or platform.machine()


def cpu_flags() -> str:
    """The CPU's vector and matrix extensions (what decides its bf16 and fp32 speed)."""
    from marlhf_cli.precision import cpu_flags as all_flags  # what --dtype auto reads

    wanted = sorted(f for f in all_flags() if f.startswith(("avx", "amx", "fma", "f16c", "sve", "asimd")))
    return " ".join(wanted) or "none of avx/amx/fma/sve listed"


def device_report() -> str:
    """What a figure ran on: every GPU torch sees (name, memory, compute capability, bf16 peak)
    with torch's CUDA version, else the CPU's model, cores and vector extensions."""
    import torch

    from _flops import bf16_peak

    if torch.cuda.is_available():
        lines = [f"# device: {torch.cuda.device_count()} GPU(s), torch {torch.__version__}, CUDA {torch.version.cuda}"]
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            peak, source = bf16_peak(props.name)
            lines.append(f"# GPU {index}: {props.name}, {props.total_memory / 2**30:.1f} GiB, compute capability "
                         f"{props.major}.{props.minor}, {props.multi_processor_count} SMs; bf16 dense peak "
                         f"{peak if peak else 'unknown'} TFLOP/s ({source})")  # fmt: skip
        return "\n".join(lines)
    return (f"# device: CPU {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} (no GPU visible)\n"
            f"# CPU flags: {cpu_flags()}")  # fmt: skip


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine_line(args: argparse.Namespace | None = None) -> str:
    import torch

    parts = [cpu_model(), f"{os.cpu_count()} cores", f"torch {torch.__version__}"]
    if args is not None:
        if args.device == "cuda":
            from _flops import bf16_peak

            name = torch.cuda.get_device_name(0)
            peak, source = bf16_peak(name)
            parts.append(f"GPU {name} (bf16 dense peak {peak if peak else 'unknown'} TFLOP/s: {source})")
        parts += [f"device {args.device}", args.dtype, f"{torch.get_num_threads()} torch thread(s)/process"]
    parts.append(f"load average {load_average()}")
    return "# machine: " + ", ".join(parts)


def ppo_config(run_dir: str | Path, **flags):
    """A PPOConfig from flags, as ``marlhf ppo`` would resolve them (no preset, no file), in
    fp32 unless ``dtype`` is given.

    The paper's shares by default, also for :func:`write_prompts`' prompt/completion files
    (which ``ppo`` would otherwise sample from whole): the prompts the recorded results used."""
    from marlhf_cli import config as config_module

    flags.setdefault("run_dir", str(run_dir))
    flags.setdefault("split_shares", "20/40/40")
    # fp32 unless the benchmark says otherwise: ``auto`` would make a study's runs depend on
    # the machine they happen to run on (bf16 on a CPU with avx512_bf16, fp32 elsewhere)
    flags.setdefault("dtype", "fp32")
    return config_module.resolve("ppo", flags=flags)


def train_rows(run_dir: str | Path, name: str) -> list[dict]:
    """The per-step training rows the stage logged to metrics/ppo-<name>.jsonl."""
    from marlhf_cli.artifacts import read_jsonl

    return [row for row in read_jsonl(Path(run_dir) / "metrics" / f"ppo-{name}.jsonl") if row["split"] == "train"]


def write_prompts(path: Path, count: int = 120) -> Path:
    """Short synthetic prompt rows (the loader's PPO split takes its share of them)."""
    import json

    topics = ["cats", "rain", "maths", "trains", "music", "bread", "the sea", "chess", "snow", "bees"]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            handle.write(json.dumps({"prompt": f"Tell me about {topics[i % 10]}, item {i}:", "completion": " ok"}) + "\n")
    return path


def print_against_baseline(what: str, unit: str, against: str, rows: list[tuple[str, list[float]]]) -> None:
    """A Markdown table of settings timed in interleaved rounds: each row's median, its ratio to
    the first row's median (the baseline, named ``against`` in the header) and its ratio to the
    baseline round by round."""
    import statistics

    _, base_times = rows[0]
    base = statistics.median(base_times)
    print(f"| {what} | {unit}, median of {len(base_times)} | / {against} | per round |")
    print("|---|---:|---:|---|")
    for label, times in rows:
        per_round = ", ".join(f"{t / b:.2f}" for t, b in zip(times, base_times))
        print(f"| {label} | {statistics.median(times):.2f} | {statistics.median(times) / base:.2f} | {per_round} |")


def median(values):
    import statistics

    return statistics.median(values) if values else float("nan")


def spread(values) -> str:
    """``mean ± sample std`` (or just the value for one)."""
    import statistics

    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.mean(values):.3g} ± {statistics.stdev(values):.2g}"
