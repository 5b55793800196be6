"""``marlhf ppo --advantage mc``: the estimator registry, the options, continuations sampled
through the KV-cached sampler (seeded per row, budgeted, scored as responses), the estimator on
a real rollout (one segment = RLOO of the score), and the stage end to end (no critic anywhere,
generated-token counts, --compare --x-axis tokens)."""

from __future__ import annotations

import itertools
import json
import math
import shlex
from types import SimpleNamespace

import pytest
import torch

from marlhf_cli import accepts, config as config_module
from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.errors import UserError
from marlhf_cli.macro import boundary_plan, rloo_advantages, sequence_to_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(tmp_path, **flags):
    base = dict(policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=2, mini_batch_size=4,
                max_new_tokens=8, max_prompt_length=48, max_steps=2, eval_every=1, eval_prompts=2, save_every=0,
                actor_lr=1e-3, run_dir=str(tmp_path), advantage="mc", samples_per_prompt=2)  # fmt: skip
    return config_module.resolve("ppo", flags={**base, **flags})


# ---------------------------------------------------------------------------------------
# the registry and the options


def test_the_registry_holds_every_estimator_and_the_option_lists_agree():
    from marlhf_cli.macro import ADVANTAGE_ESTIMATORS
    from marlhf_cli.train import flags
    from marlhf_cli.train.ppo import estimators

    assert tuple(estimators.ESTIMATORS) == ADVANTAGE_ESTIMATORS == accepts.ADVANTAGES
    every = (estimators.RULE_OPTIONS + estimators.CRITIC_OPTIONS + estimators.GROUP_OPTIONS + estimators.MC_OPTIONS
             + estimators.TREE_OPTIONS)  # fmt: skip
    assert flags.ESTIMATOR_FIELDS == every
    table = {name: (e.critic, e.segments, e.kl_in_loss, e.group_size) for name, e in estimators.ESTIMATORS.items()}
    assert table == {"gae": (True, True, False, 1), "rloo": (False, False, False, 4), "grpo": (False, False, True, 4),
                     "mc": (False, True, True, 4), "tree": (False, True, False, 4)}  # fmt: skip
    assert [name for name, e in estimators.ESTIMATORS.items() if e.draws or e.leaves] == ["tree"]
    for entry in estimators.ESTIMATORS.values():
        assert set(entry.reads) <= set(every)
    assert set(estimators.ESTIMATORS["mc"].reads) == {"termination", "n", "cutoff", "samples_per_prompt", "mc_rollouts", "mc_max_boundaries"}
    # every estimator takes --samples-per-prompt but the tree, whose K^D leaves are its group
    assert [name for name, e in estimators.ESTIMATORS.items() if "samples_per_prompt" not in e.reads] == ["tree"]
    with pytest.raises(ValueError, match="registered twice"):
        estimators.register("mc", **{f: None for f in ("critic", "segments", "kl_in_loss", "group_size", "reads", "describe", "what_it_is")})(print)


def _check_flags(config, flags):
    from marlhf_cli.train.ppo import settings

    settings.plan_run(config, given_flags=flags)


def test_flags_an_estimator_does_not_read_are_one_line_errors(tmp_path):
    from marlhf_cli.train.ppo import settings

    mc = _config(tmp_path)
    settings.plan_run(mc, given_flags=["--termination", "--n", "--cutoff", "--mc-rollouts", "--mc-max-boundaries"])
    with pytest.raises(UserError, match=r"--advantage mc trains no critic: --value-function, --critic-lr do not apply \(drop them, or use --advantage gae\)"):
        settings.plan_run(mc, given_flags=["--n", "--value-function", "--critic-lr"])
    for advantage in ("gae", "rloo"):
        with pytest.raises(UserError, match=r"--mc-rollouts does not apply \(drop it, or use --advantage mc\)"):
            _check_flags(_config(tmp_path, advantage=advantage, samples_per_prompt=None), ["--mc-rollouts"])
    # rloo and grpo say what they said before
    with pytest.raises(UserError, match="--advantage grpo trains no critic and assigns credit per response: --termination does not apply"):
        _check_flags(_config(tmp_path, advantage="grpo"), ["--termination"])


