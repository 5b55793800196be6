"""PPO's rollout and update on the tiny model, without DeepSpeed: placement of rewards, KL,
position ids, sampling, and one vanilla step against a hand-written token-level PPO step."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from marlhf_cli.macro import TerminationRule
from marlhf_cli.train.ppo import credit
from marlhf_cli.train.ppo.experience import (
    RolloutSettings,
    final_scores,
    kl_per_token,
    make_experience,
    place_rewards,
)
from marlhf_cli.train.forward import (
    TokenValues,
    critic_values,
    head_divides_by,
    logprobs_from_logits,
    policy_forward,
    position_ids_from_mask,
)
from marlhf_cli.scoring.rewards import ScoringBatch, TokenFractionReward
from marlhf_cli.generation import SamplingParams, draw, filter_logits, response_mask, sample, texts
from marlhf_cli.generation.texts import tokenize_prompts
from marlhf_cli.train.ppo.update import UpdateSettings, ppo_update

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EOS = 2
PAD = 2  # SmolLM2 pads with its EOS: masks must never be derived from pad ids


@pytest.fixture(scope="module")
def models():
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_causal_lm, load_reward_model, load_tokenizer

    return {
        "tokenizer": load_tokenizer("tiny", padding_side="left"),
        "actor": load_causal_lm("tiny"),
        "reference": load_causal_lm("tiny"),
        "critic": TokenValues(load_reward_model("tiny")),
    }


class LastTokenReward:
    """A reward that remembers what it saw: score = 1 + row index."""

    name = "stub"

    def __call__(self, batch: ScoringBatch) -> torch.Tensor:
        self.batch = batch
        return torch.arange(batch.sequences.shape[0], dtype=torch.float32) + 1.0


# ---------------------------------------------------------------------------------------
# masks and reward placement


def test_response_mask_ends_at_first_eos_even_when_pad_is_eos():
    ids = torch.tensor([
        [5, 6, EOS, PAD, PAD],  # EOS then padding (pad id == EOS id)
        [5, 6, 7, 8, 9],  # cut at max length: no EOS, real to its end
        [5, 6, 7, 8, EOS],  # EOS in the last column
        [EOS, PAD, PAD, PAD, PAD],  # empty answer: just EOS
    ])  # fmt: skip
    mask, has_eos = response_mask(ids, EOS)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert has_eos.tolist() == [True, False, True, True]


def test_score_lands_on_the_last_real_token_for_eos_no_eos_and_padded_rows():
    ids = torch.tensor([[5, 6, EOS, PAD, PAD], [5, 6, 7, 8, 9], [5, 6, 7, 8, EOS]])
    mask, _ = response_mask(ids, EOS)
    kl = torch.full(ids.shape, 0.5)
    scores = torch.tensor([1.0, 2.0, 3.0])
    rewards = place_rewards(kl, scores, mask, kl_coef=0.1)
    expected = torch.tensor([
        [-0.05, -0.05, -0.05 + 1.0, 0.0, 0.0],  # on the EOS, not on the first padding
        [-0.05, -0.05, -0.05, -0.05, -0.05 + 2.0],  # no EOS: the final column
        [-0.05, -0.05, -0.05, -0.05, -0.05 + 3.0],
    ])  # fmt: skip
    assert torch.allclose(rewards, expected)


def test_scores_are_clipped_then_penalised_for_a_missing_eos():
    raw = torch.tensor([10.0, -10.0, 0.5])
    has_eos = torch.tensor([True, False, False])
    assert final_scores(raw, has_eos, 5.0, None).tolist() == [5.0, -5.0, 0.5]
    assert final_scores(raw, has_eos, 5.0, 1.0).tolist() == [5.0, -6.0, -0.5]


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -2.0])
    assert torch.allclose(kl_per_token(logp, ref, "k1"), torch.tensor([0.5, 0.0]))
    k3 = kl_per_token(logp, ref, "k3")
    assert torch.allclose(k3, torch.tensor([torch.exp(torch.tensor(-0.5)) - 1 + 0.5, 0.0]))
    assert (k3 >= 0).all()


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)[0, 2:]).all()
    kept = ~torch.isinf(filter_logits(logits, 0, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7


# ---------------------------------------------------------------------------------------
# the rollout on the tiny model


def test_rollout_places_score_at_last_real_token_and_kl_is_zero_for_identical_models(models):
    torch.manual_seed(0)
    reward = LastTokenReward()
    settings = RolloutSettings(max_new_tokens=12, max_prompt_length=32, kl_coef=0.05, top_k=0)
    prompts = ["a short prompt", "a somewhat longer prompt, so the batch is left padded"]
    exp = make_experience(
        models["actor"], models["reference"], models["critic"], reward, models["tokenizer"],
        prompts, [{}, {}], settings,
    )  # fmt: skip
    # actor and reference are the same weights: the old log-probs (from the sampling pass)
    # and the reference's (a full forward) agree up to float rounding, so the KL is ~0
    assert torch.allclose(exp.old_logp, exp.ref_logp, atol=2e-5) and (exp.old_logp != 0).any()
    assert exp.kl.abs().max() < 2e-5
    last = exp.mask.sum(dim=1) - 1
    score_part = exp.rewards + settings.kl_coef * exp.kl  # what is left after the KL penalty
    for row in range(2):
        nonzero = score_part[row].nonzero().flatten().tolist()
        assert nonzero == [int(last[row])]
        assert score_part[row, last[row]] == pytest.approx(row + 1.0)
    assert (exp.values[exp.mask == 0] == 0).all() and (exp.old_logp[exp.mask == 0] == 0).all()
    # the reward function saw [left-padded prompt | response], masks aligned
    assert reward.batch.attention_mask[:, : exp.prompt_length].sum(1).tolist() == [
        len(models["tokenizer"](p)["input_ids"]) for p in prompts
    ]


def test_a_bf16_rollout_computes_old_log_probs_with_a_forward_not_from_sampling(models):
    """In bf16 the sampling pass's log-probs are ~0.06 off the full forward's: there the old
    log-probs come from a forward like the reference's, so identical models agree exactly."""
    torch.manual_seed(0)
    actor = copy.deepcopy(models["actor"]).to(torch.bfloat16)
    reference = copy.deepcopy(models["actor"]).to(torch.bfloat16)
    settings = RolloutSettings(max_new_tokens=8, max_prompt_length=16, top_k=0)
    exp = make_experience(
        actor, reference, None, LastTokenReward(), models["tokenizer"], ["one prompt", "and another one"], [{}, {}], settings
    )  # fmt: skip
    assert torch.equal(exp.old_logp, exp.ref_logp) and (exp.old_logp != 0).any()


