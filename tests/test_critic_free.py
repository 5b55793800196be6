"""The critic-free baselines, ``marlhf ppo --advantage rloo|grpo``: advantages against hand-computed
groups and a plain reference loop, GRPO's KL loss, one GRPO update against a hand-written one,
the group layout of a step's prompts, and the stage end to end (no critic anywhere)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings as hypothesis_settings, strategies as st

from marlhf_cli import config as config_module
from marlhf_cli.artifacts import read_jsonl
from marlhf_cli.errors import UserError
from marlhf_cli.macro import grpo_advantages, kl_loss, rloo_advantages, sequence_to_tokens
from marlhf_cli.macro.baselines import GRPO_EPS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------
# advantages: hand-computed groups


def test_rloo_hand_computed_groups():
    # group 1: the others of 1.0 are 2, 3, 4 (mean 3) -> -2; group 2 (K=4) all tied -> 0
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    expected = torch.tensor([-2.0, -2 / 3, 2 / 3, 2.0, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(rloo_advantages(rewards, 4), expected, atol=1e-6)


def test_rloo_with_two_responses_is_the_difference_and_ties_give_zero():
    rewards = torch.tensor([0.5, -1.5, 2.0, 2.0, 1.0, 1.0, 3.0, 3.0])
    # K=2: A_i = R_i - R_other; a tied pair gets zero
    expected = torch.tensor([2.0, -2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(rloo_advantages(rewards, 2), expected)


def test_grpo_hand_computed_groups():
    scores = torch.tensor([1.0, 1.0, 0.0, 2.0, 0.0, 1.0, 2.0, 3.0])
    # K=2: [1, 1] is tied -> 0; [0, 2]: mean 1, sample std sqrt(2); [0, 1] and [2, 3]: sqrt(1/2)
    k2 = grpo_advantages(scores, 2)
    wide, narrow = 1 / (math.sqrt(2) + GRPO_EPS), 0.5 / (math.sqrt(0.5) + GRPO_EPS)
    expected = torch.tensor([0, 0, -wide, wide, -narrow, narrow, -narrow, narrow])
    assert torch.allclose(k2, expected, atol=1e-6)
    # K=4, second group 0..3: mean 1.5, sample std sqrt(5/3)
    k4 = grpo_advantages(scores, 4)
    std = math.sqrt(5 / 3)
    assert torch.allclose(k4[4:], (torch.tensor([0.0, 1.0, 2.0, 3.0]) - 1.5) / (std + GRPO_EPS), atol=1e-6)


@pytest.mark.parametrize("estimator", [rloo_advantages, grpo_advantages])
def test_all_equal_rewards_give_zero_advantage_without_nan(estimator):
    for k in (2, 3, 8):
        out = estimator(torch.full((2 * k,), 0.7), k)
        assert torch.isfinite(out).all() and torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("estimator", [rloo_advantages, grpo_advantages])
def test_groups_need_two_responses_and_whole_groups(estimator):
    with pytest.raises(ValueError, match="at least 2"):
        estimator(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="groups of 3"):
        estimator(torch.zeros(4), 3)


def _reference_rloo(values: list[float], k: int) -> list[float]:
    out = []
    for g in range(0, len(values), k):
        group = values[g : g + k]
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i]
            out.append(r - sum(others) / len(others))
    return out


def _reference_grpo(values: list[float], k: int) -> list[float]:
    out = []
    for g in range(0, len(values), k):
        group = values[g : g + k]
        mean = sum(group) / k
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (k - 1))
        out.extend((x - mean) / (std + GRPO_EPS) for x in group)
    return out


@hypothesis_settings(max_examples=60, deadline=None)
@given(
    k=st.integers(2, 6),
    groups=st.integers(1, 4),
    data=st.data(),
)
def test_advantages_match_a_plain_loop_on_random_groups(k, groups, data):
    values = data.draw(st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=k * groups, max_size=k * groups))
    rewards = torch.tensor(values, dtype=torch.float32)
    assert torch.allclose(rloo_advantages(rewards, k), torch.tensor(_reference_rloo(values, k)), atol=1e-4)
    assert torch.allclose(grpo_advantages(rewards, k), torch.tensor(_reference_grpo(values, k)), atol=1e-3)
    # a group's advantages sum to zero in both (the baseline is the group)
    assert torch.allclose(rloo_advantages(rewards, k).reshape(-1, k).sum(1), torch.zeros(groups), atol=1e-4)


def test_sequence_advantage_reaches_every_real_token_and_no_padding():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    out = sequence_to_tokens(torch.tensor([2.0, -1.0]), mask)
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 2.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]))


# ---------------------------------------------------------------------------------------
# GRPO's KL loss


def test_kl_loss_is_the_k3_token_mean_and_inert_at_padding():
    logp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, float("inf"), 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    terms = [math.exp(r - p) - (r - p) - 1 for p, r in ((-1.0, -1.5), (-2.0, -1.0), (-0.5, -0.5))]
    loss = kl_loss(logp, ref, mask)
    assert float(loss.detach()) == pytest.approx(sum(terms) / 3, abs=1e-6)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0 and logp.grad[1, 1] == 0
    # d/dlogp of exp(r - p) - (r - p) - 1 is 1 - exp(r - p), over 3 real tokens
    assert float(logp.grad[0, 0]) == pytest.approx((1 - math.exp(-0.5)) / 3, abs=1e-6)
    same = kl_loss(ref.clone(), ref, torch.ones_like(mask))
    assert float(same) == 0.0


# ---------------------------------------------------------------------------------------
# one update against a hand-written GRPO step (the tiny model, no DeepSpeed)


@pytest.fixture(scope="module")
def models():
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_causal_lm, load_tokenizer

    return {"tokenizer": load_tokenizer("tiny", padding_side="left"), "actor": load_causal_lm("tiny"),
            "reference": load_causal_lm("tiny")}  # fmt: skip


class RowScore:
    """Score = a fixed value per row, so groups have known, partly tied scores."""

    name = "rows"

    def __init__(self, scores):
        self.scores = torch.tensor(scores, dtype=torch.float32)

    def __call__(self, batch):
        return self.scores[: batch.sequences.shape[0]]


def _rollout(models, reward, kl_coef):
    from marlhf_cli.train.ppo.experience import RolloutSettings, make_experience

    torch.manual_seed(0)
    settings = RolloutSettings(max_new_tokens=8, max_prompt_length=32, kl_coef=kl_coef, top_k=0, temperature=0.9)
    reference = copy.deepcopy(models["reference"])
    with torch.no_grad():  # a reference that differs, so the KL terms are not zero
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    prompts = ["first prompt"] * 2 + ["the second prompt is longer"] * 2 + ["third"] * 2
    exp = make_experience(copy.deepcopy(models["actor"]), reference, None, reward, models["tokenizer"], prompts, [{}] * 6, settings)
    return exp, reference


def test_make_experience_without_a_critic_has_zero_values(models):
    exp, _ = _rollout(models, RowScore([1, 0, 2, 2, 0, 3]), kl_coef=0.1)
    assert torch.equal(exp.values, torch.zeros_like(exp.values))


def test_group_credit_uses_the_kl_penalised_reward_for_rloo_and_the_score_for_grpo(models):
    from marlhf_cli.train.ppo import credit

    exp, _ = _rollout(models, RowScore([1, 0, 2, 2, 0, 3]), kl_coef=0.1)
    sequence_rewards = (exp.rewards * exp.mask).sum(1)  # score - beta * sum KL
    credit.assign_group_credit(exp, "rloo", 2)
    for row in range(6):
        partner = row ^ 1
        expected = float(sequence_rewards[row] - sequence_rewards[partner])
        n = int(exp.mask[row].sum())
        assert torch.allclose(exp.advantages[row, :n], torch.full((n,), expected), atol=1e-5)
        assert torch.all(exp.advantages[row, n:] == 0)
    assert exp.returns is None and exp.segment_stats.segments == 6
    credit.assign_group_credit(exp, "grpo", 2)
    first = exp.advantages[:, 0]
    assert first[2] == 0 and first[3] == 0  # the tied group (2, 2)
    assert float(first[1]) == pytest.approx(-0.5 / (math.sqrt(0.5) + GRPO_EPS), abs=1e-6)  # scores 1, 0


def test_grpo_update_equals_a_hand_written_grpo_step(models):
    from marlhf_cli.train.ppo import credit
    from marlhf_cli.train.ppo.update import UpdateSettings, ppo_update
    from test_ppo_unit import SGDEngine

    beta, clip, lr, temperature = 0.3, 0.2, 0.5, 0.9
    exp, _ = _rollout(models, RowScore([1, 0, 2, 2, 0, 3]), kl_coef=0.0)  # GRPO: no KL in the reward
    exp.old_logp = exp.old_logp + 0.3 * torch.randn_like(exp.old_logp) * exp.mask  # exercise clipping
    credit.assign_group_credit(exp, "grpo", 2)
    actor = copy.deepcopy(models["actor"])
    by_hand = copy.deepcopy(actor)
    stats = ppo_update(
        SGDEngine(actor, lr), None, exp,
        UpdateSettings(epochs=1, mini_batch_size=6, micro_batch_size=6, clip_range=clip, temperature=temperature,
                       kl_loss_coef=beta),
    )  # fmt: skip

    # by hand: per-sample group statistics, the clipped surrogate and beta * k3, token means
    scores = [1.0, 0.0, 2.0, 2.0, 0.0, 3.0]
    adv = []
    for g in range(0, 6, 2):
        mean = (scores[g] + scores[g + 1]) / 2
        std = math.sqrt(((scores[g] - mean) ** 2 + (scores[g + 1] - mean) ** 2) / 1)
        adv += [(scores[g] - mean) / (std + GRPO_EPS), (scores[g + 1] - mean) / (std + GRPO_EPS)]
    plen, seq, att = exp.prompt_length, exp.sequences, exp.attention_mask
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = by_hand(input_ids=seq, attention_mask=att, position_ids=pos).logits[:, plen - 1 : -1] / temperature
    logp = torch.log_softmax(logits.float(), -1).gather(-1, seq[:, plen:, None])[..., 0]
    real = exp.mask.bool()
    a = torch.tensor(adv)[:, None].expand_as(logp)[real]
    ratio = torch.exp(logp[real] - exp.old_logp[real])
    surrogate = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
    d = exp.ref_logp[real] - logp[real]
    k3 = (torch.exp(d) - d - 1).mean()
    (surrogate + beta * k3).backward()
    with torch.no_grad():
        for p in by_hand.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    assert stats["policy_loss"] == pytest.approx(float(surrogate), abs=1e-5)
    assert stats["kl_loss"] == pytest.approx(float(k3), abs=1e-6) and float(k3) > 0
    assert "value_loss" not in stats
    for mine, theirs in zip(actor.parameters(), by_hand.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-6)


# ---------------------------------------------------------------------------------------
# the step's prompts: groups of K consecutive rows, never split over processes


def test_prompt_schedule_repeats_each_prompt_k_times_within_one_process():
    from marlhf_cli.train.ppo.context import PromptSchedule

    records = [{"prompt": f"p{i}"} for i in range(10)]
    schedule = PromptSchedule(records, batch_size=4, seed=1)
    alone, numbers_alone = schedule.for_rank(3, 0, 1, group=1)
    assert schedule.for_rank(3, 0, 1) == (alone, numbers_alone)  # K=1 is the PPO schedule
    grouped, numbers = schedule.for_rank(3, 0, 1, group=3)
    assert grouped == [r for r in alone for _ in range(3)]
    assert len(set(numbers)) == 12
    halves = [schedule.for_rank(3, rank, 2, group=3) for rank in (0, 1)]
    assert halves[0][0] + halves[1][0] == grouped  # each rank holds whole groups
    assert halves[0][1] + halves[1][1] == numbers


# ---------------------------------------------------------------------------------------
# options and names


def _config(tmp_path, **flags):
    base = dict(policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=2, mini_batch_size=4,
                max_new_tokens=8, max_prompt_length=48, max_steps=2, eval_every=1, eval_prompts=2, save_every=0,
                actor_lr=1e-3, run_dir=str(tmp_path))  # fmt: skip
    return config_module.resolve("ppo", flags={**base, **flags})


def _check_flags(config, flags):
    from marlhf_cli.train.ppo import settings

    settings.plan_run(config, given_flags=flags)


def test_names_options_and_errors(tmp_path):
    from marlhf_cli.train import ppo

    assert ppo.run_name(_config(tmp_path, advantage="rloo")) == "rloo"
    assert ppo.run_name(_config(tmp_path, advantage="grpo", samples_per_prompt=8, mini_batch_size=8)) == "grpo-k8"
    assert ppo.run_name(_config(tmp_path, termination="fixed", n=1, mini_batch_size=2)) == "vanilla"
    assert ppo.plan_run(_config(tmp_path, advantage="rloo")).responses_per_step == 8
    ppo.plan_run(_config(tmp_path, advantage="grpo", termination="parsing"))  # a preset's rule: no error
    with pytest.raises(UserError, match="at least 2"):
        ppo.plan_run(_config(tmp_path, advantage="rloo", samples_per_prompt=1))
    with pytest.raises(UserError, match="--advantage must be one of gae, rloo, grpo"):
        ppo.plan_run(_config(tmp_path, advantage="ppo"))
    with pytest.raises(UserError, match="multiple of --mini-batch-size 3"):
        ppo.plan_run(_config(tmp_path, advantage="rloo", mini_batch_size=3))
    with pytest.raises(UserError, match="--termination, --value-function do not apply"):
        _check_flags(_config(tmp_path, advantage="rloo"), ["--termination", "--value-function"])
    with pytest.raises(UserError, match="--termination does not apply"):  # one flag: 'does'
        _check_flags(_config(tmp_path, advantage="rloo"), ["--termination"])
    _check_flags(_config(tmp_path, mini_batch_size=2), ["--termination"])  # gae: fine


@pytest.mark.slow
def test_critic_flags_on_the_command_line_are_a_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    result = CliRunner().invoke(app, ["ppo", "--advantage", "grpo", "--termination", "ppl", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--termination does not apply" in lines[0], result.output


# ---------------------------------------------------------------------------------------
# end to end: two steps each, no critic built, checkpointed or exported


@pytest.mark.slow
@pytest.mark.parametrize("advantage", ["rloo", "grpo"])
def test_two_steps_write_no_critic_and_report_responses(tmp_path, advantage):
    from marlhf_cli.train import ppo

    metrics = ppo.run(_config(tmp_path, advantage=advantage, samples_per_prompt=2, save_every=1, max_steps=2,
                              termination="ppl"))  # fmt: skip  (a config value for the rule: does not apply)
    out = tmp_path / "ppo" / f"{advantage}-k2"
    assert (out / "config.json").is_file() and not (out / "critic").exists()
    assert not (out / "checkpoints" / "critic").exists()
    train = [r for r in read_jsonl(tmp_path / "metrics" / f"ppo-{advantage}-k2.jsonl") if r["split"] == "train"]
    assert [r["responses"] for r in train] == [4.0, 4.0]
    assert all(r["segments_per_response"] == 1.0 for r in train)
    assert all("segment_length" not in r for r in train)  # no macro actions: the table shows '-', not the length
    assert all("value_loss" not in r for r in train)
    assert ("kl_loss" in train[0]) == (advantage == "grpo")
    assert math.isfinite(metrics["score"])
    assert len(read_jsonl(tmp_path / "samples" / f"{advantage}-k2.jsonl")) == 2


# ---------------------------------------------------------------------------------------
# through the real command line: SIGKILL + --resume is bit-exact; two processes keep groups whole


def _cli(run_dir, advantage, *extra):
    import sys

    return [
        sys.executable, "-m", "marlhf_cli.cli", "ppo", "--run-dir", str(run_dir), "--policy", "tiny",
        "--reward-model", "tiny", "--advantage", advantage, "--samples-per-prompt", "2",
        "--rollout-batch-size", "2", "--mini-batch-size", "2", "--ppo-epochs", "2", "--max-new-tokens", "8",
        "--max-prompt-length", "48", "--actor-lr", "1e-3", "--max-steps", "6", "--save-every", "2",
        "--eval-every", "3", "--eval-prompts", "2", "--seed", "3", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_grpo_sigkill_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    import subprocess

    from test_ppo_resume import VOLATILE, environment, kill_once_saved, run_here

    def history(run_dir):
        rows = read_jsonl(run_dir / "metrics" / "ppo-grpo-k2.jsonl")
        return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_here(_cli(straight, "grpo"))
    proc = subprocess.Popen(
        _cli(killed, "grpo"), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    kill_once_saved(proc, killed / "ppo" / "grpo-k2" / "checkpoints" / "actor" / "latest")
    resumed = subprocess.run(_cli(killed, "grpo", "--resume"), env=environment(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    assert history(killed) == history(straight)
    assert not (killed / "ppo" / "grpo-k2" / "critic").exists()


@pytest.mark.slow
def test_rloo_on_two_processes(tmp_path):
    import subprocess

    from test_ppo_resume import environment

    result = subprocess.run(
        _cli(tmp_path, "rloo", "--nproc", "2", "--zero-stage", "2", "--max-steps", "2", "--save-every", "0"),
        env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes" in result.stderr
    train = [r for r in read_jsonl(tmp_path / "metrics" / "ppo-rloo-k2.jsonl") if r["split"] == "train"]
    assert [r["responses"] for r in train] == [4.0, 4.0]
    assert not (tmp_path / "ppo" / "rloo-k2" / "critic").exists()