def test_names_options_and_start_up_line(tmp_path):
    from marlhf_cli.train import ppo

    assert ppo.run_name(_config(tmp_path, termination="fixed", n=8, samples_per_prompt=None, mini_batch_size=8)) == "mc-fixed8"
    assert ppo.run_name(_config(tmp_path, termination="ppl", mc_rollouts=4, mc_max_boundaries=3)) == "mc-ppl-m4-b3-k2"
    assert ppo.run_name(_config(tmp_path, termination="fixed", n=1, ratio="macro")) == "mc-fixed1-macro-ratio-k2"
    config = _config(tmp_path, termination="fixed", n=8, mc_max_boundaries=2)
    line = ppo.plan_run(config).describe(config)
    assert "fixed n=8, at most 2 boundaries per response" in line and "2 continuations per boundary" in line
    assert "KL loss k3 x 0.05" in line
    with pytest.raises(UserError, match="at least 2"):
        ppo.plan_run(_config(tmp_path, samples_per_prompt=1))
    with pytest.raises(UserError, match="--mc-rollouts must be 1 or more"):
        _config(tmp_path, mc_rollouts=0)


@pytest.mark.parametrize(
    "termination, n, m, b, k",
    list(itertools.product(("fixed", "ppl", "code"), ("1", "8", "inf"), ("2", "4"), (None, "0", "3"), ("2", "4"))),
)
def test_the_hint_for_an_mc_name_makes_a_run_of_that_name(termination, n, m, b, k):
    from marlhf_cli.train import ppo
    from marlhf_cli.train.ppo import report

    flags = dict(advantage="mc", termination=termination, n=n, mc_rollouts=m, samples_per_prompt=k)
    if b is not None:
        flags["mc_max_boundaries"] = b
    name = ppo.run_name(config_module.resolve("ppo", flags=flags))
    hint = report.options_for(name)
    words = shlex.split(hint)
    again = {flag[2:].replace("-", "_"): value for flag, value in zip(words[::2], words[1::2])}
    assert ppo.run_name(config_module.resolve("ppo", flags=again)) == name


# ---------------------------------------------------------------------------------------
# continuations on the tiny model


from test_critic_free import models  # noqa: E402,F401  (the tiny tokenizer, actor and reference)


class RecordingReward:
    """Score = the fraction of even token ids in the response; remembers every batch."""

    name = "even-ids"

    def __init__(self):
        self.batches = []

    def __call__(self, batch):
        self.batches.append(batch)
        ids, mask = batch.response_ids.cpu(), batch.response_mask.cpu().bool()
        return ((ids % 2 == 0) & mask).sum(1).float() / mask.sum(1).clamp(min=1).float()


def _rollout(models, reward, *, max_new_tokens=10, kl_coef=0.0, prompts=None):
    from marlhf_cli.train.ppo.experience import RolloutSettings, make_experience

    torch.manual_seed(0)
    settings = RolloutSettings(max_new_tokens=max_new_tokens, max_prompt_length=32, kl_coef=kl_coef, top_k=0, temperature=0.9)
    prompts = prompts or ["first prompt"] * 2 + ["the second prompt is longer than that"] * 2
    exp = make_experience(models["actor"], models["reference"], None, reward, models["tokenizer"], prompts, [{}] * len(prompts), settings)
    return exp, settings


def test_a_row_draws_the_same_tokens_alone_or_in_a_batch(models):
    """Per-row random numbers: a row's continuation does not depend on the batch around it
    (other prefixes of other lengths, so other left padding)."""
    from marlhf_cli.generation.texts import tokenize_prompts
    from marlhf_cli.generation import SamplingParams, sample

    tok = models["tokenizer"]
    texts = ["a short one", "a much longer prefix that needs far more tokens than the others", "mid length text"]
    ids, mask = tokenize_prompts(tok, texts, 64, "cpu")
    width = 12
    uniforms = torch.rand((3, width), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=width)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    together = sample(models["actor"], ids, mask, params, eos_token_id=eos, pad_token_id=pad, uniforms=uniforms)
    for row in range(3):
        alone_ids, alone_mask = tokenize_prompts(tok, [texts[row]], 64, "cpu")
        alone = sample(models["actor"], alone_ids, alone_mask, params, eos_token_id=eos, pad_token_id=pad, uniforms=uniforms[row : row + 1])
        assert torch.equal(alone[0], together[row, : alone.shape[1]]), row
    # the global generator is not touched, and other numbers give other tokens
    state = torch.get_rng_state()
    other = sample(models["actor"], ids, mask, params, eos_token_id=eos, pad_token_id=pad, uniforms=1 - uniforms)
    assert torch.equal(torch.get_rng_state(), state) and not torch.equal(other, together)