def test_rollout_with_a_forced_eos_places_the_score_on_it(models):
    """A model that always says EOS after the first token: mask [1, 1, 0, ...] and reward at 1."""
    torch.manual_seed(0)
    tok = models["tokenizer"]
    actor = copy.deepcopy(models["actor"])
    with torch.no_grad():
        actor.lm_head.weight = torch.nn.Parameter(actor.lm_head.weight.clone())  # untie
        actor.lm_head.weight[EOS] = 0
        actor.lm_head.weight[EOS, :] = actor.lm_head.weight.abs().max() * 50  # huge EOS logit
        actor.model.norm.weight.fill_(1.0)
    prompt_ids, prompt_mask = tokenize_prompts(tok, ["hello", "hello there"], 16, "cpu")
    ids = sample(actor, prompt_ids, prompt_mask, SamplingParams(1.0, 0, 1.0, 8), eos_token_id=EOS, pad_token_id=PAD)
    mask, has_eos = response_mask(ids, EOS)
    assert has_eos.all() and (mask.sum(1) >= 1).all()
    rewards = place_rewards(torch.zeros(mask.shape), torch.tensor([1.0, 2.0]), mask, 0.0)
    for row in range(2):
        eos_at = int((ids[row] == EOS).nonzero()[0])
        assert rewards[row].nonzero().flatten().tolist() == [eos_at]


def test_position_ids_make_left_padding_invisible(models):
    tok, actor, critic = models["tokenizer"], models["actor"], models["critic"]
    short = tok("one two three", add_special_tokens=False)["input_ids"]
    response = tok(" four five six", add_special_tokens=False)["input_ids"]
    alone = torch.tensor([short + response])
    padded = torch.tensor([[PAD] * 5 + short + response])
    mask_alone = torch.ones_like(alone)
    mask_padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones_like(alone)], dim=1)
    assert position_ids_from_mask(mask_padded)[0, 5:].tolist() == list(range(alone.shape[1]))
    with torch.no_grad():
        a, _ = policy_forward(actor, alone, mask_alone, len(short), 0.8)
        b, _ = policy_forward(actor, padded, mask_padded, len(short) + 5, 0.8)
        va = critic_values(critic, alone, mask_alone, len(short))
        vb = critic_values(critic, padded, mask_padded, len(short) + 5)
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(va, vb, atol=1e-5)


