"""``marlhf ppo`` end to end on the tiny model: every termination rule and value function for
two steps, the artifacts they leave, the CLI with the cpu-tiny preset, and comparison."""

from __future__ import annotations

import json
import math

import pytest

from marlhf_cli import config as config_module
from marlhf_cli.artifacts import read_jsonl

# draw_plots: the runs' plots/ppo-<name>-*.png are checked
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "draw_plots")]

SMALL = dict(
    policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=4, mini_batch_size=2,
    max_new_tokens=8, max_prompt_length=48, max_steps=2, eval_every=1, eval_prompts=2, save_every=0,
    actor_lr=1e-3, critic_lr=1e-3,
)  # fmt: skip


def small_config(run_dir, **overrides):
    return config_module.resolve("ppo", flags={**SMALL, "run_dir": str(run_dir), **overrides})


def _parsing_available() -> bool:
    try:
        import spacy  # noqa: F401

        return spacy.util.is_package("en_core_web_sm") or bool(spacy.util.get_installed_models())
    except Exception:
        return False


CASES = [
    pytest.param(dict(termination="fixed", n=1), "vanilla", id="fixed-n1-vanilla"),
    pytest.param(dict(termination="fixed", n=3, value_function="unit"), "fixed3-unit", id="fixed3-unit"),
    pytest.param(dict(termination="randomized", value_function="position"), "randomized-position", id="randomized-position"),
    pytest.param(dict(termination="ppl", value_function="first"), "ppl-first", id="ppl-first"),
    pytest.param(  # the default pool of one parse worker (spawned)
        dict(termination="code", ratio="macro", whiten_advantages=True), "code-macro-ratio", id="code-macro"
    ),
    pytest.param(
        dict(termination="parsing", kl_estimator="k3", missing_eos_penalty=1.0, parse_workers=0), "parsing", id="parsing-inline",
        marks=pytest.mark.skipif(not _parsing_available(), reason="spaCy's English model is not installed"),
    ),
    pytest.param(dict(termination="fixed", n="inf"), "fixed-inf", id="fixed-inf"),
]


@pytest.mark.parametrize("overrides, name", CASES)
def test_two_steps_of_every_rule_and_value_function(tmp_path, overrides, name):
    from marlhf_cli.train import ppo

    metrics = ppo.run(small_config(tmp_path, **overrides))
    run = tmp_path
    rows = read_jsonl(run / "metrics" / f"ppo-{name}.jsonl")
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 1, 2]
    for row in train:
        for key in ("score", "reward", "kl", "policy_loss", "value_loss", "clip_fraction", "entropy",
                    "response_length", "generation_time", "training_time", "tokens_per_second",
                    "segment_length", "parse_fallbacks", "actor_lr"):  # fmt: skip
            assert key in row and row[key] is not None and math.isfinite(row[key]), key
        assert 1 <= row["segment_length"] <= row["response_length"]
        assert row["kl_k3"] >= 0  # the table's KL: the k3 estimate, never negative (k1 may be)
        assert row["explained_variance"] <= 1  # the critic's fit to its targets (NaN never: they vary)
        assert row["explained_variance_pooled"] <= 1  # the same over the last 10 steps' tokens
    assert train[0]["explained_variance"] == 0.0  # a zero value head: the constant 0 at step 1
    if name == "vanilla":
        assert all(r["segment_length"] == 1 for r in train)
    if name == "fixed-inf":
        assert all(r["segments_per_response"] == 1 for r in train)
    if name.startswith("fixed3"):
        assert all(r["segment_length"] <= 3 for r in train)
    if name == "parsing":  # a run labelled "parsing" really parsed: nothing fell back to fixed
        assert all(r["parse_fallbacks"] == 0 for r in train)
    samples = read_jsonl(run / "samples" / f"{name}.jsonl")
    assert len(samples) == 2 and set(samples[0]) >= {"prompt", "response", "score", "length"}
    assert (run / "ppo" / name / "config.json").is_file() and (run / "ppo" / name / "critic" / "config.json").is_file()
    for metric in ("score", "kl", "explained_variance_pooled"):
        assert (run / "plots" / f"ppo-{name}-{metric}.png").stat().st_size > 1000
    assert list((run / "tb" / f"ppo-{name}").iterdir())
    manifest = json.loads((run / "run.json").read_text())
    entry = manifest["stages"][f"ppo/{name}"]
    assert entry["status"] == "finished" and entry["metrics"]["steps"] == 2
    assert metrics["eval_score"] == evals[-1]["score"]