def test_repeats_share_the_prefill_and_draw_what_repeated_prompts_draw(models):
    from marlhf_cli.generation.texts import tokenize_prompts
    from marlhf_cli.generation import SamplingParams, sample

    tok = models["tokenizer"]
    ids, mask = tokenize_prompts(tok, ["a short one", "a longer prompt than the first one"], 64, "cpu")
    uniforms = torch.rand((6, 10), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    params, special = SamplingParams(1.0, 0, 1.0, 10), dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    shared = sample(models["actor"], ids, mask, params, uniforms=uniforms, repeats=3, **special)
    separate = sample(models["actor"], ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), params, uniforms=uniforms, **special)
    assert shared.shape[0] == 6 and torch.equal(shared, separate)
    assert not torch.equal(shared[0], shared[1])  # the copies draw their own tokens


def test_budgets_end_rows_early(models):
    from marlhf_cli.generation.texts import tokenize_prompts
    from marlhf_cli.generation import SamplingParams, sample

    tok = models["tokenizer"]
    ids, mask = tokenize_prompts(tok, ["one", "two"], 16, "cpu")
    out = sample(models["actor"], ids, mask, SamplingParams(1.0, 0, 1.0, 6), eos_token_id=tok.eos_token_id,
                 pad_token_id=tok.pad_token_id, budgets=torch.tensor([2, 6]))  # fmt: skip
    assert out.shape[1] <= 6 and (out[0, 2:] == tok.pad_token_id).all()


def test_continuations_extend_their_prefix_within_the_budget_and_are_scored_as_responses(models):
    from marlhf_cli.train.ppo.continuations import continuation_seed, sample_continuations
    from marlhf_cli.generation import SamplingParams, sample

    reward = RecordingReward()
    exp, settings = _rollout(models, reward)
    segment_ids = torch.div(torch.arange(exp.mask.shape[1]), 3, rounding_mode="floor").expand_as(exp.mask) * exp.mask
    plan = boundary_plan(segment_ids, exp.mask)
    assert len(plan) > 0
    seeds = [continuation_seed(1, 0, row, pos, r) for row, pos in zip(plan.rows.tolist(), plan.positions.tolist()) for r in range(2)]
    reward.batches.clear()
    got = sample_continuations(models["actor"], models["tokenizer"], reward, exp, plan, settings, rollouts=2, seeds=seeds,
                               rows_per_batch=64)  # fmt: skip
    assert got.scores.shape == (len(plan), 2)
    (batch,) = reward.batches
    assert batch.response_mask.sum(1).max() <= settings.max_new_tokens
    tokens = 0
    for index, (row, position) in enumerate(zip(plan.rows.tolist(), plan.positions.tolist())):
        for rollout in range(2):
            c = index * 2 + rollout
            length = int(batch.response_mask[c].sum())
            # the scored response is the prefix, then the continuation; the prompt is the response's
            assert torch.equal(batch.response_ids[c, :position], exp.response_ids[row, :position])
            assert batch.prompts[c] == exp.prompts[row]
            assert torch.equal(batch.sequences[c, : exp.prompt_length], exp.sequences[row, : exp.prompt_length])
            # the continuation is what the sampler draws from that prefix with that seed, alone
            prefix = torch.cat([exp.sequences[row, : exp.prompt_length][exp.attention_mask[row, : exp.prompt_length].bool()],
                                exp.response_ids[row, :position]])[None]  # fmt: skip
            budget = settings.max_new_tokens - position
            numbers = torch.rand(budget, generator=torch.Generator().manual_seed(seeds[c]), dtype=torch.float64)[None]
            alone = sample(models["actor"], prefix, torch.ones_like(prefix), SamplingParams(0.9, 0, 1.0, budget),
                           eos_token_id=2, pad_token_id=2, uniforms=numbers)  # fmt: skip
            assert torch.equal(batch.response_ids[c, position:length], alone[0, : length - position])
            assert length - position <= budget
            tokens += length - position
            expected = reward(SimpleNamespace(response_ids=batch.response_ids[c : c + 1], response_mask=batch.response_mask[c : c + 1]))
            assert float(got.scores[index, rollout]) == pytest.approx(float(expected[0]))
    assert got.tokens == tokens
    # chunking the continuations differently changes nothing
    again = sample_continuations(models["actor"], models["tokenizer"], RecordingReward(), exp, plan, settings, rollouts=2,
                                 seeds=seeds, rows_per_batch=3)  # fmt: skip
    assert torch.equal(again.scores, got.scores) and again.tokens == got.tokens