def test_sampling_uses_the_same_positions_and_transform_as_the_logprob_forward(models):
    """Greedy sampling (top-k 1) with the KV cache picks the argmax of the full forward."""
    torch.manual_seed(0)
    tok, actor = models["tokenizer"], models["actor"]
    prompt_ids, prompt_mask = tokenize_prompts(tok, ["x", "a much longer prompt than x"], 32, "cpu")
    ids = sample(actor, prompt_ids, prompt_mask, SamplingParams(0.8, 1, 1.0, 10), eos_token_id=EOS, pad_token_id=PAD)
    mask, _ = response_mask(ids, EOS)
    seq = torch.cat([prompt_ids, ids], 1)
    att = torch.cat([prompt_mask, mask], 1)
    with torch.no_grad():
        logits = actor(input_ids=seq, attention_mask=att, position_ids=position_ids_from_mask(att)).logits
        logp, _ = policy_forward(actor, seq, att, prompt_ids.shape[1], 0.8)
    predicted = logits[:, prompt_ids.shape[1] - 1 : -1].argmax(-1)
    assert torch.equal(predicted[mask.bool()], ids[mask.bool()])
    full = torch.log_softmax(logits[:, prompt_ids.shape[1] - 1 : -1].float() / 0.8, -1)
    assert torch.allclose(full.gather(-1, ids[..., None])[..., 0][mask.bool()], logp[mask.bool()], atol=1e-5)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.9)])
def test_the_sampling_pass_gives_the_forwards_log_probs(models, top_k, top_p):
    """The old log-probs the rollout takes from sampling are the ones a full forward over
    [prompt | response] gives (log softmax(logits / T), unfiltered, whatever top-k / top-p
    kept), and asking for them changes no sampled token."""
    tok, actor = models["tokenizer"], models["actor"]
    prompt_ids, prompt_mask = tokenize_prompts(tok, ["x", "a much longer prompt than x", "third one"], 32, "cpu")
    params = SamplingParams(0.7, top_k, top_p, 12)
    torch.manual_seed(3)
    ids, logp = sample(actor, prompt_ids, prompt_mask, params, eos_token_id=EOS, pad_token_id=PAD, with_logprobs=True)
    torch.manual_seed(3)
    assert torch.equal(ids, sample(actor, prompt_ids, prompt_mask, params, eos_token_id=EOS, pad_token_id=PAD))
    mask, _ = response_mask(ids, EOS)
    seq, att = torch.cat([prompt_ids, ids], 1), torch.cat([prompt_mask, mask], 1)
    with torch.no_grad():
        forward_logp, _ = policy_forward(actor, seq, att, prompt_ids.shape[1], 0.7)
    real = mask.bool()
    assert logp.shape == ids.shape
    assert torch.allclose(logp[real], forward_logp[real], atol=2e-5, rtol=0)
    assert (logp[real] < -1e-3).all()  # real log-probs, not zeros; unfiltered: below 0 even with top-k 5


@pytest.mark.parametrize(
    "prompts, expected",
    [
        (["a", "a", "b", "b"], 2), (["a"] * 4 + ["b"] * 4, 4), (["a", "b", "c"], 1), (["a", "a", "b"], 1),
        (["a", "a", "b", "b", "b"], 1), (["a", "a", "a", "a"], 4), (["a", "a", "b", "b", "b", "b"], 2), ([], 1),
    ],
)  # fmt: skip
def test_prompts_in_equal_runs_are_found(prompts, expected):
    from marlhf_cli.generation.texts import run_length

    assert run_length(prompts) == expected


