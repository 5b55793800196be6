"""The CUDA paths: sft, rm and every PPO estimator in bf16, ZeRO 0-3 on one GPU, the KV-cached
samplers (eager and compiled) against a full forward and each other, the compiled sampler's
CUDA graphs (recorded, replayed, reading the weights an optimizer step wrote), and --resume.
``pytest -m gpu`` (benchmarks/gpu/suite.sh tests). On CUDA ``--generation auto`` is the
compiled sampler, so every PPO run here samples through it.

Every test is skipped where torch sees no GPU, so the default test run pays nothing for
them. ``MARLHF_GPU_TESTS_ON_CPU=1`` runs them on the CPU instead: the suite's dry run, which
executes every line here once before a GPU is ever lent (bf16 works on a CPU, slowly).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
import subprocess
from pathlib import Path

import pytest
import torch

from _toy_prefs import sft_then_rm, write_toy_preferences
from marlhf_cli import config as config_module
from marlhf_cli.artifacts import read_jsonl

ON_CPU = os.environ.get("MARLHF_GPU_TESTS_ON_CPU") == "1"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (CUDA or ON_CPU), reason="needs a GPU (MARLHF_GPU_TESTS_ON_CPU=1 runs these on the CPU)"),
]

FINITE = ("score", "reward", "kl", "policy_loss", "entropy", "response_length", "step_time", "tokens_per_second")


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return write_toy_preferences(tmp_path_factory.mktemp("toy") / "prefs.jsonl")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, toy) -> Path:
    """``marlhf sft`` then ``marlhf rm`` in bf16 on the toy preferences, as a user runs them."""
    return sft_then_rm(tmp_path_factory.mktemp("run"), toy, "--dtype", "bf16")


def _used_the_gpu() -> None:
    if CUDA:  # the run happened in this process: its engines allocated GPU memory
        assert torch.cuda.max_memory_allocated() > 0


def test_sft_and_rm_learn_in_bf16(pipeline):
    sft = [r for r in read_jsonl(pipeline / "metrics" / "sft.jsonl") if r["split"] == "train"]
    assert len(sft) == 8 and all(math.isfinite(r["loss"]) for r in sft)
    assert sft[-1]["loss"] < sft[0]["loss"]
    held_out = [r for r in read_jsonl(pipeline / "metrics" / "rm.jsonl") if r["split"] == "eval"]
    assert held_out[-1]["accuracy"] >= 0.9  # "good" over "bad" learned, as in fp32 (test_rm.py)
    stages = json.loads((pipeline / "run.json").read_text())["stages"]
    assert stages["sft"]["config"]["dtype"] == stages["rm"]["config"]["dtype"] == "bf16"
    _used_the_gpu()


def _ppo(run_dir: Path, toy: Path, name: str, **overrides) -> list[dict]:
    from marlhf_cli.train import ppo

    flags = dict(run_dir=str(run_dir), dataset=str(toy), name=name, dtype="bf16", rollout_batch_size=4,
                 mini_batch_size=4, max_new_tokens=16, max_prompt_length=32, max_steps=2, eval_every=2,
                 eval_prompts=2, save_every=0, actor_lr=1e-4, critic_lr=1e-4, seed=0)  # fmt: skip
    ppo.run(config_module.resolve("ppo", flags={**flags, **overrides}))
    return [r for r in read_jsonl(run_dir / "metrics" / f"ppo-{name}.jsonl") if r["split"] == "train"]


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("vanilla", dict(termination="fixed", n=1)),
        ("fixed5", dict(termination="fixed", n=5)),
        ("ppl", dict(termination="ppl")),
        ("rloo", dict(advantage="rloo", samples_per_prompt=2)),
        ("grpo", dict(advantage="grpo", samples_per_prompt=2)),
        ("tree", dict(advantage="tree", termination="fixed", n=5)),  # K = 2, D = 2: 4 leaves per prompt
    ],
)
def test_ppo_estimators_in_bf16(pipeline, toy, name, overrides):
    """Two steps from the run's own sft/ and rm/ in bf16, evaluation and export included."""
    rows = _ppo(pipeline, toy, name, **overrides)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in FINITE:
            assert math.isfinite(row[key]), key
    # in bf16 the old log-probs come from a forward shaped like the reference's: at step 1 the
    # policy is the reference, so the KL is exactly zero (the KV-cached pass would be ~0.06 off)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    if name == "vanilla":
        assert all(r["segment_length"] == 1 for r in rows)
    if name == "fixed5":
        assert all(1 < r["segment_length"] <= 5 for r in rows)
    if name in ("rloo", "grpo"):
        assert all(r["responses"] == 8 for r in rows)  # 4 prompts x K=2
        assert not (pipeline / "ppo" / name / "critic").exists()
    if name == "tree":
        assert all(r["responses"] == 16 and r["shared_prefix_tokens"] > 0 for r in rows)
    assert len(read_jsonl(pipeline / "samples" / f"{name}.jsonl")) == 2
    assert (pipeline / "ppo" / name / "config.json").is_file()
    _used_the_gpu()


