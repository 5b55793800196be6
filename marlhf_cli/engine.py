"""DeepSpeed for every training stage: process group, ZeRO config, optimizer, schedule, engine.

Why one module: SFT, the reward model and PPO (which builds two engines, actor and critic,
from this same :func:`build_engine`) must agree on how a run is distributed. A stage calls

    init_distributed()                                   # once; single process needs no launcher
    engine = build_engine(module, config, lr=..., batch_size=..., total_steps=...)
    loss = ...; engine.backward(loss); engine.step()

and gets ZeRO 0-3, fp32 or bf16, torch's AdamW (DeepSpeed compiles none of its optimizer
ops that way), a warmup + cosine/linear schedule, and gloo on the CPU or NCCL on a GPU.
Checkpoints for resume and Hugging Face exports live in :mod:`marlhf_cli.checkpoints`.

Processes: a plain ``marlhf sft`` is one process; it sets the environment a launcher would
(``MASTER_ADDR``, a free ``MASTER_PORT``, ``RANK=0``...). Under ``torchrun`` or ``deepspeed``
the launcher's environment is used unchanged. ``--nproc N`` re-runs the same command under
``python -m torch.distributed.run --nproc_per_node N`` (:mod:`marlhf_cli.launch`).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import math
import os
import sys
import warnings
from typing import Any, Iterator

from . import precision
from .accepts import check_fields
from .config import TEMPLATES_DIR
from .errors import UserError
from .launch import SELF_LAUNCHED, free_port, launched

DEEPSPEED_TEMPLATES = TEMPLATES_DIR / "deepspeed"


# ---------------------------------------------------------------------------------------
# the process group


def _prefer_own_ninja() -> None:
    """Build DeepSpeed's op with the ninja installed beside this Python, as an activated venv would.

    ninja 1.11 (a system package) and 1.13 (pip's, in the venv) hash build commands
    differently, so each one rebuilds the cached op (30-90 s) after the other has run. A
    process started without the venv on PATH (a subprocess, an IDE, cron) would otherwise
    pick the system one and trigger that every time.
    """
    own_bin = os.path.dirname(sys.executable)
    if os.path.isfile(os.path.join(own_bin, "ninja")):
        path = os.environ.get("PATH", "")
        if path.split(os.pathsep)[0] != own_bin:
            os.environ["PATH"] = os.pathsep.join([own_bin, path]) if path else own_bin


def _import_deepspeed():
    """``deepspeed``, imported once, the way every stage needs it.

    Its accelerator probe is quieted on machines without CUDA (it picks the CPU anyway), and
    ``mlflow`` is hidden while it loads: DeepSpeed's autotuner, which marlhf never runs,
    imports mlflow whenever it is installed (``marlhf[trackers]``), a second of every
    stage's start. ``--report-to mlflow`` imports mlflow itself, before or after.
    """
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    _prefer_own_ninja()
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"
    hide_mlflow = "mlflow" not in sys.modules
    if hide_mlflow:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError
    try:
        import deepspeed
    finally:
        if hide_mlflow:
            del sys.modules["mlflow"]
    return deepspeed


def init_distributed(debug: bool = False) -> None:
    """Start the process group once (idempotent): gloo on the CPU, NCCL on GPUs."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if not launched():
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
        )
        os.environ[SELF_LAUNCHED] = "1"
    deepspeed = _import_deepspeed()
    if not debug:
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        deepspeed.utils.logger.setLevel(logging.WARNING)
        # DeepSpeed's ZeRO calls collectives torch has renamed; the notice repeats every step
        warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # keep stdout for what the user asked for (a failure still raises with its message)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink if not debug else sys.stdout), _without_shm_op():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=debug)
    atexit.register(shutdown_distributed)


