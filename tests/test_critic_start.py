"""The critic that fits (issue 42): its value head's start (--value-head-init), its warm-up
(--critic-warmup-steps), and its fit pooled over steps; a critic that fits a fixed rollout,
and the zero head against the random one at the start of a credit-study run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.errors import UserError
from marlhf_cli.train.ppo import critic_fit, value_head
from marlhf_cli.train.ppo.settings import plan_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------
# the pooled explained variance


def _step_row(targets: np.ndarray, values: np.ndarray) -> dict:
    """A step's metrics as reduce_metrics writes them, from its tokens' targets and values."""
    return {"split": "train", "response_tokens": float(len(targets)), "return": float(targets.mean()),
            "value": float(values.mean()), "return_variance": float(targets.var()),
            "residual_variance": float((targets - values).var())}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(0, 2**31 - 1), st.floats(0.0, 2.0))
def test_pooled_explained_variance_is_the_explained_variance_of_all_the_tokens(sizes, seed, shift):
    """Pooled from each step's count, means and variances, it equals 1 - Var(y - v) / Var(y)
    over the concatenation of the steps' tokens (numpy), whatever the steps' sizes and means."""
    rng = np.random.default_rng(seed)
    steps = []
    for i, n in enumerate(sizes):
        y = rng.normal(shift * i, 1.0, n)  # targets whose mean moves between steps
        steps.append((y, y + rng.normal(0.0, 0.7, n)))
    rows = [_step_row(y, v) for y, v in steps]
    y, v = np.concatenate([s[0] for s in steps]), np.concatenate([s[1] for s in steps])
    expected = 1 - np.var(y - v) / np.var(y) if np.var(y) > critic_fit.VARIES else math.nan
    got = critic_fit.pooled_explained_variance(rows)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected, rel=1e-7, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(2, 40), min_size=1, max_size=12), st.integers(0, 2**31 - 1), st.floats(0.0, 2.0))
def test_within_step_explained_variance_is_that_of_the_tokens_about_their_steps_means(sizes, seed, shift):
    """From each step's count and variances it equals 1 - SS(residual) / SS(target) over the
    steps' tokens, each centred on its own step's means (numpy)."""
    rng = np.random.default_rng(seed)
    steps = []
    for i, n in enumerate(sizes):
        y = rng.normal(shift * i, 1.0, n)
        steps.append((y, y + rng.normal(0.0, 0.7, n)))
    rows = [_step_row(y, v) for y, v in steps]
    residual = sum((((y - v) - (y - v).mean()) ** 2).sum() for y, v in steps)
    target = sum(((y - y.mean()) ** 2).sum() for y, _ in steps)
    assert critic_fit.within_step_explained_variance(rows) == pytest.approx(1 - residual / target, rel=1e-7, abs=1e-9)


def test_within_step_fit_tells_a_moving_average_from_a_critic_that_ranks():
    """Targets whose mean moves from step to step: a critic that predicts each step's mean and
    nothing else explains much pooled and nothing within steps; one that also ranks a step's
    responses explains much on both."""
    rng = np.random.default_rng(0)
    means = rng.normal(0.0, 3.0, 10)
    average, ranking = [], []
    for mean in means:
        y = mean + rng.normal(0.0, 1.0, 32)
        average.append(_step_row(y, np.full(32, y.mean())))
        ranking.append(_step_row(y, y + rng.normal(0.0, 0.3, 32)))
    assert critic_fit.pooled_explained_variance(average) > 0.8
    assert critic_fit.within_step_explained_variance(average) == pytest.approx(0.0, abs=1e-9)
    assert critic_fit.within_step_explained_variance(ranking) > 0.8 and critic_fit.pooled_explained_variance(ranking) > 0.9
    assert math.isnan(critic_fit.within_step_explained_variance([]))
    assert math.isnan(critic_fit.within_step_explained_variance([_step_row(np.full(4, 0.3), np.zeros(4))]))


def test_pooled_explained_variance_edges_and_window():
    assert math.isnan(critic_fit.pooled_explained_variance([]))
    assert math.isnan(critic_fit.pooled_explained_variance([{"split": "train", "score": 1.0}]))  # a critic-free row
    constant = _step_row(np.full(5, 0.3), np.zeros(5))
    assert math.isnan(critic_fit.pooled_explained_variance([constant]))  # targets that do not vary
    exact = _step_row(np.arange(5.0), np.arange(5.0))
    assert critic_fit.pooled_explained_variance([exact]) == 1.0
    zero = _step_row(np.arange(5.0) - 2.0, np.zeros(5))  # the constant 0 at the targets' mean
    assert critic_fit.pooled_explained_variance([zero]) == pytest.approx(0.0)
    rows = [{"step": s, "split": "train"} for s in range(1, 16)] + [{"step": 3, "split": "eval"}]
    assert [r["step"] for r in critic_fit.last_window(rows)] == list(range(6, 16))
    assert [r["step"] for r in critic_fit.last_window(rows, 4)] == [1, 2, 3, 4]
    assert critic_fit.advice(0.3, 10) is None and critic_fit.advice(math.nan, 10) is None
    line = critic_fit.advice(-0.05, 10)
    assert "explained none" in line and "--critic-warmup-steps" in line and "--advantage" in line


def test_the_end_of_a_run_reports_its_warm_up_and_a_critic_that_explained_nothing():
    from marlhf_cli.train.ppo import report

    rng = np.random.default_rng(0)
    y = rng.normal(0, 1, 50)
    fits = [_step_row(y, y + rng.normal(0, 0.3, 50)) | {"step": s} for s in range(1, 4)]
    noise = [_step_row(y, rng.normal(0, 2, 50)) | {"step": s} for s in range(4, 16)]
    warm = [row | {"critic_warmup": 1.0} for row in fits]
    lines = report.critic_lines(warm + noise)
    assert lines[0].startswith("critic warm-up: steps 1-3 trained the critic alone; its explained variance")
    assert lines[0].endswith(f"was {critic_fit.pooled_explained_variance(fits):.3f} when the actor started")
    assert "explained none of its targets' variance over the last 10 steps" in lines[1]
    assert report.critic_lines(fits) == []  # a critic that fits, no warm-up: nothing to say
    # a policy that has settled: its targets' spread over the last steps is a sliver of the run's
    small = rng.normal(1.0, 0.002, 50)
    late = [_step_row(small, small + rng.normal(0, 0.01, 50)) | {"step": s} for s in range(16, 26)]
    (line,) = report.critic_lines(noise + late)
    assert line.startswith("the critic's targets barely varied over the last 10 steps (sd 0.00")
    assert "the policy had settled" in line and critic_fit.pooled_explained_variance(late) < -5
    assert report.critic_lines([{"split": "train", "step": 1, "score": 0.5}]) == []  # no critic
    assert report.summary_row("x", noise)["critic_fit"] < 0 and report.summary_row("x", [])["critic_fit"] is None


# ---------------------------------------------------------------------------------------
# the value head's start


def test_the_default_start_and_its_one_line_errors():
    assert value_head.resolve(None, True, "rm") == "reward-model"
    assert value_head.resolve(None, False, "sft") == "zero"
    assert value_head.resolve("random", True, "rm") == "random"
    with pytest.raises(UserError, match=r"--value-head-init reward-model: 'tiny' has no trained score head"):
        value_head.resolve("reward-model", False, "tiny")


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """A reward-model folder (a tiny scorer whose head was set by hand, as marlhf rm's would
    be trained) and a causal-LM folder (what marlhf sft writes)."""
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_causal_lm, load_reward_model, load_tokenizer

    root = tmp_path_factory.mktemp("models")
    rm = load_reward_model("tiny")
    with torch.no_grad():
        rm.score.weight.copy_(torch.randn(rm.score.weight.shape, generator=torch.Generator().manual_seed(7)))
    rm.save_pretrained(root / "rm")
    load_tokenizer("tiny").save_pretrained(root / "rm")
    load_causal_lm("tiny").save_pretrained(root / "sft")
    load_tokenizer("tiny").save_pretrained(root / "sft")
    return {"rm": root / "rm", "sft": root / "sft", "rm_head": rm.score.weight.detach().clone()}


def test_load_score_model_tells_a_trained_head_from_a_new_one(saved_models):
    from marlhf_cli.models import load_score_model

    rm, trained = load_score_model(str(saved_models["rm"]))
    assert trained and torch.equal(rm.score.weight, saved_models["rm_head"])
    assert load_score_model(str(saved_models["sft"]))[1] is False  # a causal LM: the head is new
    assert load_score_model("tiny")[1] is False  # random-init


def _values(model, seed: int = 0) -> torch.Tensor:
    from marlhf_cli.train.forward import TokenValues

    ids = torch.randint(3, 1000, (3, 9), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    with torch.no_grad():
        return TokenValues(model)(ids, mask)


def test_zero_random_and_reward_model_starts():
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_reward_model

    model = load_reward_model("tiny")
    before = model.score.weight.detach().clone()
    value_head.start(model, "random", trained=False, seed=0)  # a head already random: kept as loaded
    assert torch.equal(model.score.weight, before)
    assert _values(model).abs().max() > 0
    value_head.start(model, "zero", trained=False, seed=0)
    assert torch.equal(_values(model), torch.zeros(3, 9))  # exactly 0 everywhere, padding included
    trained = load_reward_model("tiny")
    value_head.start(trained, "random", trained=True, seed=3)  # a trained head is redrawn, from the seed
    again = load_reward_model("tiny")
    value_head.start(again, "random", trained=True, seed=3)
    assert torch.equal(trained.score.weight, again.score.weight) and not torch.equal(trained.score.weight, before)
    assert trained.score.weight.std().item() == pytest.approx(trained.config.initializer_range, rel=0.5)


def test_a_lora_critic_zeroes_its_own_head_and_not_the_reward_models(tmp_path):
    """Under LoRA the reward model is the critic with its adapter off: zeroing the critic's head
    must leave the copy the reward reads untouched."""
    pytest.importorskip("peft")
    from types import SimpleNamespace

    from marlhf_cli import lora
    from marlhf_cli.models import load_reward_model

    scores = _values(load_reward_model("tiny"))
    config = SimpleNamespace(lora_rank=4, lora_alpha=8.0, lora_targets="all-linear", lora_dropout=0.0)
    critic = lora.add_adapters(load_reward_model("tiny"), config, task="score")
    value_head.start(critic, "zero", trained=False, seed=0)
    assert torch.equal(_values(critic), torch.zeros(3, 9))
    with lora.adapter_off(critic):
        assert torch.equal(_values(critic), scores)


# ---------------------------------------------------------------------------------------
# through the stage: build_models, the warm-up, the critic's epochs


def _config(tmp_path, **flags):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _harness as H

    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = H.write_prompts(tmp_path / "prompts.jsonl", 40)
    settings = dict(policy="tiny", reward_model="tiny", dataset=str(prompts), rollout_batch_size=4, mini_batch_size=2,
                    max_new_tokens=6, max_prompt_length=24, actor_lr=1e-3, critic_lr=1e-3, max_steps=4, eval_every=0,
                    eval_prompts=0, save_every=0, seed=1, lr_scheduler="constant")  # fmt: skip
    return H.ppo_config(tmp_path / "run", **(settings | flags))


def _build(config):
    from marlhf_cli.train.ppo.context import make_context
    from marlhf_cli.train.ppo.models import build_models
    from marlhf_cli.scoring.rewards import TokenFractionReward

    reward = TokenFractionReward(torch.arange(100, 5000), eos_token_id=2, name="ids")
    from marlhf_cli.train import common

    models = build_models(config, plan_run(config), config.policy, config.reward_model, reward)
    return make_context(config, plan_run(config), models, common.load_split(config, "ppo", None, report=False).records)


def _weights(engine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.module.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_critic_without_a_trained_head_starts_at_exactly_zero(tmp_path, saved_models):
    from marlhf_cli.train.forward import critic_values

    ctx = _build(_config(tmp_path))
    assert ctx.models.value_head == "zero"
    ids = torch.randint(3, 1000, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(critic_values(ctx.models.critic, ids, torch.ones_like(ids), 4), torch.zeros(2, 4))

    kept = _build(_config(tmp_path / "rm", reward_model=str(saved_models["rm"])))  # the paper's start
    assert kept.models.value_head == "reward-model"
    assert torch.equal(kept.models.critic.module.model.score.weight, saved_models["rm_head"])  # bit for bit

    legacy = _build(_config(tmp_path / "random", value_head_init="random"))  # what every critic got before
    from marlhf_cli.models import load_reward_model

    assert torch.equal(legacy.models.critic.module.model.score.weight, load_reward_model("tiny").score.weight)
    with pytest.raises(UserError, match="has no trained score head"):
        _build(_config(tmp_path / "no", value_head_init="reward-model"))


def _with_statistics(saved_models, mean: float, std: float):
    """A copy of the saved reward model whose config.json stores a held-out score mean and
    spread, as marlhf rm writes them."""
    import json
    import shutil

    from marlhf_cli.scoring.heads import MEAN_KEY, STD_KEY

    folder = saved_models["rm"].parent / f"rm-mean{mean:g}-std{std:g}"
    if not folder.is_dir():
        shutil.copytree(saved_models["rm"], folder)
        config_file = folder / "config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), MEAN_KEY: mean, STD_KEY: std}))
    return folder


@pytest.mark.parametrize("mean, std, weight", [(0.0, 2.0, 1.0), (0.7, 2.0, 1.0), (-1.3, 0.4, 0.5)])
def test_a_reward_model_critic_starts_at_the_reward_it_will_assign(tmp_path, saved_models, mean, std, weight):
    """The critic's first value at a sequence's last token is the reward model's part of the
    reward the PPO stage places there, weight * (s - mean) / std, the mean included (the head
    has no bias: the offset -weight * mean / std is the critic's config's). GAE reads v[T-1]
    one column earlier, the value of the sequence without its last token: that equals the
    reward that shorter sequence would be given. Weight 0.5 is one of two --reward parts."""
    from marlhf_cli.train.forward import TokenValues, critic_values
    from marlhf_cli.train.ppo.models import build_models
    from marlhf_cli.scoring.rewards import ScoringBatch
    from marlhf_cli.scoring.heads import VALUE_OFFSET_KEY

    flags = dict(reward_model=str(_with_statistics(saved_models, mean, std)))
    if weight != 1.0:  # several rewards: the reward model's weighted beside a function's
        scorer = tmp_path / "lengths.py"
        scorer.write_text("def length(completions, **kw):\n    return [float(len(c)) for c in completions]\n")
        flags |= dict(reward=f"model,py:{scorer}:length", reward_weights=f"{weight},1")
    config = _config(tmp_path / "units", **flags)
    models = build_models(config, plan_run(config), config.policy, config.reward_model, None)
    assert models.value_head == "reward-model"
    assert (models.value_head_scale, models.value_head_offset) == pytest.approx((weight / std, -weight * mean / std))
    critic = models.critic.module.model
    assert torch.equal(critic.score.weight, saved_models["rm_head"] * (weight / std))  # the head alone is scaled
    assert getattr(critic.config, VALUE_OFFSET_KEY, 0.0) == pytest.approx(-weight * mean / std)
    reward_model = models.reward.parts[0][1] if weight != 1.0 else models.reward
    assert torch.equal(reward_model.model.score.weight, saved_models["rm_head"])  # the reward's own copy untouched

    generator = torch.Generator().manual_seed(5)
    prompt, response = 6, 7
    sequences = torch.randint(3, 1000, (4, prompt + response), generator=generator)
    mask = torch.ones_like(sequences)
    mask[1, :3] = 0  # a left-padded prompt
    mask[2, prompt + 4 :] = 0  # a response that ended early

    def assigned(seq, att):  # what the stage places at the last real token, the reward model's part
        batch = ScoringBatch([], [], seq, att, prompt, seq[:, prompt:], att[:, prompt:], torch.ones(len(seq), dtype=torch.bool))
        return weight * reward_model(batch)

    with torch.no_grad():
        values = TokenValues(critic)(sequences, mask)
        last = (mask * torch.arange(mask.shape[1])).argmax(dim=1)
        at_last = values[torch.arange(4), last]
        assert at_last.tolist() == pytest.approx(assigned(sequences, mask).tolist(), rel=1e-5, abs=1e-5)
        # GAE's v[T-1] (critic_values: column P + t - 1) reads the sequence without its last token
        read = critic_values(models.critic, sequences, mask, prompt)
        ends = mask[:, prompt:].sum(dim=1) - 1
        shorter = mask.clone()
        shorter[torch.arange(4), last] = 0
        assert read[torch.arange(4), ends].tolist() == pytest.approx(assigned(sequences, shorter).tolist(), rel=1e-5, abs=1e-5)


def test_the_offset_travels_with_the_exported_critic(tmp_path):
    """An exported critic's config.json carries the offset (a whole-weights extension loads it
    with the folder); a LoRA critic rebuilt on its base to extend a run takes it from there;
    a start other than the reward model's clears one a --reward-model critic brought."""
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_reward_model
    from marlhf_cli.scoring.heads import VALUE_OFFSET_KEY, value_offset

    critic = load_reward_model("tiny")
    value_head.start(critic, "reward-model", trained=True, seed=0, scale=0.5, offset=-0.35)
    before = _values(critic)
    critic.save_pretrained(tmp_path / "critic")
    again = load_reward_model(str(tmp_path / "critic"))
    assert value_offset(again.config) == -0.35 and torch.allclose(_values(again), before)
    base = load_reward_model("tiny")
    value_head.carry_offset(base, tmp_path / "critic")
    assert value_offset(base.config) == -0.35
    value_head.start(again, "zero", trained=True, seed=0)
    assert not hasattr(again.config, VALUE_OFFSET_KEY) and torch.equal(_values(again), torch.zeros(3, 9))