def test_a_group_reads_its_prompt_once_and_samples_what_k_copies_would(models, monkeypatch):
    """rloo/grpo/mc's K responses per prompt: the prompt's prefill runs once and its KV cache
    serves the K rows; the tokens drawn are those of K separate copies, the log-probs equal to
    float rounding."""
    from marlhf_cli.train.ppo import experience

    tok, actor = models["tokenizer"], models["actor"]
    settings = RolloutSettings(temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=10, max_prompt_length=32)
    prompts = ["x"] * 4 + ["a much longer prompt than x"] * 4
    torch.manual_seed(5)
    grouped = experience.generate(actor, tok, prompts, settings, device="cpu", with_logprobs=True)
    monkeypatch.setattr(texts, "run_length", lambda prompts: 1)
    torch.manual_seed(5)
    copies = experience.generate(actor, tok, prompts, settings, device="cpu", with_logprobs=True)
    for index in range(5):  # prompt ids, prompt mask, response ids, mask, has_eos
        assert torch.equal(grouped[index], copies[index]), index
    real = grouped[3].bool()
    assert torch.allclose(grouped[5][real], copies[5][real], atol=1e-5, rtol=0)
    assert len({tuple(row.tolist()) for row in grouped[2][:4]}) > 1  # the copies went their own ways


def test_draw_is_the_categorical_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.15, 0.05, 0.0]]).repeat(40000, 1)
    counts = torch.bincount(draw(probs), minlength=6).float() / 40000
    assert counts[1] == 0 and counts[5] == 0  # probability 0: never drawn
    assert torch.allclose(counts, probs[0], atol=0.01)
    unnormalised = torch.tensor([[2.0, 6.0]]).repeat(40000, 1)  # mass need not sum to 1
    assert abs(float(draw(unnormalised).float().mean()) - 0.75) < 0.01


def test_logprobs_and_entropy_from_logits_match_their_definitions():
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 5, 50)).requires_grad_()
    labels = torch.randint(0, 50, (2, 5))
    logp, entropy = logprobs_from_logits(logits, labels, 0.8, with_entropy=True)
    reference = torch.log_softmax(logits / 0.8, -1)
    expected = reference.gather(-1, labels[..., None])[..., 0]
    assert torch.allclose(logp, expected, atol=1e-6)
    assert torch.allclose(entropy, -(reference.exp() * reference).sum(-1), atol=1e-5) and not entropy.requires_grad
    (grad,) = torch.autograd.grad(logp.sum(), logits)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    assert torch.allclose(grad, expected_grad, atol=1e-6)


def test_the_head_divides_its_input_by_t_only_where_that_equals_dividing_the_logits(models):
    actor = copy.deepcopy(models["actor"])
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        plain = actor(input_ids=ids).logits
        with head_divides_by(actor, 0.7) as divided:
            scaled = actor(input_ids=ids).logits
        assert divided and torch.allclose(scaled, plain / 0.7, atol=1e-5, rtol=1e-5)
        assert torch.equal(actor(input_ids=ids).logits, plain)  # the hook is gone after the block
        actor.config.final_logit_softcapping = 30.0  # tanh after the head: h / T is not logits / T
        with head_divides_by(actor, 0.7) as divided:
            assert not divided and torch.equal(actor(input_ids=ids).logits, plain)


def test_token_fraction_reward_ignores_eos_and_padding():
    ids = torch.tensor([[7, 8, 7, EOS, PAD], [7, 7, 9, 9, 9]])
    mask, has_eos = response_mask(ids, EOS)
    batch = ScoringBatch([], [], ids, mask, 0, ids, mask, has_eos)
    assert TokenFractionReward([7], eos_token_id=EOS)(batch).tolist() == pytest.approx([2 / 3, 2 / 5])


# ---------------------------------------------------------------------------------------
# fixed n=1 is token-level PPO: one update against a hand-written reference


class SGDEngine:
    """The three calls ppo_update makes of an engine, over a torch optimizer."""

    def __init__(self, module, lr):
        self.module = module
        self.optimizer = torch.optim.SGD(module.parameters(), lr=lr)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def train(self):
        self.module.train()

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()