def test_trained_policy_loads_without_deepspeed(tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from marlhf_cli.train import ppo

    ppo.run(small_config(tmp_path, name="loadable", max_steps=1, eval_prompts=0))
    AutoModelForCausalLM.from_pretrained(tmp_path / "ppo" / "loadable")
    AutoModelForSequenceClassification.from_pretrained(tmp_path / "ppo" / "loadable" / "critic", num_labels=1)


def test_missing_sft_is_a_one_line_error_naming_the_command(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    result = CliRunner().invoke(app, ["ppo", "--run-dir", str(tmp_path), "--max-steps", "1"])
    assert result.exit_code == 2
    assert "marlhf sft" in result.output and "Traceback" not in result.output


def test_bad_options_are_one_line_errors(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    runner = CliRunner()
    for args, needle in (
        (["--termination", "sentences"], "--termination"),
        (["--rollout-batch-size", "6", "--mini-batch-size", "4"], "multiple of --mini-batch-size"),
        (["--value-function", "median"], "--value-function"),
    ):
        result = runner.invoke(app, ["ppo", "--run-dir", str(tmp_path), "--policy", "tiny", "--reward-model", "tiny", *args])
        assert result.exit_code == 2, result.output
        assert needle in result.output


def test_cli_with_cpu_tiny_preset_prints_the_final_table_and_compare_draws_runs(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    runner = CliRunner()
    base = ["ppo", "--preset", "cpu-tiny", "--run-dir", str(tmp_path), "--policy", "tiny", "--reward-model", "tiny",
            "--max-steps", "2", "--eval-every", "1", "--max-new-tokens", "6"]  # fmt: skip
    first = runner.invoke(app, base)
    assert first.exit_code == 0, first.output
    assert "final evaluation" in first.output and "fixed5" in first.output
    assert "MA-PPO" in first.output
    assert "critic from tiny with a zero value head" in first.output  # a random-init model has no trained head
    assert "critic" in first.output.split("final evaluation")[1] and " EV " in first.output  # the fit's column
    # the demo says nothing it need not: no template on plain-text data, no shortfall of its own eval prompts
    assert "chat template" not in first.output and "the eval split has" not in first.output
    assert [f"eval at step {s}:" in first.output for s in (0, 1, 2)] == [True] * 3  # one line per evaluation
    second = runner.invoke(app, [*base, "--termination", "fixed", "--n", "1", "--critic-warmup-steps", "1"])
    assert second.exit_code == 0, second.output
    assert "vanilla PPO" in second.output
    assert "(the first 1 step train it alone)" in second.output and "critic warm-up: steps 1-1 trained the critic alone" in second.output
    compared = runner.invoke(app, ["ppo", "--compare", "fixed5", "vanilla", "--run-dir", str(tmp_path)])
    assert compared.exit_code == 0, compared.output
    assert (tmp_path / "plots" / "ppo-compare-fixed5-vanilla.png").stat().st_size > 1000
    missing = runner.invoke(app, ["ppo", "--compare", "nosuchrun", "--run-dir", str(tmp_path)])
    assert missing.exit_code == 2 and "nosuchrun" in missing.output


def test_zero3_samples_with_a_whole_copy_kept_in_step_with_the_actor(tmp_path):
    """ZeRO-3 shards the actor; sampling uses a plain copy refreshed from the gathered shards."""
    import torch

    from marlhf_cli import engine as eng
    from marlhf_cli.train import ppo

    config = small_config(tmp_path, zero_stage=3, max_steps=1, eval_prompts=0)
    eng.init_distributed()
    models = ppo.build_models(config, ppo.plan_run(config), "tiny", "tiny", None)
    assert models.sampler.copy is not None
    records = [{"prompt": f"prompt number {i}"} for i in range(8)]
    ctx = ppo.Context(
        config=config, plan=ppo.plan_run(config), models=models,
        schedule=ppo.context.PromptSchedule(records, 4, 0),
        rollout=ppo.experience.RolloutSettings.from_config(config, forward_batch_size=2),
        update=ppo.update.UpdateSettings(mini_batch_size=2, micro_batch_size=2, temperature=config.temperature),
    )  # fmt: skip
    metrics = ppo.ppo_step(ctx, 0)
    # policy = reference at step 0: the KL is zero up to rounding (the old log-probs come from
    # the KV-cached sampling pass, the reference's from one full forward: equal within 2e-5)
    assert math.isfinite(metrics["policy_loss"]) and abs(metrics["kl"]) < 1e-4
    copy = models.sampler.model()
    with eng.gathered_params(models.actor):
        actor = {name: p.detach().clone() for name, p in models.actor.module.named_parameters()}
    changed = False
    for name, param in copy.named_parameters():
        assert torch.equal(param, actor[name]), name
        changed |= not torch.equal(param, models.reference.get_parameter(name))
    assert changed, "the copy should hold the updated weights, not the initial ones"


def test_apps_reward_plugs_in_and_the_critic_starts_from_the_policy(tmp_path):
    from marlhf_cli.train import ppo, sources

    config = small_config(tmp_path, dataset="apps", reward_model=None, max_steps=1, eval_prompts=0, max_new_tokens=6)
    assert sources.reward_specs(config) == ["apps"] and sources.model_sources(config, None) == ("tiny", "tiny")
    ppo.run(config)
    entry = json.loads((tmp_path / "run.json").read_text())["stages"]["ppo/fixed5"]
    assert entry["inputs"]["reward"] == "apps-tests"
    assert -1.0 <= entry["metrics"]["score"] <= 1.0
