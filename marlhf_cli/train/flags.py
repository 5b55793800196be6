"""Command-line options of the training stages (sft, rm, and the engine options PPO reuses).

Every option defaults to None ("not given"), so the config's precedence holds: a flag wins
over ``--config`` and ``--preset``, which win over the stage's defaults. Defaults shown in
the help are the config dataclasses' (``marlhf_cli/config.py``). Importing this module
costs nothing beyond typer.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer


from ..options import opt as _opt


# data ------------------------------------------------------------------------------------
DatasetOption = Annotated[
    Optional[str],
    _opt("--dataset", "tldr, hh, webgpt, or a local .jsonl/.json/.parquet file (TRL's prompt/chosen/rejected). [default: tldr]"),
]
DataFileOption = Annotated[
    Optional[str],
    _opt("--data-file", "A local file in --dataset's format (e.g. Anthropic's raw HH-RLHF jsonl) instead of the hub."),
]
StrictOption = Annotated[
    Optional[bool],
    typer.Option("--strict/--no-strict", help="Stop at the first bad row instead of skipping and counting it. [default: no-strict]", show_default=False),
]
MaxRecordsOption = Annotated[Optional[int], _opt("--max-records", "Use at most this many training records (quick runs).")]
EvalRecordsOption = Annotated[
    Optional[int], _opt("--eval-records", "Held-out records used per evaluation (0 turns evaluation off). [default: 500]")
]

# schedule --------------------------------------------------------------------------------
LrOption = Annotated[Optional[float], _opt("--lr", "Peak learning rate (AdamW). [default: sft 2e-5, rm 1e-5]")]
BatchSizeOption = Annotated[
    Optional[int],
    _opt("--batch-size", "Global batch per optimizer step (sequences for sft, pairs for rm), over all processes and accumulation steps. [default: 64]"),
]
EpochsOption = Annotated[Optional[int], _opt("--epochs", "Passes over the training split (ignored when --max-steps is set). [default: 1]")]
MaxStepsOption = Annotated[Optional[int], _opt("--max-steps", "Stop after this many optimizer steps (cycling the data if needed).")]
MaxPromptOption = Annotated[
    Optional[int], _opt("--max-prompt-length", "Prompt tokens kept (the end of longer prompts). [default: 512]")
]
MaxResponseOption = Annotated[
    Optional[int], _opt("--max-response-length", "Response tokens kept (longer responses are cut and get no EOS). [default: 512]")
]
EvalEveryOption = Annotated[Optional[int], _opt("--eval-every", "Evaluate on held-out data every N steps (and at the end); 0 = only at the end. [default: 100]")]
SaveEveryOption = Annotated[Optional[int], _opt("--save-every", "Write a resume checkpoint every N steps; 0 = never. [default: 200]")]
ResumeOption = Annotated[
    Optional[bool],
    typer.Option("--resume/--no-resume", help="Continue from the stage's last checkpoint in the run directory (model, optimizer, schedule, data position, RNG).", show_default=False),
]
PackingOption = Annotated[
    Optional[bool],
    typer.Option("--packing/--no-packing", help="Pack examples into blocks of max-prompt + max-response tokens (less padding). [default: no-packing]", show_default=False),
]

# engine ----------------------------------------------------------------------------------
ZeroStageOption = Annotated[Optional[int], _opt("--zero-stage", "DeepSpeed ZeRO stage 0, 1, 2 or 3. [default: 0]")]
DtypeOption = Annotated[Optional[str], _opt("--dtype", "Training precision: fp32 or bf16 (fp16 does not run on the CPU). [default: fp32]")]
GradAccumOption = Annotated[
    Optional[int], _opt("--gradient-accumulation-steps", "Micro-batches per optimizer step in each process. [default: 1]")
]
GradCkptOption = Annotated[
    Optional[bool],
    typer.Option("--gradient-checkpointing/--no-gradient-checkpointing", help="Recompute activations in the backward pass (less memory, slower). [default: off]", show_default=False),
]
OffloadOptimizerOption = Annotated[
    Optional[bool],
    typer.Option("--offload-optimizer/--no-offload-optimizer", help="Keep optimizer states in CPU memory (ZeRO 1-3). [default: off]", show_default=False),
]
OffloadParamsOption = Annotated[
    Optional[bool],
    typer.Option("--offload-params/--no-offload-params", help="Keep parameters in CPU memory (ZeRO-3). [default: off]", show_default=False),
]
SchedulerOption = Annotated[Optional[str], _opt("--lr-scheduler", "Decay after warmup: cosine or linear (to 0 at the last step). [default: cosine]")]
WarmupOption = Annotated[Optional[float], _opt("--warmup-ratio", "Share of the steps spent warming the learning rate up linearly. [default: 0]")]
WeightDecayOption = Annotated[Optional[float], _opt("--weight-decay", "AdamW weight decay (not applied to biases and norms). [default: 0]")]
MaxGradNormOption = Annotated[Optional[float], _opt("--max-grad-norm", "Clip the global gradient norm to this value; 0 = no clipping. [default: 1.0]")]
NprocOption = Annotated[
    Optional[int],
    _opt("--nproc", "Processes on this machine: N > 1 re-runs the command under torchrun (gloo on CPU, NCCL on GPU). [default: 1]"),
]

TrainableLayersOption = Annotated[
    Optional[int],
    _opt("--trainable-layers", "Train only the top N transformer blocks, the final norm and the head (fast on a CPU). [default: all]"),
]