def hand_written_token_ppo(actor, critic, exp, *, gamma, lam, clip, vclip, temperature, lr):
    """Textbook token-level PPO, one loop per sample, written without marlhf's helpers."""
    batch, length = exp.mask.shape
    adv = torch.zeros(batch, length)
    ret = torch.zeros(batch, length)
    for b in range(batch):
        n = int(exp.mask[b].sum())
        running = 0.0
        for t in reversed(range(n)):
            next_value = float(exp.values[b, t + 1]) if t + 1 < n else 0.0
            delta = float(exp.rewards[b, t]) + gamma * next_value - float(exp.values[b, t])
            running = delta + gamma * lam * running
            adv[b, t] = running
            ret[b, t] = running + float(exp.values[b, t])
    plen = exp.prompt_length
    seq, att = exp.sequences, exp.attention_mask
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    logits = actor(input_ids=seq, attention_mask=att, position_ids=pos).logits[:, plen - 1 : -1] / temperature
    logp = torch.log_softmax(logits.float(), -1).gather(-1, seq[:, plen:, None])[..., 0]
    real = exp.mask.bool()
    ratio = torch.exp(logp[real] - exp.old_logp[real])
    a = adv[real]
    policy = torch.max(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip)).mean()
    backbone = critic.model.model
    hidden = backbone(input_ids=seq, attention_mask=att, position_ids=pos).last_hidden_state
    v = critic.model.score(hidden)[..., 0][:, plen - 1 : -1][real]
    old_v, target = exp.values[real], ret[real]
    v_clipped = old_v + (v - old_v).clamp(-vclip, vclip)
    value = 0.5 * torch.max((v - target) ** 2, (v_clipped - target) ** 2).mean()
    for model, loss in ((actor, policy), (critic, value)):
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
    return float(policy.detach()), float(value.detach()), adv, ret


def test_fixed_n1_step_equals_hand_written_token_ppo(models):
    torch.manual_seed(0)
    tok = models["tokenizer"]
    settings = RolloutSettings(max_new_tokens=10, max_prompt_length=32, kl_coef=0.1, top_k=0, temperature=0.9)
    actor = copy.deepcopy(models["actor"])
    critic = copy.deepcopy(models["critic"])
    reference = copy.deepcopy(models["reference"])
    with torch.no_grad():  # make the reference differ, so the KL reward is not zero
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    exp = make_experience(
        actor, reference, critic, LastTokenReward(), tok,
        ["first prompt", "the second prompt is longer", "third", "a fourth one"], [{}] * 4, settings,
    )  # fmt: skip
    # stale old log-probs and values, so both clip branches are exercised
    exp.old_logp = exp.old_logp + 0.3 * torch.randn_like(exp.old_logp) * exp.mask
    exp.values = exp.values + 0.5 * torch.randn_like(exp.values) * exp.mask
    credit.assign_credit(exp, TerminationRule("fixed", n=1), gamma=0.99, lam=0.9)

    ref_actor, ref_critic = copy.deepcopy(actor), copy.deepcopy(critic)
    lr = 0.5
    stats = ppo_update(
        SGDEngine(actor, lr), SGDEngine(critic, lr), exp,
        UpdateSettings(epochs=1, mini_batch_size=4, micro_batch_size=4, clip_range=0.2, value_clip_range=0.2, temperature=0.9),
    )  # fmt: skip
    policy, value, adv, ret = hand_written_token_ppo(
        ref_actor, ref_critic, exp, gamma=0.99, lam=0.9, clip=0.2, vclip=0.2, temperature=0.9, lr=lr
    )
    assert torch.allclose(exp.advantages, adv, atol=1e-5) and torch.allclose(exp.returns, ret, atol=1e-5)
    assert stats["policy_loss"] == pytest.approx(policy, abs=1e-5)
    assert stats["value_loss"] == pytest.approx(value, abs=1e-5)
    assert 0 < stats["clip_fraction"] < 1
    for mine, theirs in zip(actor.parameters(), ref_actor.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-6)
    for mine, theirs in zip(critic.parameters(), ref_critic.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-6)
    changed = any(not torch.equal(a, b) for a, b in zip(actor.parameters(), models["actor"].parameters()))
    assert changed


class RecordingExecutor(ThreadPoolExecutor):
    """A one-thread pool that logs, in ``events``, when work is submitted to it."""

    def __init__(self, events):
        super().__init__(max_workers=1)
        self.events = events

    def submit(self, fn, *args, **kwargs):
        self.events.append("parse submitted")
        return super().submit(fn, *args, **kwargs)


class OrderedReward(LastTokenReward):
    def __init__(self, events):
        self.events = events

    def __call__(self, batch):
        self.events.append("reward scored")
        return super().__call__(batch)