def test_a_continuation_without_eos_gets_the_missing_eos_penalty_like_a_response(models):
    from marlhf_cli.train.ppo.continuations import sample_continuations

    exp, settings = _rollout(models, RecordingReward(), max_new_tokens=6)
    settings.missing_eos_penalty, settings.reward_clip = 10.0, 0.5
    segment_ids = (torch.arange(exp.mask.shape[1]) >= 3).long().expand_as(exp.mask) * exp.mask
    plan = boundary_plan(segment_ids, exp.mask)
    got = sample_continuations(models["actor"], models["tokenizer"], RecordingReward(), exp, plan, settings, rollouts=1,
                               seeds=list(range(len(plan))), rows_per_batch=8)  # fmt: skip
    # the random-init tiny model practically never draws EOS in 3 tokens: clipped, then penalised
    assert ((got.scores >= -10.0) & (got.scores <= -9.5)).all()


def _inputs(models, config, reward, rollout, step=0, numbers=None):
    from marlhf_cli.train.ppo.estimators import CreditInputs
    from marlhf_cli.train.ppo.settings import plan_run

    models_ns = SimpleNamespace(tokenizer=models["tokenizer"], reward=reward, sampler=None)
    plan = plan_run(config)
    ctx = SimpleNamespace(config=config, plan=plan, models=models_ns, rule=plan.rule, rollout=rollout, executor=None)
    return CreditInputs(ctx, step, numbers or list(range(4)), models["actor"], None)


def test_mc_with_one_segment_is_rloo_of_the_score_and_samples_nothing(models, tmp_path):
    """``fixed --n inf``: advantage = RLOO's leave-one-out advantage of the placed score. It
    differs from ``--advantage rloo`` only in the KL: rloo subtracts beta * sum k1 from R, mc
    adds beta * k3 to the loss."""
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.estimators import ESTIMATORS

    config = _config(tmp_path, termination="fixed", n="inf")
    exp, settings = _rollout(models, RecordingReward(), kl_coef=0.1)
    ESTIMATORS["mc"].assign(exp, _inputs(models, config, RecordingReward(), settings))
    assert exp.continuations == 0 and exp.continuation_tokens == 0 and exp.returns is None
    assert torch.equal(exp.advantages, sequence_to_tokens(rloo_advantages(exp.scores, 2), exp.mask))
    kl_in_reward = exp.advantages.clone()
    credit.assign_group_credit(exp, "rloo", 2)  # rloo: R = score - 0.1 * sum KL
    sequence = (exp.rewards * exp.mask).sum(1)
    assert torch.allclose(exp.advantages, sequence_to_tokens(rloo_advantages(sequence, 2), exp.mask), atol=1e-6)
    assert not torch.allclose(exp.advantages, kl_in_reward)


def test_mc_on_a_rollout_matches_the_definition(models, tmp_path):
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.continuations import continuation_seed
    from marlhf_cli.train.ppo.estimators import ESTIMATORS

    config = _config(tmp_path, termination="fixed", n=3, mc_rollouts=3, mc_max_boundaries=2, seed=7)
    exp, settings = _rollout(models, RecordingReward())
    reward = RecordingReward()
    numbers = [40, 41, 42, 43]
    ESTIMATORS["mc"].assign(exp, _inputs(models, config, reward, settings, step=5, numbers=numbers))
    lengths = exp.mask.sum(1).tolist()
    assert exp.segment_stats.segments == sum(min(math.ceil(n / 3), 3) for n in lengths)
    plan = boundary_plan(exp.segment_ids, exp.mask)
    assert exp.continuations == len(plan) * 3 and exp.continuation_tokens > 0
    # a boundary's value: the mean of the scores of its 3 continuations (seeded from the
    # response's global number, the step and the boundary's position)
    scores = torch.cat([reward(batch) for batch in list(reward.batches)]).reshape(len(plan), 3).double().mean(1)
    for row in range(4):
        own = plan.positions[plan.rows == row].tolist()
        values = [float(exp.scores[row ^ 1]), *scores[plan.rows == row].tolist(), float(exp.scores[row])]
        starts = [0, *own, lengths[row]]
        for k in range(len(starts) - 1):
            segment = exp.advantages[row, starts[k] : starts[k + 1]]
            assert torch.allclose(segment, torch.full_like(segment, values[k + 1] - values[k]), atol=1e-6)
    # the seeds of the batch's continuations are the ones its (response, boundary, rollout) derive
    from marlhf_cli.train.ppo.continuations import sample_continuations

    seeds = [continuation_seed(7, 5, numbers[r], p, m) for r, p in zip(plan.rows.tolist(), plan.positions.tolist()) for m in range(3)]
    direct = sample_continuations(models["actor"], models["tokenizer"], RecordingReward(), exp, plan, settings, rollouts=3,
                                  seeds=seeds, rows_per_batch=5)  # fmt: skip
    assert torch.allclose(direct.scores.double().mean(1), scores)