def test_warm_up_steps_train_the_critic_alone(tmp_path):
    from marlhf_cli.train.ppo import ppo_step

    ctx = _build(_config(tmp_path, critic_warmup_steps=2))
    actor, critic = _weights(ctx.models.actor), _weights(ctx.models.critic)
    rates = []
    for step in range(2):
        metrics = ppo_step(ctx, step)
        assert metrics["critic_warmup"] == 1.0 and "policy_loss" not in metrics and "value_loss" in metrics
        rates.append(metrics["actor_lr"])
    assert _same(_weights(ctx.models.actor), actor)  # bit-identical after the warm-up
    assert not _same(_weights(ctx.models.critic), critic)
    assert not ctx.models.actor.optimizer.state  # no AdamW moments either
    metrics = ppo_step(ctx, 2)
    assert "critic_warmup" not in metrics and "policy_loss" in metrics and ctx.models.actor.optimizer.state
    assert not _same(_weights(ctx.models.actor), actor)


def test_the_critic_fits_a_fixed_rollout(tmp_path):
    """From a zero head, critic-only updates on one rollout (its old values refreshed, as the
    next rollout would) bring the explained variance of its targets from 0 to above 0.9: the
    value loss, its clipping, the head and the optimizer move the values where the targets are."""
    from marlhf_cli.train.forward import critic_values
    from marlhf_cli.train.ppo.estimators import CreditInputs
    from marlhf_cli.train.ppo.experience import make_experience
    from marlhf_cli.train.ppo.metrics import _fit_sums, explained_variance
    from marlhf_cli.train.ppo.update import ppo_update

    ctx = _build(_config(tmp_path, rollout_batch_size=8, mini_batch_size=8, max_new_tokens=16))
    m = ctx.models
    records, numbers = ctx.schedule.for_rank(0, 0, 1, 1)
    rollout = make_experience(m.actor, m.reference, m.critic, m.reward, m.tokenizer, [ctx.chat.prompt(r) for r in records],
                              records, ctx.rollout, device=m.device, sampler=m.sampler.model())  # fmt: skip
    ctx.estimator.assign(rollout, CreditInputs(ctx, 0, numbers, m.sampler.model(), None))

    def fit() -> float:
        with torch.no_grad():
            values = critic_values(m.critic, rollout.sequences, rollout.attention_mask, rollout.prompt_length)
        rollout.values = values
        return explained_variance(_fit_sums(rollout.returns, values, rollout.mask.float()) | {"response_tokens": float(rollout.mask.sum())})

    assert fit() == 0.0
    for _ in range(40):
        ppo_update(m.actor, m.critic, rollout, ctx.update, train_actor=False)
        fit()
    assert fit() > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_zero_head_does_not_start_the_critic_as_noise(tmp_path, seed):
    """The credit study's `target` task with the third edition's settings (tiny policy, 8 x 32
    tokens, actor rate 0.03, MA-PPO fixed 5), critic rate 1e-3: over the first 10 steps the
    critic with a zero head (the new default) explains its targets about as well as the
    constant 0 does, the random head it replaces far worse (benchmarks/critic_fit.py: -0.03 to
    -0.96 against -5.8 to -8.5 over 5 seeds; the third edition's rate 0.01 gave -12 to -18)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _harness as H

    from marlhf_cli.train import ppo
    from studies.credit.runs import prompts_file, task_reward

    stage = dict(temperature=1.0, top_k=0, kl_coef=0.0, ppo_epochs=1, max_prompt_length=16, dtype="fp32", lr_scheduler="constant")
    fits = {}
    for head in ("zero", "random"):
        work = tmp_path / head
        config = H.ppo_config(
            work, name="run", policy="tiny", reward_model="tiny", dataset=prompts_file(), termination="fixed", n=5,
            value_head_init=head, rollout_batch_size=8, mini_batch_size=8, max_new_tokens=32, actor_lr=0.03, critic_lr=1e-3,
            max_steps=10, eval_every=0, eval_prompts=0, save_every=0, seed=seed, **stage,
        )  # fmt: skip
        ppo.run(config, reward_fn=task_reward("target", "tiny"))
        fits[head] = H.train_rows(work, "run")[-1]["explained_variance_pooled"]
    assert fits["zero"] > -1.5 and fits["random"] < fits["zero"] - 3, fits


def test_warm_up_options_are_checked_in_one_line(tmp_path):
    from marlhf_cli.train.ppo.settings import plan_run

    with pytest.raises(UserError, match=r"--critic-warmup-steps 4 leaves no step that trains the actor"):
        plan_run(_config(tmp_path, critic_warmup_steps=4))


@pytest.mark.slow
def test_a_warm_up_killed_and_resumed_equals_one_never_stopped(tmp_path):
    """SIGKILL during the critic's warm-up (after the step-2 checkpoint of a 5-step warm-up),
    then --resume: every logged figure and the samples are those of the uninterrupted run,
    the pooled explained variance included (it is read back from the rows logged before)."""
    import subprocess

    from test_ppo_resume import NAME, command, environment, kill_once_saved, metrics, run_here

    from marlhf_cli.artifacts import read_jsonl

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    warm = ("--critic-warmup-steps", "5")
    run_here(command(straight, *warm))
    proc = subprocess.Popen(command(killed, *warm), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    kill_once_saved(proc, killed / "ppo" / NAME / "checkpoints" / "critic" / "latest")
    resumed = subprocess.run(command(killed, *warm, "--resume"), env=environment(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 2" in resumed.stderr
    rows = metrics(killed)
    assert rows == metrics(straight)
    train = [r for r in rows if r["split"] == "train"]
    assert [r.get("critic_warmup") for r in train] == [1.0] * 5 + [None] * 3
    assert all("policy_loss" not in r for r in train[:5]) and all("policy_loss" in r for r in train[5:])
    assert read_jsonl(killed / "samples" / f"{NAME}.jsonl") == read_jsonl(straight / "samples" / f"{NAME}.jsonl")