def test_a_text_rule_parses_while_the_scoring_forwards_run(models):
    """With a parse pool, the stage hands the parse over as soon as the responses exist,
    before the scoring forwards; the segments are those of the inline path."""
    torch.manual_seed(1)
    tok = models["tokenizer"]
    rule = TerminationRule("code", n=3, cutoff=4)
    settings = RolloutSettings(max_new_tokens=12, max_prompt_length=16, top_k=0)
    events: list[str] = []
    pending = {}
    with RecordingExecutor(events) as pool:

        def start(response_ids, mask):
            events.append("sampled")
            pending["segments"] = credit.start_segmentation(
                rule, response_ids, mask, tokenizer=tok, sample_seeds=[0, 1, 2], executor=pool
            )

        exp = make_experience(
            models["actor"], models["reference"], models["critic"], OrderedReward(events), tok,
            ["def f(x):", "for i in range(3):", "x ="], [{}] * 3, settings, on_sampled=start,
        )  # fmt: skip
        assert events[0] == "sampled" and events[1] == "parse submitted" and events[-1] == "reward scored"
        credit.assign_credit(exp, rule, tokenizer=tok, sample_seeds=[0, 1, 2], pending=pending["segments"])
    overlapped = exp.segment_ids.clone()
    credit.assign_credit(exp, rule, tokenizer=tok, sample_seeds=[0, 1, 2])  # inline, no pool
    assert torch.equal(overlapped, exp.segment_ids)
    assert credit.start_segmentation(TerminationRule("ppl"), exp.response_ids, exp.mask, tokenizer=tok, executor=pool) is None
    assert credit.start_segmentation(rule, exp.response_ids, exp.mask, tokenizer=tok, executor=None) is None


def test_vanilla_is_named_and_described():
    assert credit.is_vanilla(TerminationRule("fixed", n=1))
    assert "vanilla PPO" in credit.describe(TerminationRule("fixed", n=1), "equal", "token")
    assert "MA-PPO" in credit.describe(TerminationRule("ppl"), "equal", "token")


def test_the_final_tables_kl_is_the_k3_estimate_which_is_never_negative():
    """A k1 sample mean shown as "KL" read -0.31 for mc: the table shows the k3 estimate (runs
    logged before it existed still show their k1 figure)."""
    from marlhf_cli.train.ppo import report

    rows = [{"step": s, "split": "train", "kl": -0.3, "kl_k3": 0.05 * s} for s in (1, 2)]
    assert report.summary_row("mc", rows)["kl"] == pytest.approx(0.075)
    assert report.summary_row("old", [{"step": 1, "split": "train", "kl": -0.3}])["kl"] == -0.3
    lp = torch.randn(4, 9)
    ref = lp + torch.randn(4, 9)
    assert (kl_per_token(lp, ref, "k3") >= 0).all() and (kl_per_token(lp, ref, "k1") < 0).any()


@pytest.mark.parametrize("seed", range(5))
def test_explained_variance_from_summed_parts_matches_its_definition(seed):
    """The critic's explained variance, summed in parts over processes, is 1 - Var(y - v) / Var(y)
    over the real tokens of every process (numpy on the concatenation)."""
    import numpy as np

    from marlhf_cli.train.ppo.metrics import _fit_sums, explained_variance

    generator = torch.Generator().manual_seed(seed)
    parts, ys, vs = [], [], []
    for _ in range(3):  # three processes' batches
        returns, values = torch.randn(4, 7, generator=generator, dtype=torch.float64), torch.randn(4, 7, generator=generator, dtype=torch.float64)
        mask = (torch.rand(4, 7, generator=generator) < 0.7).double()
        parts.append(_fit_sums(returns, values, mask) | {"response_tokens": float(mask.sum())})
        real = mask.bool()
        ys.append(returns[real].numpy())
        vs.append(values[real].numpy())
    total = {key: sum(p[key] for p in parts) for key in parts[0]}
    y, v = np.concatenate(ys), np.concatenate(vs)
    assert explained_variance(total) == pytest.approx(1 - np.var(y - v) / np.var(y), rel=1e-9)
    exact = _fit_sums(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[1.0, 2.0, 4.0]]), torch.ones(1, 3)) | {"response_tokens": 3.0}
    assert explained_variance(exact) == pytest.approx(1.0)
    assert _fit_sums(None, torch.zeros(1, 3), torch.ones(1, 3)) == {}  # critic-free: no targets