# ---------------------------------------------------------------------------------------
# a fourth estimator is one function


def test_a_new_estimator_is_one_registered_function(tmp_path, monkeypatch):
    from marlhf_cli.train import ppo
    from marlhf_cli.train.ppo import estimators

    seen = {}

    def zero(experience, inputs):
        seen["step"] = inputs.step
        experience.advantages = torch.zeros_like(experience.rewards)
        experience.segment_ids = torch.zeros_like(experience.mask)
        experience.segment_stats = ppo.credit.SegmentStats(experience.batch_size, experience.batch_size, int(experience.mask.sum()), 0)

    monkeypatch.setitem(estimators.ESTIMATORS, "zero", estimators.Estimator(
        "zero", zero, critic=False, segments=False, kl_in_loss=True, group_size=2, reads=(), what_it_is="",
        describe=lambda config, rule, k: "zero advantages"))  # fmt: skip
    config = _config(tmp_path, advantage="rloo")
    config.advantage = "zero"
    models = ppo.build_models(config, ppo.plan_run(config), "tiny", "tiny", None)
    assert models.critic is None
    ctx = ppo.make_context(config, ppo.plan_run(config), models, [{"prompt": f"prompt {i}"} for i in range(4)])
    metrics = ppo.ppo_step(ctx, 3)
    assert seen == {"step": 3} and metrics["advantage"] == 0 and "kl_loss" in metrics
    assert ctx.plan.describe(config) == "zero advantages"


# ---------------------------------------------------------------------------------------
# end to end


@pytest.mark.slow
def test_cpu_tiny_preset_trains_with_mc_and_reports_generated_tokens(tmp_path):
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    runner = CliRunner()
    args = ["ppo", "--preset", "cpu-tiny", "--advantage", "mc", "--termination", "fixed", "--n", "8",
            "--run-dir", str(tmp_path), "--policy", "tiny", "--reward-model", "tiny", "--max-steps", "2",
            "--eval-every", "1", "--eval-prompts", "2", "--max-new-tokens", "12", "--rollout-batch-size", "2",
            "--save-every", "1"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Monte-Carlo segment advantages" in " ".join(result.output.split()) and "gen tokens" in result.output
    out = tmp_path / "ppo" / "mc-fixed8"
    assert (out / "config.json").is_file() and not (out / "critic").exists()
    assert not (out / "checkpoints" / "critic").exists()
    AutoModelForCausalLM.from_pretrained(out)
    train = [r for r in read_jsonl(tmp_path / "metrics" / "ppo-mc-fixed8.jsonl") if r["split"] == "train"]
    for row in train:
        # 8 responses of 12 tokens, fixed 8: one inner boundary at 8, 2 continuations of at most 4 tokens
        assert row["responses"] == 8 and row["continuations"] == 16
        assert 0 < row["continuation_tokens"] <= 16 * 4
        assert row["generated_tokens"] == row["response_tokens"] + row["continuation_tokens"]
        assert "value_loss" not in row and "kl_loss" in row and math.isfinite(row["policy_loss"])
    entry = json.loads((tmp_path / "run.json").read_text())["stages"]["ppo/mc-fixed8"]
    assert entry["status"] == "finished" and "Monte-Carlo" in entry["inputs"]["credit_assignment"]

    by_tokens = runner.invoke(app, ["ppo", "--compare", "mc-fixed8", "--x-axis", "tokens", "--run-dir", str(tmp_path)])
    assert by_tokens.exit_code == 0, by_tokens.output
    assert (tmp_path / "plots" / "ppo-compare-mc-fixed8-tokens.png").stat().st_size > 1000
    total = sum(r["generated_tokens"] for r in train)
    assert f"{total:,.0f}" in by_tokens.output
    # metrics written before the counts existed cannot go on a token axis
    old = tmp_path / "metrics" / "ppo-old.jsonl"
    old.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "generated_tokens"}) + "\n" for r in train))
    refused = runner.invoke(app, ["ppo", "--compare", "old", "--x-axis", "tokens", "--run-dir", str(tmp_path)])
    assert refused.exit_code == 2 and "use --x-axis step" in refused.output
    alone = runner.invoke(app, ["ppo", "--x-axis", "tokens", "--run-dir", str(tmp_path)])
    assert alone.exit_code == 2 and "--x-axis goes with --compare" in alone.output


