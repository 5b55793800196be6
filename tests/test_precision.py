"""--dtype auto (bf16 where the hardware multiplies bf16 fast) and what bf16 training keeps in fp32."""

from __future__ import annotations

import json

import pytest

from marlhf_cli import precision
from marlhf_cli.errors import UserError


@pytest.mark.parametrize(
    "capability, flags, expected",
    [
        ((8, 0), set(), "bf16"),  # A100: bf16 tensor cores, whatever the CPU
        ((9, 0), set(), "bf16"),  # H100
        ((7, 5), {"amx_bf16"}, "fp32"),  # T4: the GPU decides, not the host CPU
        (None, {"avx2", "amx_tile", "amx_bf16"}, "bf16"),  # Sapphire Rapids
        (None, {"avx2", "avx512f", "avx512_bf16"}, "bf16"),  # Zen 4, Cooper Lake
        (None, {"avx2", "avx512f"}, "fp32"),  # Zen 3, Ice Lake: bf16 matmuls are emulated
        (None, set(), "fp32"),  # no /proc/cpuinfo
    ],
)
def test_auto_picks_bf16_only_where_bf16_matmuls_are_fast(capability, flags, expected):
    dtype, why = precision.auto_dtype(cuda_capability=capability, flags=frozenset(flags))
    assert dtype == expected
    assert why  # the start-up line says why


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse avx512_bf16 amx_bf16\n\nprocessor\t: 1\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "sse", "avx512_bf16", "amx_bf16"}
    assert precision.cpu_flags(tmp_path / "absent") == frozenset()


def test_resolve_keeps_an_explicit_dtype_and_honours_the_override(monkeypatch):
    assert precision.resolve("fp32") == ("fp32", None)
    assert precision.resolve("bf16") == ("bf16", None)
    monkeypatch.setenv(precision.OVERRIDE, "bf16")
    assert precision.resolve("auto") == ("bf16", None)  # the user's own pin: nothing to tell
    monkeypatch.setenv(precision.OVERRIDE, "fp16")
    with pytest.raises(UserError, match="expected fp32 or bf16"):
        precision.resolve("auto")


def test_resolve_without_override_follows_this_machine(monkeypatch):
    monkeypatch.delenv(precision.OVERRIDE, raising=False)
    import torch

    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    assert precision.resolve("auto") == precision.auto_dtype(cuda_capability=capability, flags=precision.cpu_flags())


def test_auto_is_the_default_and_is_resolved_at_stage_start(tmp_path, monkeypatch):
    """The config says auto until the stage knows its device; run.json records what ran."""
    from marlhf_cli import config as config_module
    from marlhf_cli.train import common

    config = config_module.resolve("sft", preset="cpu-tiny", flags=dict(run_dir=str(tmp_path)))
    assert config.dtype == "auto"
    said = []
    monkeypatch.setattr(common, "say", said.append)
    monkeypatch.setattr(precision, "resolve", lambda dtype: ("bf16", "the CPU has amx_bf16"))
    common.resolve_dtype(config)
    assert config.dtype == "bf16"
    assert said == ["precision: bf16 (--dtype auto: the CPU has amx_bf16)"]


def _one_ppo_step(tmp_path, dtype):
    from marlhf_cli import config as config_module
    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.train import ppo

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say something about {i}:", "completion": " ok"}) + "\n" for i in range(40)))
    config = config_module.resolve("ppo", flags=dict(
        run_dir=str(tmp_path / dtype), policy="tiny", reward_model="tiny", dataset=str(data), dtype=dtype,
        rollout_batch_size=8, mini_batch_size=4, max_new_tokens=12, max_prompt_length=16,
        max_steps=1, eval_every=0, eval_prompts=0, save_every=0, seed=0,
    ))  # fmt: skip
    ppo.run(config)
    (row,) = [r for r in read_jsonl(tmp_path / dtype / "metrics" / "ppo-fixed5.jsonl") if r["split"] == "train"]
    return row


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_first_step_sees_no_kl_and_ratios_of_one(tmp_path, dtype):
    """Actor and reference are the same weights at step 0: their KL is 0, and the first
    minibatch's ratios are 1 (old log-probs come from the same computation as the training
    forward's: in bf16 a forward, in fp32 the sampling pass, equal to it to ~1e-5). The
    second minibatch follows an update, so only the first is bounded tightly: no ratio of
    the step leaves the clip range (clip_fraction 0), and approx_kl stays tiny."""
    row = _one_ppo_step(tmp_path, dtype)
    assert abs(row["kl"]) < 1e-3, row["kl"]
    assert row["clip_fraction"] == 0.0
    assert abs(row["approx_kl"]) < 1e-3, row["approx_kl"]


def test_bf16_engines_keep_fp32_master_weights():
    """Mixed precision as training frameworks mean it: the module computes in bf16, the
    optimizer updates fp32 copies (DeepSpeed's bf16 mode), so small updates are not lost to
    bf16 rounding."""
    import torch

    from marlhf_cli import config as config_module
    from marlhf_cli import engine as eng

    config = config_module.resolve("sft", flags=dict(dtype="bf16", model="tiny"))
    eng.init_distributed()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    engine = eng.build_engine(model, config, lr=1e-3, batch_size=8, total_steps=4)
    assert {p.dtype for p in engine.module.parameters()} == {torch.bfloat16}
    inner = engine.optimizer.optimizer  # the torch AdamW inside DeepSpeed's bf16 wrapper
    assert isinstance(inner, torch.optim.AdamW)
    masters = [p for group in inner.param_groups for p in group["params"]]
    assert len(masters) == 4 and {p.dtype for p in masters} == {torch.float32}
    engine.backward(engine(torch.randn(8, 8, dtype=torch.bfloat16)).float().pow(2).mean())
    engine.step()
    moments = [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v) and v.ndim]
    assert len(moments) == 8 and {v.dtype for v in moments} == {torch.float32}
