"""``--dtype auto``: bf16 where this machine multiplies bf16 matrices fast, fp32 elsewhere.

bf16 pays where the hardware has bf16 matrix instructions: NVIDIA GPUs of compute
capability 8.0 or later (bf16 tensor cores: Ampere, Ada, Hopper, ...) and CPUs with Intel's
AMX (``amx_bf16``) or AVX-512 BF16 (``avx512_bf16``: Intel Cooper Lake and Sapphire Rapids
on, AMD Zen 4 on). Elsewhere a bf16 matmul is emulated through fp32 and a bf16 step is
slower than an fp32 one. Measured with ``benchmarks/roofline.py`` on a 2-core AMD EPYC with
avx512_bf16 (no AMX): one-thread matmul 111 GFLOP/s in fp32 against 484 in bf16, and a
SmolLM2-135M PPO step of 22.8 s in fp32 against 10.8 s in bf16 (docs/results/step-cost.md).

bf16 here is mixed precision as DeepSpeed's bf16 mode means it: the model computes in bf16,
the optimizer keeps fp32 master weights and fp32 AdamW states and adds gradients over
micro-batches in fp32 (``engine.zero_stage_run``); log-softmax, losses, values,
rewards and GAE are computed in fp32 (:mod:`marlhf_cli.train.forward`, :mod:`marlhf_cli.macro`).

``MARLHF_AUTO_DTYPE=fp32|bf16`` decides what ``auto`` means, silently, without looking at the
hardware (the test suite pins fp32 so that its results do not depend on the machine).
Imports no torch at module level: option checks stay light.
"""

from __future__ import annotations

import os
from pathlib import Path

FAST_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
OVERRIDE = "MARLHF_AUTO_DTYPE"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (Linux); empty where /proc/cpuinfo is absent or unreadable."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def auto_dtype(*, cuda_capability: tuple[int, int] | None, flags: frozenset[str] | set[str]) -> tuple[str, str]:
    """(dtype, why) for a machine: ``cuda_capability`` of the GPU the stage uses (None on a
    CPU) and the CPU's ``flags``."""
    if cuda_capability is not None:
        major, minor = cuda_capability
        if major >= 8:
            return "bf16", f"the GPU (compute capability {major}.{minor}) has bf16 tensor cores"
        return "fp32", f"the GPU (compute capability {major}.{minor}) has no bf16 tensor cores"
    fast = [flag for flag in FAST_CPU_FLAGS if flag in flags]
    if fast:
        return "bf16", f"the CPU has {fast[0]}"
    return "fp32", f"the CPU has neither {' nor '.join(FAST_CPU_FLAGS)}: bf16 would be emulated"


def resolve(dtype: str) -> tuple[str, str | None]:
    """(fp32|bf16, why): ``dtype`` itself unless it is ``auto``; for ``auto``, the override or
    what this machine's device is good at. ``why`` is None when there is nothing to tell the
    user (an explicit dtype, or the override they set). Call it once the stage knows its
    device."""
    if dtype != "auto":
        return dtype, None
    forced = os.environ.get(OVERRIDE, "").strip()
    if forced:
        if forced not in ("fp32", "bf16"):
            from .errors import UserError

            raise UserError(f"{OVERRIDE}={forced!r}: expected fp32 or bf16")
        return forced, None
    import torch

    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    return auto_dtype(cuda_capability=capability, flags=cpu_flags())
