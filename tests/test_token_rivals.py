"""The strongest token-level rivals of macro actions through the stage (decoupled GAE and the
length-adaptive lambda), the paper's Figure 11 metrics, the reference left out where nothing
reads it, and their option checks on the real command line. The estimators' arithmetic is in
test_decoupled_gae.py; the within-step explained variance in test_critic_start.py."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from marlhf_cli import config as config_module
from marlhf_cli.artifacts import read_jsonl

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(tmp_path, **flags):
    base = dict(policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=2, mini_batch_size=2,
                max_new_tokens=8, max_prompt_length=48, max_steps=2, eval_every=0, eval_prompts=0, save_every=0,
                actor_lr=1e-3, critic_lr=1e-3, dtype="fp32", run_dir=str(tmp_path))  # fmt: skip
    return config_module.resolve("ppo", flags={**base, **flags})


# ---------------------------------------------------------------------------------------
# the options, on the command line


@pytest.mark.parametrize("flags, words", [
    (["--advantage", "tree", "--samples-per-prompt", "8"], "--samples-per-prompt does not apply"),
    (["--advantage", "grpo", "--lam", "0.9"], "--lam does not apply"),
    (["--advantage", "mc", "--critic-lambda", "1"], "--critic-lambda does not apply"),
    (["--lam-alpha", "0.1"], "--lam-alpha is the alpha of --lam adaptive"),
    (["--lam", "often"], "--lam must be a number in [0, 1], or adaptive"),
])  # fmt: skip
def test_options_that_cannot_apply_are_one_line_errors(tmp_path, flags, words):
    """Through the command line, as a user types them (the tree's --samples-per-prompt was
    once dropped on the way to the check): exit 2, one line, before any model loads."""
    from marlhf_cli.cli import app

    result = CliRunner().invoke(app, ["ppo", "--policy", "tiny", "--reward-model", "tiny", "--run-dir", str(tmp_path), *flags])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output
    assert not (tmp_path / "ppo").exists()


def test_lambda_options_resolve_from_flags_and_files(tmp_path):
    assert _config(tmp_path, lam="adaptive").lam == "adaptive"
    assert _config(tmp_path, lam="0.9").lam == 0.9 and _config(tmp_path, lam=1).lam == 1.0
    config = _config(tmp_path, critic_lambda=1, lam_alpha=0.2)
    assert (config.critic_lambda, config.lam_alpha) == (1.0, 0.2)
    assert _config(tmp_path).critic_lambda is None  # --lam's


# ---------------------------------------------------------------------------------------
# credit assignment: the per-response lambdas, in segments


def _experience(lengths: list[int], time: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1] * n + [0] * (time - n) for n in lengths])
    return SimpleNamespace(
        mask=mask, response_ids=torch.randint(3, 100, mask.shape, generator=generator),
        ref_logp=-torch.rand(mask.shape, generator=generator), rewards=torch.randn(mask.shape, generator=generator),
        values=torch.randn(mask.shape, generator=generator),
    )  # fmt: skip


@pytest.mark.parametrize("n", [1, 5])
def test_adaptive_lambda_counts_the_responses_segments(n):
    from marlhf_cli.macro import TerminationRule, adaptive_lambda, lengths_to_segment_ids, macro_advantages
    from marlhf_cli.train.ppo import credit

    lengths = [40, 12, 64, 0]
    experience = _experience(lengths, 64)
    credit.assign_credit(experience, TerminationRule("fixed", n=n), lam="adaptive", lam_alpha=0.1, critic_lam=1.0)
    steps = torch.tensor([math.ceil(length / n) for length in lengths])
    assert experience.lambdas.tolist() == pytest.approx(adaptive_lambda(steps, 0.1).tolist())
    ids = lengths_to_segment_ids([[n] * (length // n) + ([length % n] if length % n else []) for length in lengths], experience.mask)
    adv, ret = macro_advantages(experience.rewards, experience.values, experience.mask, ids, 1.0, adaptive_lambda(steps, 0.1),
                                critic_lam=1.0)  # fmt: skip
    assert torch.equal(experience.advantages, adv) and torch.equal(experience.returns, ret)


def test_one_lambda_for_actor_and_critic_is_todays_credit_bit_for_bit():
    from marlhf_cli.macro import TerminationRule, macro_advantages
    from marlhf_cli.train.ppo import credit

    experience = _experience([30, 17, 5], 32, seed=3)
    rule = TerminationRule("fixed", n=5)
    credit.assign_credit(experience, rule, lam=0.9, critic_lam=0.9)
    ids, _ = credit.segment_responses(experience, rule)
    adv, ret = macro_advantages(experience.rewards, experience.values, experience.mask, ids, 1.0, 0.9)
    assert torch.equal(experience.advantages, adv) and torch.equal(experience.returns, ret)
    assert experience.lambdas.tolist() == pytest.approx([0.9] * 3)


# ---------------------------------------------------------------------------------------
# Figure 11's norms


def test_figure_11_norms_and_the_q_values_without_a_critic():
    from marlhf_cli.train.ppo.metrics import _row_norms, q_values

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    advantages = torch.tensor([[3.0, 4.0, 0.0, 9.0], [1.0, 1.0, 7.0, 7.0]])
    assert _row_norms(advantages, mask.float()).tolist() == pytest.approx([5.0, math.sqrt(2)])
    rewards = torch.tensor([[0.0, -0.1, 1.0, 5.0], [0.5, 2.0, 9.0, 9.0]])
    free = SimpleNamespace(returns=None, mask=mask, rewards=rewards)
    torch.testing.assert_close(q_values(free, 1.0), torch.tensor([[0.9, 0.9, 1.0, 0.0], [2.5, 2.0, 0.0, 0.0]]))
    torch.testing.assert_close(q_values(free, 0.5), torch.tensor([[0.2, 0.4, 1.0, 0.0], [1.5, 2.0, 0.0, 0.0]]))
    critic = SimpleNamespace(returns=torch.ones(2, 4), mask=mask, rewards=rewards)
    assert torch.equal(q_values(critic, 1.0), torch.ones(2, 4))  # the critic's targets


@pytest.mark.slow
@pytest.mark.parametrize("advantage", ["gae", "rloo"])
def test_a_run_logs_figure_11_the_lambda_and_both_fits(tmp_path, advantage):
    from marlhf_cli.train import ppo

    flags = dict(termination="fixed", n=1, lam="adaptive", lam_alpha=0.5, critic_lambda=1.0) if advantage == "gae" else \
        dict(advantage="rloo", samples_per_prompt=2, mini_batch_size=4)  # fmt: skip
    metrics = ppo.run(_config(tmp_path, **flags))
    name = "vanilla" if advantage == "gae" else "rloo-k2"
    train = [r for r in read_jsonl(tmp_path / "metrics" / f"ppo-{name}.jsonl") if r["split"] == "train"]
    for row in train:
        assert row["advantage_l2"] > 0 and row["q_l2"] > 0 and math.isfinite(row["advantage_l2"] + row["q_l2"])
    assert (tmp_path / "plots" / f"ppo-{name}-advantage_l2.png").is_file() or not __import__("marlhf_cli.train.monitor",
            fromlist=["plots_wanted"]).plots_wanted()  # fmt: skip
    if advantage == "gae":  # 8-token responses (or shorter, at an EOS): 1 - 1 / (0.5 l), l tokens
        assert all(0.0 <= row["gae_lambda"] <= 0.75 for row in train)
        assert all(row["gae_lambda"] == pytest.approx(0.75) for row in train if row["eos_rate"] == 0)
        assert "explained_variance_within" in train[-1] and "explained_variance_within" in metrics
    else:
        assert "gae_lambda" not in train[0] and "explained_variance_within" not in train[0]


# ---------------------------------------------------------------------------------------
# no reference where nothing reads it


def _context(config, reference: bool | None = None):
    from marlhf_cli.train import common
    from marlhf_cli.train.ppo.context import make_context
    from marlhf_cli.train.ppo.models import build_models
    from marlhf_cli.scoring.rewards import TokenFractionReward
    from marlhf_cli.train.ppo.settings import plan_run

    plan = plan_run(config)
    if reference is not None:
        plan = dataclasses.replace(plan, reference=reference)
    reward = TokenFractionReward(torch.arange(100, 5000), eos_token_id=2, name="ids")
    models = build_models(config, plan, config.policy, config.reward_model, reward)
    return make_context(config, plan, models, common.load_split(config, "ppo", None, report=False).records)


def test_which_runs_read_the_reference(tmp_path):
    from marlhf_cli.train.ppo.settings import plan_run

    assert plan_run(_config(tmp_path)).reference  # the KL penalty
    assert not plan_run(_config(tmp_path, kl_coef=0)).reference
    assert not plan_run(_config(tmp_path, kl_coef=0, advantage="grpo", samples_per_prompt=2, mini_batch_size=4)).reference
    assert plan_run(_config(tmp_path, kl_coef=0, termination="ppl")).reference  # its cuts read the reference's log-probs
    assert not plan_run(_config(tmp_path, kl_coef=0, termination="ppl", advantage="rloo", samples_per_prompt=2,
                                mini_batch_size=4)).reference  # rloo cuts nothing  # fmt: skip


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_without_a_reference_the_steps_are_the_same_and_log_no_kl(tmp_path, advantage):
    """--kl-coef 0: no reference is loaded or run, and the two steps train exactly as the same
    run with a reference (whose log-probs nothing read) did; only the KL figures are gone."""
    from marlhf_cli.train.ppo import ppo_step

    flags = dict(kl_coef=0.0) | (dict(advantage="grpo", samples_per_prompt=2, mini_batch_size=4) if advantage == "grpo" else {})
    without, with_ = _context(_config(tmp_path / "a", **flags)), _context(_config(tmp_path / "b", **flags), reference=True)
    assert without.models.reference is None and with_.models.reference is not None
    for step in range(2):
        lean, full = ppo_step(without, step), ppo_step(with_, step)
        assert "kl" not in lean and "kl_k3" not in lean and "kl" in full
        same = [key for key in full if not key.startswith("kl") and "time" not in key and key not in ("tokens_per_second",)]
        assert {k: lean[k] for k in same} == {k: full[k] for k in same}
    for a, b in zip(without.models.actor.module.parameters(), with_.models.actor.module.parameters()):
        assert torch.equal(a, b)