def test_zero_stages_0_to_3_give_the_same_first_step(pipeline, toy):
    """ZeRO partitions optimizer state (1), gradients (2) and parameters (3) differently; on one
    GPU the first step's samples and losses are the same for every stage."""
    first = {}
    for stage in (0, 1, 2, 3):
        rows = _ppo(pipeline, toy, f"zero{stage}", zero_stage=stage, max_steps=1, eval_every=0, eval_prompts=0)
        first[stage] = rows[0]
        assert (pipeline / "ppo" / f"zero{stage}" / "config.json").is_file()  # ZeRO-3: gathered for export
    for stage in (1, 2, 3):
        assert first[stage]["response_length"] == first[0]["response_length"], stage
        assert first[stage]["score"] == pytest.approx(first[0]["score"], abs=1e-3), stage
        assert first[stage]["policy_loss"] == pytest.approx(first[0]["policy_loss"], rel=0.05, abs=1e-3), stage
    _used_the_gpu()


def test_kv_cached_sampler_log_probs_match_a_full_forward(record_property):
    """The samplers' log-probs (the old log-probs of an fp32 run) against one full forward over
    [prompt | response], on SmolLM2-135M's shape: to float rounding in fp32, within bf16's
    rounding in bf16 (where the rollout takes the old log-probs from a forward instead); the
    compiled sampler's gap within twice the eager one's, measured in the same run."""
    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.train.forward import policy_forward
    from marlhf_cli.generation.texts import tokenize_prompts
    from marlhf_cli.generation import SamplingParams, response_mask, sample

    tokenizer = load_tokenizer("random:smollm2-135m", padding_side="left")
    prompts = ["x", "a much longer prompt than the first one", "third one"]
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, 32, DEVICE)
    params = SamplingParams(0.7, 0, 1.0, 24)
    model = load_causal_lm("random:smollm2-135m").to(DEVICE).eval()
    for (dtype, tolerance), generation in itertools.product(((torch.float32, 1e-3), (torch.bfloat16, 0.25)), ("eager", "compiled")):
        model.to(dtype)
        params.generation = generation
        torch.manual_seed(3)
        ids, logp = sample(model, prompt_ids, prompt_mask, params, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, with_logprobs=True)  # fmt: skip
        torch.manual_seed(3)
        again = sample(model, prompt_ids, prompt_mask, params, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert torch.equal(ids, again)  # asking for log-probs changes no token
        mask, _ = response_mask(ids, tokenizer.eos_token_id)
        sequences, attention = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, mask], 1)
        with torch.no_grad():
            full, _ = policy_forward(model, sequences, attention, prompt_ids.shape[1], 0.7)
        gap = (logp - full).abs()[mask.bool()]
        name = f"{generation}_{str(dtype).split('.')[-1]}"
        record_property(f"{name}_max_abs_gap", float(gap.max()))
        record_property(f"{name}_mean_abs_gap", float(gap.mean()))
        assert float(gap.max()) < tolerance, (name, float(gap.max()))
        assert float(gap.mean()) < tolerance / 5, (name, float(gap.mean()))
        if generation == "eager":
            eager_gap = float(gap.max())
        else:  # the static cache's rounding stays within the eager sampler's (H200: bf16 max 0.0028)
            assert float(gap.max()) <= 2 * eager_gap + 1e-3, (name, float(gap.max()), eager_gap)
    _used_the_gpu()