@pytest.mark.slow
def test_mc_on_two_processes_counts_every_continuation(tmp_path):
    """Each process continues its own responses (its groups are whole); the step's counts are
    summed over both processes."""
    import subprocess
    import sys

    from test_ppo_resume import environment

    argv = [sys.executable, "-m", "marlhf_cli.cli", "ppo", "--run-dir", str(tmp_path), "--policy", "tiny",
            "--reward-model", "tiny", "--advantage", "mc", "--samples-per-prompt", "2", "--termination", "fixed",
            "--rollout-batch-size", "2", "--mini-batch-size", "2", "--max-new-tokens", "8",
            "--max-prompt-length", "48", "--max-steps", "2", "--save-every", "0", "--eval-prompts", "0",
            "--nproc", "2", "--zero-stage", "2"]  # fmt: skip  (fixed n = 5: torchrun would take "--n" for its own)
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 processes" in done.stderr
    train = [r for r in read_jsonl(tmp_path / "metrics" / "ppo-mc-fixed5-k2.jsonl") if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:
        assert row["responses"] == 4.0
        # 8-token responses cut every 5 tokens: one boundary at 5 (none where a response ends
        # sooner), 2 continuations of at most 3 tokens
        assert 0 < row["continuations"] <= 4 * 2 and row["continuations"] % 2 == 0
        assert row["continuation_tokens"] <= 4 * 2 * 3
        assert row["generated_tokens"] == row["response_tokens"] + row["continuation_tokens"]


def test_the_start_up_line_says_how_many_continuations_a_step_may_sample(tmp_path):
    """ppl on cpu-tiny once took 975 s without a word: the start-up line bounds the step's
    continuations (responses x boundaries x M) and names the cap when a fine rule has none."""
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.estimators import mc_cost

    fixed = _config(tmp_path, termination="fixed", n=3, max_new_tokens=8)
    assert mc_cost(fixed, credit.make_rule(fixed), 8) == (
        "mc: up to 32 continuations per step (8 responses x at most 2 boundaries x 2 rollouts), each up to 8 tokens, "
        "beside the 8 responses")  # fmt: skip
    ppl = _config(tmp_path, termination="ppl", max_new_tokens=24, mc_rollouts=3)
    line = mc_cost(ppl, credit.make_rule(ppl), 32)
    assert line.startswith("mc: up to 2,208 continuations per step (32 responses x at most 23 boundaries x 3 rollouts)")
    assert line.endswith("--mc-max-boundaries B caps the boundaries ppl makes per response")
    capped = _config(tmp_path, termination="ppl", mc_max_boundaries=4)
    assert "at most 4 boundaries" in mc_cost(capped, credit.make_rule(capped), 8) and "caps" not in mc_cost(capped, credit.make_rule(capped), 8)
    from marlhf_cli import config as config_module

    assert config_module.resolve("ppo", preset="cpu-tiny").mc_max_boundaries == 4  # the demo preset caps them
    from marlhf_cli.train import ppo

    # a cap that cannot bind (fixed 8 makes 2 inner boundaries in 24 tokens) stays out of the name
    assert ppo.run_name(_config(tmp_path, termination="fixed", n=8, max_new_tokens=24, mc_max_boundaries=4)) == "mc-fixed8-k2"
    assert ppo.run_name(_config(tmp_path, termination="fixed", n=8, max_new_tokens=24, mc_max_boundaries=1)) == "mc-fixed8-b1-k2"
