"""DeepSpeed engine: config templates, schedule, relaunch (launch.py), checkpoints, and multi-process ZeRO.

The multi-process test runs ``marlhf sft --nproc 2`` (torchrun, gloo, CPU) with ZeRO-2 and
ZeRO-3 and compares the loss trajectory with one process doing the same global batch.
"""

from __future__ import annotations

import copy

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _toy_prefs import write_toy_preferences
from marlhf_cli import engine as eng
from marlhf_cli import launch
from marlhf_cli.config import EngineConfig, SFTConfig
from marlhf_cli.errors import UserError


def _engine_config(**overrides) -> SFTConfig:
    return SFTConfig(**overrides)


@pytest.fixture(scope="module")
def toy_preferences(tmp_path_factory) -> Path:
    return write_toy_preferences(tmp_path_factory.mktemp("toy") / "prefs.jsonl")


# ---------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_templates_fill_every_auto(stage):
    config = _engine_config(zero_stage=stage, gradient_accumulation_steps=2, max_grad_norm=0.5)
    ds = eng.deepspeed_config(config, batch_size=16, processes=2, hidden_size=64)
    assert "auto" not in json.dumps(ds)
    assert ds["train_batch_size"] == 16
    assert ds["train_micro_batch_size_per_gpu"] == 4
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["gradient_clipping"] == 0.5
    assert ds["zero_optimization"]["stage"] == stage
    assert ds["bf16"]["enabled"] is False


def test_bf16_and_offload_are_filled():
    config = _engine_config(zero_stage=3, dtype="bf16", offload_optimizer=True, offload_params=True)
    ds = eng.deepspeed_config(config, batch_size=4, processes=1)
    assert ds["bf16"]["enabled"] is True
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"


@pytest.mark.parametrize(
    "overrides, batch, message",
    [
        (dict(dtype="fp16"), 4, "does not run on the CPU"),
        (dict(zero_stage=4), 4, "--zero-stage"),
        (dict(offload_params=True, zero_stage=2), 4, "--offload-params needs --zero-stage 3"),
        (dict(offload_optimizer=True), 4, "--offload-optimizer needs"),
        (dict(lr_scheduler="step"), 4, "--lr-scheduler"),
        (dict(gradient_accumulation_steps=3), 4, "multiple of gradient_accumulation_steps x processes"),
    ],
)
def test_bad_engine_options_are_one_line_user_errors(overrides, batch, message):
    with pytest.raises(UserError) as err:
        eng.deepspeed_config(_engine_config(**overrides), batch_size=batch, processes=1)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_engine_config_fields_are_shared_by_training_stages():
    from marlhf_cli.config import PPOConfig, RMConfig

    names = set(EngineConfig.__dataclass_fields__)
    for cls in (SFTConfig, RMConfig, PPOConfig):
        assert names <= set(cls.__dataclass_fields__)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_warmup_then_decay_to_zero(kind):
    schedule = eng.WarmupDecay(total_steps=10, warmup_steps=2, kind=kind)
    values = [schedule(step) for step in range(11)]
    assert values[0] < values[1] < values[2] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[2:], values[3:]))
    assert values[10] == pytest.approx(0.0, abs=1e-12)
    if kind == "cosine":
        assert values[6] == pytest.approx(0.5)


def test_constant_schedule_is_flat_after_warmup_whatever_the_length():
    short, long = (eng.WarmupDecay(total_steps=n, warmup_steps=2, kind="constant") for n in (5, 50))
    assert [short(s) for s in range(5)] == [long(s) for s in range(5)] == [1 / 3, 2 / 3, 1.0, 1.0, 1.0]