def test_the_compiled_sampler_replays_one_graph_and_draws_the_eager_tokens(record_property):
    """fp32 at SmolLM2-135M's shape, 8 prompts of several lengths, top-k and top-p: the step is
    recorded as a CUDA graph and replayed (counted, not inferred from the absence of an error);
    given the same random numbers, the compiled and eager samplers draw the same tokens at
    >= 99% of positions, with log-probs within 1e-5 where they agree. The milliseconds per token
    of each are recorded, not asserted (benchmarks/decode_cost.py measures speed)."""
    from marlhf_cli.models import load_causal_lm, load_tokenizer
    from marlhf_cli.generation import compiled as compiled_sampling
    from marlhf_cli.generation.texts import tokenize_prompts
    from marlhf_cli.generation import SamplingParams, sample

    tokenizer = load_tokenizer("random:smollm2-135m", padding_side="left")
    prompts = ["x", "a much longer prompt than the first one", "third one", "four", "and a fifth prompt here",
               "six", "the seventh", "eight is the last of them all"]  # fmt: skip
    prompt_ids, prompt_mask = tokenize_prompts(tokenizer, prompts, 32, DEVICE)
    model = load_causal_lm("random:smollm2-135m").to(DEVICE).eval()
    tokens = 48
    uniforms = torch.rand((len(prompts), tokens), generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(DEVICE)
    out = {}
    for generation in ("eager", "compiled"):
        params = SamplingParams(0.8, 50, 0.95, tokens, generation=generation)

        def call():
            return sample(model, prompt_ids, prompt_mask, params, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, with_logprobs=True, uniforms=uniforms)  # fmt: skip

        call()  # the compiled sampler makes and records its bucket here
        if CUDA:
            torch.cuda.synchronize()
        started = time.perf_counter()
        out[generation] = call()
        if CUDA:
            torch.cuda.synchronize()
        record_property(f"{generation}_ms_per_token", 1000 * (time.perf_counter() - started) / out[generation][0].shape[1])
    (ids_e, logp_e), (ids_c, logp_c) = out["eager"], out["compiled"]
    assert ids_e.shape == ids_c.shape
    same = ids_e == ids_c
    record_property("token_agreement", float(same.float().mean()))
    record_property("max_abs_gap_where_equal", float((logp_e - logp_c).abs()[same].max()))
    assert float(same.float().mean()) >= 0.99
    assert torch.allclose(logp_e[same], logp_c[same], atol=1e-5, rtol=0)
    (bucket,) = compiled_sampling.sampler_for(model).buckets.values()
    if CUDA:
        assert bucket.graph is not None and bucket.replays >= 2 * (ids_c.shape[1] - 1)  # both calls replayed it
    _used_the_gpu()


def test_every_architecture_replays_its_recorded_step(record_property):
    """Each architecture on static_cache.SUPPORTED_MODEL_TYPES, tiny, fp32, on the GPU: its
    step recorded and replayed (counted), the eager tokens drawn; every one that fell back is
    named (the record property ``fell_back``) and fails the test."""
    from test_compiled_sampling import CASES, _agree, _both, tiny_of

    from marlhf_cli.generation import compiled as compiled_sampling, static_cache

    fell_back = {}
    for model_type in static_cache.SUPPORTED_MODEL_TYPES:
        model = tiny_of(model_type).to(DEVICE)
        eager, compiled = _both(model, dict(CASES["plain"], max_new_tokens=24), repeats=2, **_on_device())
        sampler = compiled_sampling.sampler_for(model)
        if sampler.unfit is not None or (CUDA and compiled_sampling.replays(model) == 0):
            fell_back[model_type] = sampler.unfit or "nothing replayed"
        elif not CUDA:
            assert _agree(eager, compiled) >= 0.99, model_type
    record_property("fell_back", json.dumps(fell_back))
    assert not fell_back, fell_back


def _on_device() -> dict:
    from test_compiled_sampling import MASK, PROMPT

    return {"prompt": PROMPT.to(DEVICE), "mask": MASK.to(DEVICE)}


@pytest.mark.parametrize("dtype, zero_stage", [("fp32", 0), ("bf16", 0), ("bf16", 2)])
def test_the_recorded_step_reads_the_weights_an_optimizer_step_wrote(dtype, zero_stage):
    """A DeepSpeed engine's optimizer step, then the compiled sampler's next call: no new
    recording (the weights were written in place) and the log-probs of the new weights, told
    apart from the old ones' (tests/test_compiled_sampling.py runs the same on a CPU)."""
    from test_compiled_sampling import engine_step_then_sample

    from marlhf_cli.generation import compiled as compiled_sampling

    got = engine_step_then_sample(DEVICE, dtype, zero_stage)
    assert got["made_after"] == got["made_before"] == 1
    gap = (got["sampled"] - got["fresh"]).abs()
    tolerance = (1e-4, 1e-5) if dtype == "fp32" else (0.25, 0.05)  # max, mean: fp32 rounding; bf16's, as above
    assert float(gap.max()) < tolerance[0] and float(gap.mean()) < tolerance[1]
    assert float((got["stale"] - got["fresh"]).abs().mean()) > max(20 * float(gap.mean()), 0.05)
    if CUDA:
        (bucket,) = compiled_sampling.sampler_for(got["engine"]).buckets.values()
        assert bucket.graph is not None and bucket.replays > 0
    _used_the_gpu()


def test_sigkill_then_resume_in_bf16(tmp_path):
    """SIGKILL after the step-2 checkpoint, then --resume: the resumed run logs the rows the
    uninterrupted one does (test_ppo_resume.py's run, in bf16 and on the GPU)."""
    from test_ppo_resume import NAME, command, environment, kill_once_saved, metrics

    extra = ("--dtype", "bf16", "--max-steps", "4")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(command(straight, *extra), env=environment(), capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    proc = subprocess.Popen(command(killed, *extra), env=environment(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    kill_once_saved(proc, killed / "ppo" / NAME / "checkpoints" / "critic" / "latest")
    resumed = subprocess.run(command(killed, *extra, "--resume"), env=environment(), capture_output=True, text=True, timeout=500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    want, got = metrics(straight), metrics(killed)
    assert [(r["split"], r["step"]) for r in got] == [(r["split"], r["step"]) for r in want]
    for a, b in zip(got, want):
        numbers = {k for k, v in b.items() if isinstance(v, float)}
        assert {k: a[k] for k in numbers} == pytest.approx({k: b[k] for k in numbers}, rel=1e-3, abs=1e-4), (a["split"], a["step"])