def shutdown_distributed() -> None:
    """Tear the process group down as the stage's process ends (registered by
    :func:`init_distributed`): NCCL otherwise warns at every CUDA run's exit that
    ``destroy_process_group()`` was not called, and may leak its communicators."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _without_shm_op() -> contextlib.AbstractContextManager:
    """Start DeepSpeed's process group without its shared-memory all-reduce op.

    On a CPU, DeepSpeed JIT-compiles that C++ op when the process group starts (30-90 s on a
    fresh machine) although only its inference tensor-parallel all-reduce uses it; training's
    collectives go through torch.distributed. The build also holds a lock file in
    ~/.cache/torch_extensions: a process killed meanwhile (Ctrl-C in the first run) leaves it
    behind, and every later run waits on it forever without a word. Without the op DeepSpeed
    takes its own fallback (``shm_comm_op`` None), as on machines where the op cannot build.
    """
    import importlib
    from unittest import mock

    try:  # by module path: the attribute deepspeed.comm.torch is the torch package itself
        ds_torch = importlib.import_module("deepspeed.comm.torch")
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(ds_torch, "build_shm_op"):  # a DeepSpeed that no longer builds it at start-up
        return contextlib.nullcontext()
    return mock.patch.object(ds_torch, "build_shm_op", lambda: None)


def rank() -> int:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def is_main() -> bool:
    """Only rank 0 writes artifacts and prints progress."""
    return rank() == 0


def barrier() -> None:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized() and world_size() > 1:
        torch.distributed.barrier()


def all_reduce_sum(tensor):
    """Sum a tensor over all processes (in place on a copy; float64 keeps counts exact)."""
    import torch

    out = tensor.detach().clone()
    if torch.distributed.is_available() and torch.distributed.is_initialized() and world_size() > 1:
        device = out.device
        # gloo reduces CPU tensors only; NCCL needs them on the GPU
        target = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        out = out.to(target)
        torch.distributed.all_reduce(out)
        out = out.to(device)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every process."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world_size() == 1:
        return obj
    holder = [obj]
    torch.distributed.broadcast_object_list(holder, src=0)
    return holder[0]


# ---------------------------------------------------------------------------------------
# configuration


def micro_batch_size(batch_size: int, accumulation: int, processes: int) -> int:
    """Per-process micro batch: the global batch split over accumulation steps and processes."""
    parts = accumulation * processes
    if batch_size < parts or batch_size % parts:
        raise UserError(
            f"--batch-size {batch_size} must be a multiple of gradient_accumulation_steps x processes "
            f"({accumulation} x {processes} = {parts})"
        )
    return batch_size // parts


def check_engine_config(config: Any) -> None:
    """One-line errors for option values DeepSpeed would reject with a long traceback.

    ``marlhf`` checked each value when it resolved the options; this repeats it for configs
    built in code, and adds the checks that relate two options.
    """
    check_fields(config, ("zero_stage", "dtype", "lr_scheduler", "warmup_ratio", "gradient_accumulation_steps", "nproc"))
    if config.offload_params and config.zero_stage != 3:
        raise UserError("--offload-params needs --zero-stage 3")
    if config.offload_optimizer and config.zero_stage == 0:
        raise UserError("--offload-optimizer needs --zero-stage 1, 2 or 3")


def zero_stage_run(config: Any) -> int:
    """The ZeRO stage DeepSpeed runs: ``--zero-stage``, except 1 for 0 in bf16 with gradient
    accumulation. DeepSpeed adds bf16 gradients up in fp32 (the templates' ``data_types``)
    only under ZeRO, its BF16_Optimizer at stage 1; at stage 0 it would add them in bf16
    (~6e-3 relative error over 8 micro-batches, tests/test_engine.py). On one process stage 1
    holds what stage 0 holds."""
    bf16 = precision.resolve(config.dtype)[0] == "bf16"
    if bf16 and config.zero_stage == 0 and config.gradient_accumulation_steps > 1:
        return 1
    return config.zero_stage


def deepspeed_config(config: Any, *, batch_size: int, processes: int | None = None, hidden_size: int | None = None) -> dict:
    """The template for ``config.zero_stage`` (:func:`zero_stage_run`) with every ``"auto"`` filled in."""
    check_engine_config(config)
    processes = processes or world_size()
    template = json.loads((DEEPSPEED_TEMPLATES / f"zero{zero_stage_run(config)}.json").read_text(encoding="utf-8"))
    hidden = hidden_size or 1024
    values = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": micro_batch_size(batch_size, config.gradient_accumulation_steps, processes),
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "gradient_clipping": float(config.max_grad_norm or 0.0),
        "bf16.enabled": precision.resolve(config.dtype)[0] == "bf16",  # 'auto' as the models resolve it
        "zero_optimization.offload_optimizer.device": "cpu" if config.offload_optimizer else "none",
        "zero_optimization.offload_param.device": "cpu" if config.offload_params else "none",
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
    }
    return _fill(template, values)


def _fill(node: Any, values: dict[str, Any], prefix: str = "") -> Any:
    if isinstance(node, dict):
        return {key: _fill(value, values, f"{prefix}{key}.") for key, value in node.items()}
    if node == "auto":
        key = prefix.rstrip(".")
        if key not in values:
            raise UserError(f"DeepSpeed template: no value for 'auto' key '{key}'")
        return values[key]
    return node


# ---------------------------------------------------------------------------------------
# optimizer and schedule


def build_optimizer(module, *, lr: float, weight_decay: float):
    """torch AdamW; biases and norm weights (1-D tensors) get no weight decay.

    The fused kernel (one vectorised pass per tensor; what transformers' Trainer uses by
    default with torch >= 2.8) where torch has it for the parameters' dtype: on a CPU the
    per-tensor loop of elementwise ops took 6% of a PPO step at 16.5M parameters. Same
    update up to float rounding, deterministic on a CPU.
    """
    import torch

    decay, no_decay = [], []
    for param in module.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (RuntimeError, TypeError, ValueError):  # a dtype or device without the fused kernel
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


class WarmupDecay:
    """LR multiplier: linear warmup, then cosine or linear decay to 0 at ``total_steps``, or
    constant (1 after warmup).

    A class rather than a lambda so that the scheduler's state (a checkpoint) can be saved.
    """

    def __init__(self, total_steps: int, warmup_steps: int, kind: str):
        self.total_steps = max(1, int(total_steps))
        self.warmup_steps = max(0, int(warmup_steps))
        self.kind = kind

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer, *, kind: str, warmup_ratio: float, total_steps: int):
    import torch

    warmup = int(round(warmup_ratio * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupDecay(total_steps, warmup, kind))


# ---------------------------------------------------------------------------------------
# the engine


def build_engine(module, config: Any, *, lr: float, batch_size: int, total_steps: int):
    """A DeepSpeed engine training ``module`` with the stage's engine options.

    ``batch_size`` is the global batch (sequences or pairs per optimizer step). Call it once
    per trained module: PPO calls it twice (actor and critic) in the same process group.
    """
    init_distributed(getattr(config, "debug", False))
    deepspeed = _import_deepspeed()
    hidden = getattr(getattr(module, "config", None), "hidden_size", None)
    ds_config = deepspeed_config(config, batch_size=batch_size, hidden_size=hidden)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(module)
    optimizer = build_optimizer(module, lr=lr, weight_decay=config.weight_decay)
    scheduler = build_scheduler(
        optimizer, kind=config.lr_scheduler, warmup_ratio=config.warmup_ratio, total_steps=total_steps
    )
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    return engine


def enable_gradient_checkpointing(module) -> None:
    """Recompute activations in the backward pass (HF models, and wrappers holding one)."""
    target = module if hasattr(module, "gradient_checkpointing_enable") else None
    if target is None:
        target = next((m for m in module.modules() if hasattr(m, "gradient_checkpointing_enable")), None)
    if target is None:
        raise UserError(f"--gradient-checkpointing: {type(module).__name__} does not support it")
    target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if getattr(target, "config", None) is not None:
        target.config.use_cache = False


def zero_stage(engine) -> int:
    return int(engine.zero_optimization_stage()) if hasattr(engine, "zero_optimization_stage") else 0


@contextlib.contextmanager
def gathered_params(engine, modifier_rank: int | None = None) -> Iterator[None]:
    """Full parameters inside the block under ZeRO-3 (generation, export); a no-op otherwise."""
    if zero_stage(engine) != 3:
        yield
        return
    deepspeed = _import_deepspeed()
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=modifier_rank):
        yield


def release_prefetched(engine) -> None:
    """Under ZeRO-3, wait for and release every parameter a forward prefetched for the next one
    (DeepSpeed's ``empty_partition_cache``): gathering them all again, as an export does, fails
    on one still in flight ("Cannot partition a param in flight": dpo's policy, whose last
    forward is an evaluation's, left its tied embedding prefetched). A no-op otherwise."""
    if zero_stage(engine) == 3 and hasattr(engine, "empty_partition_cache"):
        engine.empty_partition_cache()


def current_lr(engine) -> float:
    return float(engine.optimizer.param_groups[0]["lr"]) if engine.optimizer is not None else 0.0


def grad_norm(engine) -> float | None:
    """The global gradient norm DeepSpeed measured at the last optimizer step (None if unknown)."""
    value = engine.get_global_grad_norm() if hasattr(engine, "get_global_grad_norm") else None
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def local_grad_norm(module) -> float:
    """Norm of the gradients held in ``param.grad`` (ZeRO-0 keeps whole, averaged gradients there).

    DeepSpeed reports no norm for ZeRO-0 without fp16, so the loop measures it before the
    optimizer step.
    """
    import torch

    grads = [p.grad.detach().float() for p in module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) for a reproducible run."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