def test_optimizer_is_torch_adamw_without_decay_on_norms_and_biases():
    import torch

    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = eng.build_optimizer(module, lr=1e-3, weight_decay=0.1)
    assert type(optimizer) is torch.optim.AdamW
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.ndim == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.ndim == 1 for p in plain["params"])
    assert optimizer.defaults["fused"]  # the fused kernel on a CPU too (PPO's engine steps, issue 14)
    twin = copy.deepcopy(module)
    groups = [{"params": [p for p in twin.parameters() if p.ndim == n], "weight_decay": wd} for n, wd in ((2, 0.1), (1, 0.0))]
    reference = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=False)
    for param in [*module.parameters(), *twin.parameters()]:
        param.grad = torch.ones_like(param)
    optimizer.step()
    reference.step()
    for mine, theirs in zip(module.parameters(), twin.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-6)  # the same AdamW update as the unfused loop


# ---------------------------------------------------------------------------------------
# processes


def test_nproc_relaunch_command_strips_nproc():
    argv = ["sft", "--nproc", "2", "--zero-stage", "3", "--nproc=4", "--model", "tiny"]
    assert launch.strip_nproc(argv) == ["sft", "--zero-stage", "3", "--model", "tiny"]
    command = launch.relaunch_command(2)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc_per_node") + 1] == "2"
    assert command[-2:] == ["-m", "marlhf_cli.cli"]


def test_nproc_relaunch_passes_the_arguments_past_torchruns_parser(monkeypatch):
    """torchrun's parser took `--n 3` after the module for an abbreviation of its --nnodes
    (ambiguous option): the arguments go through the environment instead."""
    from torch.distributed.run import get_args_parser

    argv = ["ppo", "--n", "3", "--nproc", "2", "--max-steps", "2"]
    calls = []
    monkeypatch.setattr(launch, "launched", lambda: False)

    class Launcher:  # stands in for subprocess.Popen: records what torchrun would be given
        def __init__(self, command, env):
            calls.append((command, env))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Launcher)
    assert launch.maybe_relaunch(2, argv) == 0
    (command, env), = calls
    parsed = get_args_parser().parse_args(command[3:])  # what torchrun reads: no error
    assert parsed.module and parsed.training_script == "marlhf_cli.cli" and parsed.training_script_args == []
    monkeypatch.setenv(launch.RELAUNCH_ARGV, env[launch.RELAUNCH_ARGV])
    assert launch.relaunched_argv() == ["ppo", "--n", "3", "--max-steps", "2"]
    assert launch.RELAUNCH_ARGV not in os.environ and launch.relaunched_argv() is None


def test_single_process_variables_do_not_leak_into_children(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", launch.SELF_LAUNCHED):
        monkeypatch.delenv(name, raising=False)
    assert not launch.launched()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert launch.launched()  # a real launcher's variables
    monkeypatch.setenv(launch.SELF_LAUNCHED, "1")
    assert not launch.launched()  # ours
    assert "RANK" not in launch.launcher_free_env()
    assert launch.maybe_relaunch(1) is None


def test_starting_the_process_group_compiles_no_deepspeed_op(tmp_path):
    """DeepSpeed would JIT-compile its shared-memory op here (30-90 s on a fresh machine, and a
    lock file that hangs every later run if this one is killed during the build)."""
    env = launch.launcher_free_env()
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "extensions")
    code = ("import torch; from marlhf_cli import engine; engine.init_distributed(); "
            "print(torch.distributed.is_initialized(), torch.distributed.get_world_size())")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "1"]
    built = sorted(p.name for p in (tmp_path / "extensions").rglob("*")) if (tmp_path / "extensions").exists() else []
    assert built == [], built


# ---------------------------------------------------------------------------------------
# checkpoints (in this process, one rank)


def _tiny_engine(seed=0, **overrides):
    import torch

    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    config = _engine_config(warmup_ratio=0.25, **overrides)
    return eng.build_engine(module, config, lr=1e-2, batch_size=4, total_steps=8)


def _train(engine, steps, start=0):
    import torch

    for step in range(start, start + steps):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(4, 8, generator=generator)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()


@pytest.mark.parametrize("stage", [0, 3])
def test_checkpoint_resume_matches_uninterrupted(tmp_path, stage):
    """Save at step 3, train on; a fresh engine that loads step 3 ends with the same weights."""
    import torch

    from marlhf_cli import checkpoints

    straight = _tiny_engine(zero_stage=stage)
    _train(straight, 3)
    checkpoints.save_checkpoint(straight, tmp_path / "ckpt", 3, {"position": 3})
    _train(straight, 3, start=3)

    resumed = _tiny_engine(seed=99, zero_stage=stage)  # different init: the checkpoint must overwrite it
    found = checkpoints.latest_checkpoint(tmp_path / "ckpt")
    assert found is not None and found.name == "step-000003"
    state = checkpoints.load_checkpoint(resumed, found)
    assert state["position"] == 3 and state["step"] == 3
    assert resumed.lr_scheduler.last_epoch == 3
    _train(resumed, 3, start=3)
    with eng.gathered_params(straight), eng.gathered_params(resumed):
        for a, b in zip(straight.module.parameters(), resumed.module.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_checkpoints_are_complete_or_ignored(tmp_path):
    from marlhf_cli import checkpoints

    engine = _tiny_engine()
    root = tmp_path / "ckpt"
    checkpoints.save_checkpoint(engine, root, 2, {})
    checkpoints.save_checkpoint(engine, root, 4, {}, keep=1)
    assert [p.name for p in checkpoints.list_checkpoints(root)] == ["step-000004"]
    assert (root / "latest").read_text().strip() == "step-000004"
    # a half-written checkpoint (killed before trainer_state.json) and a staging folder are ignored
    (root / "step-000006").mkdir()
    (root / ".tmp-step-000008" / "step-000008").mkdir(parents=True)
    assert checkpoints.latest_checkpoint(root).name == "step-000004"
    # 'latest' lost (killed between rename and pointer update): the highest complete one wins
    (root / "latest").unlink()
    assert checkpoints.latest_checkpoint(root).name == "step-000004"


# ---------------------------------------------------------------------------------------
# several processes: ZeRO-2 and ZeRO-3 over torchrun + gloo


def _child_env() -> dict:
    env = launch.launcher_free_env()
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return env


def _sft(run_dir: Path, data: Path, *extra: str, in_process: bool = False) -> list[dict]:
    command = [
        sys.executable, "-m", "marlhf_cli.cli", "sft", "--model", "tiny", "--dataset", str(data),
        "--run-dir", str(run_dir), "--batch-size", "4", "--max-steps", "4", "--lr", "3e-3",
        "--max-prompt-length", "24", "--max-response-length", "12", "--eval-every", "2",
        "--eval-records", "6", "--save-every", "0", "--seed", "3", *extra,
    ]  # fmt: skip
    if in_process:  # no second interpreter start-up (imports take most of a tiny run)
        from typer.testing import CliRunner

        from marlhf_cli.cli import app

        result = CliRunner().invoke(app, command[3:])
        assert result.exit_code == 0, result.output
    else:
        done = subprocess.run(command, env=_child_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics" / "sft.jsonl").read_text().splitlines()]
    return rows


@pytest.mark.slow
def test_two_processes_zero2_zero3_match_one_process(tmp_path, toy_preferences):
    """Same global batch of 4 sequences, split three ways, same losses step by step:
    1 process x micro-batch 4 == 1 process x 2 accumulation steps x 2 == 2 processes x 2
    (ZeRO-2 and ZeRO-3 over torchrun + gloo, started by ``--nproc 2``)."""
    single = _sft(tmp_path / "one", toy_preferences, in_process=True)
    train = [r["loss"] for r in single if r["split"] == "train"]
    held_out = [r["loss"] for r in single if r["split"] == "eval"]
    assert len(train) == 4 and len(held_out) == 2
    assert train[-1] < train[0]  # it learns, so the comparison is not between constants
    accumulated = _sft(tmp_path / "accumulated", toy_preferences, "--gradient-accumulation-steps", "2", in_process=True)
    assert [r["loss"] for r in accumulated if r["split"] == "train"] == pytest.approx(train, rel=1e-4, abs=1e-4)
    for stage in ("2", "3"):
        rows = _sft(tmp_path / f"zero{stage}", toy_preferences, "--nproc", "2", "--zero-stage", stage)
        other_train = [r["loss"] for r in rows if r["split"] == "train"]
        other_eval = [r["loss"] for r in rows if r["split"] == "eval"]
        assert other_train == pytest.approx(train, rel=1e-4, abs=1e-4), f"ZeRO-{stage}"
        assert other_eval == pytest.approx(held_out, rel=1e-4, abs=1e-4), f"ZeRO-{stage}"
        manifest = json.loads((tmp_path / f"zero{stage}" / "run.json").read_text())
        assert manifest["stages"]["sft"]["inputs"]["processes"] == 2
        assert math.isfinite(manifest["stages"]["sft"]["metrics"]["eval_loss"])


def test_the_process_group_is_torn_down_when_the_stage_process_ends(tmp_path):
    """NCCL warned at every CUDA run's exit that destroy_process_group() was not called: the
    group a stage starts is destroyed at exit (checked here with gloo, the same call)."""
    code = (
        "import atexit, torch\n"
        "atexit.register(lambda: print('at exit:', torch.distributed.is_initialized()))  # runs last\n"
        "from marlhf_cli import engine\n"
        "engine.init_distributed()\n"
        "print('started:', torch.distributed.is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["started: True", "at exit: False"]


@pytest.mark.parametrize("stage", [0, 2])
def test_bf16_gradients_add_up_over_micro_batches_in_fp32(stage):
    """bf16 is mixed precision: over 8 micro-batches DeepSpeed adds the bf16 gradients in fp32
    (templates' data_types; stage 0 runs as stage 1, where DeepSpeed can). In bf16 the sum was
    ~6e-3 off the exact one; here it is what adding the same gradients in float64 gives."""
    import torch
    from deepspeed.utils import safe_get_full_grad

    from marlhf_cli import config as config_module
    from marlhf_cli.models import load_causal_lm

    steps = 8
    config = config_module.resolve("sft", flags=dict(dtype="bf16", zero_stage=stage, batch_size=steps,
                                                     gradient_accumulation_steps=steps))  # fmt: skip
    torch.manual_seed(0)
    model = load_causal_lm("tiny", dtype="bf16")
    reference = copy.deepcopy(model)
    engine = eng.build_engine(model, config, lr=1e-3, batch_size=steps, total_steps=2)
    batches = [torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(i)) for i in range(steps)]
    for ids in batches:
        engine.backward(engine(input_ids=ids, labels=ids).loss)
    exact = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in reference.named_parameters()}
    for ids in batches:  # the same bf16 gradients, added in float64
        reference.zero_grad()
        (reference(input_ids=ids, labels=ids).loss / steps).backward()
        for name, p in reference.named_parameters():
            exact[name] += p.grad.double()
    for name, p in engine.module.named_parameters():
        got = safe_get_full_grad(p).double()
        assert float((got - exact[name]).abs().max()) <= 1e-5 * float(exact[name].abs().max()), name


def test_every_template_accumulates_in_fp32_where_deepspeed_can():
    for stage in (1, 2, 3):
        config = _engine_config(zero_stage=stage, dtype="bf16")
        assert eng.deepspeed_config(config, batch_size=8, processes=1)["data_types"] == {"grad_accum_dtype": "fp32"}
    plain = eng.deepspeed_config(_engine_config(zero_stage=0, dtype="bf16"), batch_size=8, processes=1)
    assert plain["zero_optimization"]["stage"] == 0 and "data_types" not in plain  # no accumulation: stays stage 0
    promoted = eng.deepspeed_config(_engine_config(zero_stage=0, dtype="bf16", gradient_accumulation_steps=2), batch_size=8, processes=1)
    assert promoted["zero_optimization"]["stage"] == 1 and promoted["data_types"] == {"grad_accum_dtype": "fp32"}
    fp32 = eng.deepspeed_config(_engine_config(zero_stage=0, dtype="fp32", gradient_accumulation_steps=2), batch_size=8, processes=1)
    assert fp32["zero_optimization"]["stage"] == 0
