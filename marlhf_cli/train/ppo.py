"""``marlhf ppo``: PPO and MA-PPO, Algorithm 1 of Chai et al. (ICLR 2025).

Each step of :func:`run` is one iteration of the paper's Algorithm 1::

    for step in 1 .. max_steps:
        x        ~ the PPO prompts                       (PromptSchedule)
        y        ~ pi_old(. | x), with old/ref log-probs, critic values and the RM score
                                                         (experience.make_experience)
        segments = termination rule on y                 (credit.assign_credit)
        A, Q     = GAE over segments, broadcast to tokens
        for epoch, minibatch: clipped policy and value updates (update.ppo_update)

MA-PPO and PPO are the same code: ``--termination fixed --n 1`` makes every token its own
segment, which is token-level PPO exactly (tested), and the run says so when it starts.
``--advantage rloo|grpo`` replaces steps 4-5 (and the critic) with a group baseline over
``--samples-per-prompt`` responses to each prompt (:mod:`marlhf_cli.macro.baselines`); no
critic is built, trained, checkpointed or exported.

Inputs: the policy and reference come from the run's SFT model, the critic and the reward
from its reward model (``--policy`` / ``--reward-model`` override; the ``tiny`` alias works
for both). With ``--reward apps`` (the default for ``--dataset apps``) the score is the
generated program's test outcome and the critic starts from the policy. Outputs under the run directory: ``ppo/<name>/`` (actor, ``critic/``,
``checkpoints/``), ``metrics/ppo-<name>.jsonl``, ``tb/ppo-<name>/``, ``plots/ppo-<name>-*.png``,
``samples/<name>.jsonl`` and the ``ppo/<name>`` entry of ``run.json``.

Reproducibility: the prompts of step s are a pure function of (seed, s), and every random
draw of step s (sampling, randomized segments, minibatch order) comes from generators seeded
with (seed, s, rank). A run resumed from a checkpoint at step k therefore repeats exactly
what the uninterrupted run did after step k (on a CPU; GPU kernels may not be bitwise
deterministic).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from .. import artifacts, checkpoints, engine as eng
from ..artifacts import RunDir
from ..errors import UserError
from ..macro.segmentation import missing_parser, warm_up
from ..seeding import derived_seed
from . import common, credit, loop
from .experience import RolloutSettings, make_experience
from .forward import TokenValues, disable_dropout
from .generation import GenerationModel
from .monitor import Monitor
from .ppo_checkpoints import latest_common, resume, save
from .ppo_eval import evaluate
from .rewards import RewardFn, RewardModelReward
from .update import UpdateSettings, ppo_update

STAGE = "ppo"


# ---------------------------------------------------------------------------------------
# names, inputs and option checks


def run_name(config) -> str:
    """``--name``, or one derived from the credit assignment (vanilla, fixed5, ppl, ...)."""
    if config.name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.name):
            raise UserError(f"--name '{config.name}': use letters, digits, '.', '_' and '-' only")
        return config.name
    k = group_size(config)
    suffix = "" if k == DEFAULT_GROUP_SIZE[config.advantage] else f"-k{k}"
    if is_critic_free(config):
        return config.advantage + ("" if config.ratio == "token" else f"-{config.ratio}-ratio") + suffix
    rule = credit.make_rule(config)
    if credit.is_vanilla(rule):
        return "vanilla" + suffix
    name = f"fixed{'-inf' if math.isinf(rule.n) else int(rule.n)}" if rule.name == "fixed" else rule.name
    if config.value_function != "equal":
        name += f"-{config.value_function}"
    if config.ratio != "token":
        name += f"-{config.ratio}-ratio"
    return name + suffix


# responses per prompt when --samples-per-prompt is not given
DEFAULT_GROUP_SIZE = {"gae": 1, "rloo": 4, "grpo": 4}


def is_critic_free(config) -> bool:
    """rloo and grpo: the baseline comes from the group, there is no critic."""
    return config.advantage in ("rloo", "grpo")


def group_size(config) -> int:
    """K, the responses sampled per prompt (``--samples-per-prompt``, or the estimator's default)."""
    return config.samples_per_prompt if config.samples_per_prompt is not None else DEFAULT_GROUP_SIZE[config.advantage]


def check_critic_free_flags(config, critic_flags: Sequence[str]) -> None:
    """A critic-free run given critic or macro-action flags on the command line is a user
    error (those flags could only be silently ignored); values from a preset or a config file
    simply do not apply, and the start-up line says what runs."""
    if is_critic_free(config) and critic_flags:
        raise UserError(
            f"--advantage {config.advantage} trains no critic and assigns credit per response: "
            f"{', '.join(critic_flags)} do not apply (drop them, or use --advantage gae)"
        )


REWARDS = ("model", "apps")


def describe(config, rule) -> str:
    """The start-up line's account of what this run does (also run.json's credit_assignment)."""
    k = group_size(config)
    if config.advantage == "rloo":
        what = f"RLOO (no critic: {k} responses per prompt, leave-one-out baseline, KL penalty in the reward"
    elif config.advantage == "grpo":
        what = f"GRPO (no critic: {k} responses per prompt, group-normalised score, KL loss k3 x {config.kl_coef:g}"
    else:
        return credit.describe(rule, config.value_function, config.ratio) + (f", {k} responses per prompt" if k > 1 else "")
    ratio = "one ratio per response" if config.ratio == "macro" else "token ratios"
    return what + f"; {ratio}; termination rules and value functions do not apply)"


def reward_kind(config) -> str:
    """``--reward``, or by default ``apps`` for the APPS dataset (its reward is the tests'
    outcome, docs/method.md "Program rewards") and ``model`` (the reward model) for everything else."""
    if config.reward:
        return config.reward
    return "apps" if config.dataset == "apps" else "model"


def model_sources(config, run_dir: RunDir) -> tuple[str, str]:
    """(policy, critic source): the flags, else the run's sft/ and rm/ (or a 'run X first' error).

    With ``--reward apps`` there is no reward model: the critic starts from the policy
    (docs/method.md "Program rewards") unless ``--reward-model`` names one.
    """
    policy = str(config.policy) if config.policy else str(run_dir.require("sft"))
    if config.reward_model:
        return policy, str(config.reward_model)
    if reward_kind(config) == "apps":
        return policy, policy
    return policy, str(run_dir.require("rm"))


def make_reward(config) -> RewardFn | None:
    """The reward named by ``--reward`` when it is not the reward model (built with the models)."""
    if reward_kind(config) == "apps":
        from ..rewards.apps import AppsReward

        return AppsReward()  # the compiler signal: run the response against the problem's tests
    return None


def check_options(config) -> None:
    """One-line errors for combinations of values the stage cannot run with (each value on its
    own was checked when the options were resolved: config.ACCEPTS)."""
    try:
        rule = credit.make_rule(config)
    except ValueError as err:
        raise UserError(str(err)) from None
    k = group_size(config)
    if k < (2 if is_critic_free(config) else 1):
        least = "2 (a group baseline needs other responses)" if is_critic_free(config) else "1"
        raise UserError(f"--samples-per-prompt must be at least {least} with --advantage {config.advantage}, got {k}")
    missing = None if is_critic_free(config) else missing_parser(rule)  # before any model is loaded
    if missing:
        raise UserError(f"--termination parsing needs a parser: {missing}")
    processes = eng.world_size()
    if responses_per_step(config) % config.mini_batch_size:
        raise UserError(
            f"the {responses_per_step(config)} responses of a step (--rollout-batch-size {config.rollout_batch_size} x "
            f"--samples-per-prompt {k}) must be a multiple of --mini-batch-size {config.mini_batch_size}"
        )
    if config.rollout_batch_size % processes:
        raise UserError(f"--rollout-batch-size {config.rollout_batch_size} must be a multiple of the {processes} processes")
    eng.micro_batch_size(config.mini_batch_size, config.gradient_accumulation_steps, processes)


def fingerprint(config, name: str, prompts: int) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it."""
    keys = ("seed", "rollout_batch_size", "mini_batch_size", "ppo_epochs", "max_steps", "termination", "n",
            "value_function", "ratio", "policy", "reward_model", "reward", "advantage")  # fmt: skip
    return {"name": name, "prompts": prompts, "samples_per_prompt": group_size(config), **{k: getattr(config, k) for k in keys}}


def responses_per_step(config) -> int:
    """Responses generated per PPO step over all processes: prompts x K."""
    return config.rollout_batch_size * group_size(config)


# ---------------------------------------------------------------------------------------
# data order


@dataclass
class PromptSchedule:
    """Which prompts step s uses: a pure function of (seed, s), cycling through epochs."""

    records: Sequence[dict]
    batch_size: int  # global
    seed: int

    def __post_init__(self):
        if len(self.records) < self.batch_size:
            raise UserError(
                f"only {len(self.records)} PPO prompts for --rollout-batch-size {self.batch_size}: "
                "lower it, raise --max-records if you set it, or use a dataset with more prompts"
            )

    def indices(self, step: int) -> list[int]:
        return loop.global_batch(len(self.records), self.batch_size, self.seed, step)

    def for_rank(self, step: int, rank: int, processes: int, group: int = 1) -> tuple[list[dict], list[int]]:
        """This process's records of step ``step``, each repeated ``group`` times in a row (a
        group never spans processes), and the global sample number of every response."""
        per = self.batch_size // processes
        chosen = self.indices(step)[rank * per : (rank + 1) * per]
        first = step * self.batch_size + rank * per  # the global number of this rank's first prompt
        numbers = [(first + i) * group + j for i in range(per) for j in range(group)]
        return [self.records[i] for i in chosen for _ in range(group)], numbers


# ---------------------------------------------------------------------------------------
# the models


@dataclass
class Models:
    actor: Any  # DeepSpeed engine around the policy
    critic: Any  # DeepSpeed engine around TokenValues(reward-model copy); None for rloo/grpo
    reference: Any  # frozen policy copy
    reward: RewardFn
    tokenizer: Any
    device: Any
    sampler: GenerationModel  # the actor as a module that samples (a whole copy under ZeRO-3)


def optimizer_steps(config) -> int:
    """Optimizer steps per engine over the run (for the learning-rate schedule)."""
    return config.max_steps * config.ppo_epochs * (responses_per_step(config) // config.mini_batch_size)


def build_models(config, policy: str, reward_model: str, reward_fn: RewardFn | None) -> Models:
    """Actor and critic engines (no critic for rloo/grpo), the frozen reference, the reward,
    and the tokenizer."""
    from ..models import load_causal_lm, load_reward_model, load_tokenizer

    tokenizer = load_tokenizer(policy, padding_side="left")
    dtype = config.dtype
    actor_model = load_causal_lm(policy, dtype=dtype)
    reference = load_causal_lm(policy, dtype=dtype)
    critic_model = None if is_critic_free(config) else load_reward_model(reward_model, dtype=dtype)
    for model in (actor_model, reference, critic_model):
        if model is not None:
            disable_dropout(model)
            model.config.pad_token_id = tokenizer.pad_token_id
    if critic_model is not None:
        _check_vocabulary(critic_model, tokenizer, reward_model, policy)
    total = optimizer_steps(config)
    actor = eng.build_engine(actor_model, config, lr=config.actor_lr, batch_size=config.mini_batch_size, total_steps=total)
    critic = None
    if critic_model is not None:
        critic = eng.build_engine(
            TokenValues(critic_model), config, lr=config.critic_lr, batch_size=config.mini_batch_size, total_steps=total
        )
    device = actor.device
    reference.eval().requires_grad_(False)
    reference.to("cpu" if config.offload_frozen else device)
    if reward_fn is None:
        rm = load_reward_model(reward_model, dtype=dtype)
        _check_vocabulary(rm, tokenizer, reward_model, policy)
        disable_dropout(rm)
        rm.eval().requires_grad_(False)
        rm.to("cpu" if config.offload_frozen else device)
        reward_fn = RewardModelReward(rm, batch_size=micro_batch(config))
    def whole_copy():
        model = load_causal_lm(policy, dtype=dtype)
        disable_dropout(model)
        return model

    return Models(actor, critic, reference, reward_fn, tokenizer, device, GenerationModel(actor, whole_copy))


def _check_vocabulary(model, tokenizer, source: str, policy: str) -> None:
    """The reward model (and the critic made from it) reads the policy's token ids."""
    if model.config.vocab_size < len(tokenizer):
        raise UserError(f"--reward-model '{source}' does not share the vocabulary of --policy '{policy}'")


def micro_batch(config) -> int:
    """Sequences per forward in each process (the engines' micro batch)."""
    return config.mini_batch_size // (config.gradient_accumulation_steps * eng.world_size())


# ---------------------------------------------------------------------------------------
# one step of Algorithm 1


@dataclass
class Context:
    """Everything a step needs, built once."""

    config: Any
    models: Models
    rule: Any
    schedule: PromptSchedule
    rollout: RolloutSettings
    update: UpdateSettings
    executor: Any = None  # a process pool for the parsing/code rules (--parse-workers)

    @property
    def critic_free(self) -> bool:
        return is_critic_free(self.config)


def make_context(config, models: Models, records: Sequence[dict]) -> Context:
    """The step's settings from the config (also what the benchmarks build)."""
    micro = micro_batch(config)
    # GRPO puts the KL to the reference in the loss (beta * k3), not in the reward
    kl_in_loss = config.advantage == "grpo"
    rollout = RolloutSettings.from_config(config, forward_batch_size=micro)
    return Context(
        config=config, models=models, rule=credit.make_rule(config),
        schedule=PromptSchedule(records, config.rollout_batch_size, config.seed),
        rollout=dataclasses.replace(rollout, kl_coef=0.0) if kl_in_loss else rollout,
        update=UpdateSettings(
            epochs=config.ppo_epochs, mini_batch_size=config.mini_batch_size // eng.world_size(),
            micro_batch_size=micro, clip_range=config.clip_range, value_clip_range=config.value_clip_range,
            ratio=config.ratio, temperature=config.temperature, kl_loss_coef=config.kl_coef if kl_in_loss else 0.0,
        ),
    )  # fmt: skip


def ppo_step(ctx: Context, step: int) -> dict[str, float]:
    """One iteration of Algorithm 1 (0-based ``step``); returns the step's metrics."""
    config, models = ctx.config, ctx.models
    rank, processes = eng.rank(), eng.world_size()
    began = time.perf_counter()
    torch.manual_seed(derived_seed(config.seed, step, rank, "rollout"))

    # 1. a batch of prompts, each repeated K times (a group; K = 1 for PPO / MA-PPO)
    records, sample_numbers = ctx.schedule.for_rank(step, rank, processes, group_size(config))

    # 2-3. sample responses with the actor; old/ref log-probs, values, rewards. A text rule
    # with a --parse-workers pool starts parsing as soon as the responses exist, so the
    # parser runs while the scoring forwards do.
    segmentation: dict[str, Any] = {}  # the parse started on the pool, if any

    def start_segmentation(response_ids, mask):
        if ctx.critic_free:
            return
        segmentation["pending"] = credit.start_segmentation(
            ctx.rule, response_ids, mask, tokenizer=models.tokenizer, sample_seeds=sample_numbers, executor=ctx.executor
        )

    experience = make_experience(
        models.actor, models.reference, models.critic, models.reward, models.tokenizer,
        [r["prompt"] for r in records], records, ctx.rollout,
        device=models.device, sampler=models.sampler.model(), on_sampled=start_segmentation,
    )  # fmt: skip

    # 4-5. macro actions from the termination rule; GAE over segments, broadcast to tokens
    # (rloo / grpo: one advantage per response from its group, no critic)
    credited = time.perf_counter()
    if ctx.critic_free:
        credit.assign_group_credit(
            experience, config.advantage, group_size(config), whiten_advantages=config.whiten_advantages
        )
    else:
        credit.assign_credit(
            experience, ctx.rule, tokenizer=models.tokenizer, gamma=config.gamma, lam=config.lam,
            value_function=config.value_function, whiten_advantages=config.whiten_advantages,
            sample_seeds=sample_numbers, executor=ctx.executor, pending=segmentation.get("pending"),
        )  # fmt: skip
    credit_seconds = time.perf_counter() - credited

    # 6. PPO epochs over minibatches: clipped policy loss (actor), clipped value loss (critic;
    # grpo adds beta * KL to the policy loss instead of the KL penalty in the reward)
    trained = time.perf_counter()
    generator = torch.Generator().manual_seed(derived_seed(config.seed, step, rank, "minibatches"))
    update_stats = ppo_update(models.actor, models.critic, experience, ctx.update, generator=generator)
    training_seconds = time.perf_counter() - trained

    timings = {
        "generation_time": experience.generation_seconds,
        "scoring_time": experience.scoring_seconds,
        "credit_time": credit_seconds,
        "training_time": training_seconds,
    }
    metrics = reduce_metrics(experience, update_stats, timings)
    metrics["step_time"] = time.perf_counter() - began
    metrics["tokens_per_second"] = metrics["response_tokens"] / max(metrics["step_time"], 1e-9)
    metrics["actor_lr"] = eng.current_lr(models.actor)
    if models.critic is not None:
        metrics["critic_lr"] = eng.current_lr(models.critic)
    return metrics


def reduce_metrics(experience, update_stats: dict[str, float], timings: dict[str, float]) -> dict[str, float]:
    """Rollout and update metrics averaged over every process's samples."""
    mask = experience.mask.float()
    lengths = mask.sum(dim=1)
    stats = experience.segment_stats
    sums = {
        "samples": float(experience.batch_size),
        "response_tokens": float(lengths.sum()),
        "score": float(experience.raw_scores.sum()),
        "placed_score": float(experience.scores.sum()),
        "reward": float(experience.rewards.sum()),
        "kl": float(experience.kl_k1.sum()),
        "kl_estimate": float(experience.kl.sum()),
        "eos": float(experience.has_eos.float().sum()),
        "value": float((experience.values * mask).sum()),
        "advantage": float((experience.advantages * mask).sum()),
        "return": float((experience.returns * mask).sum()) if experience.returns is not None else 0.0,
        "segments": float(stats.segments),
        "segment_tokens": float(stats.tokens),
        "fallbacks": float(stats.fallbacks),
        **{f"update:{k}": v for k, v in update_stats.items()},
        **{f"time:{k}": v for k, v in timings.items()},
    }
    keys = sorted(sums)
    totals = eng.all_reduce_sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64)).tolist()
    total = dict(zip(keys, totals))
    samples, tokens, processes = total["samples"], max(total["response_tokens"], 1.0), eng.world_size()
    out = {
        "score": total["score"] / samples,  # the reward function's raw score (RM score)
        "placed_score": total["placed_score"] / samples,  # clipped, minus the missing-EOS penalty
        "reward": total["reward"] / samples,  # sum of per-token rewards: score - kl_coef * KL
        "kl": total["kl"] / samples,  # sequence KL(pi || ref), k1 estimate
        "kl_estimate": total["kl_estimate"] / samples,  # the estimator used in the reward
        "response_length": total["response_tokens"] / samples,
        "eos_rate": total["eos"] / samples,
        "value": total["value"] / tokens,
        "advantage": total["advantage"] / tokens,
        "return": total["return"] / tokens,
        "segment_length": total["segment_tokens"] / max(total["segments"], 1.0),
        "segments_per_response": total["segments"] / samples,
        "responses": samples,  # generated this step, over all processes: prompts x K
        "parse_fallbacks": total["fallbacks"],
        "response_tokens": total["response_tokens"],
    }
    for key, value in total.items():
        if key.startswith("update:"):
            out[key.split(":", 1)[1]] = value / processes
        elif key.startswith("time:"):
            out[key.split(":", 1)[1]] = value / processes
    return out


# ---------------------------------------------------------------------------------------
# checkpoints (ppo_checkpoints.py): where they live


def checkpoint_root(run_dir: RunDir, name: str) -> Path:
    return run_dir.stage_dir(STAGE, name) / "checkpoints"


# ---------------------------------------------------------------------------------------
# the stage


def _live(metrics: dict[str, float]) -> dict[str, float]:
    return {
        "score": metrics["score"], "kl": metrics["kl"], "seg": metrics["segment_length"],
        "s/step": metrics["step_time"],
    }  # fmt: skip


def run(config, *, reward_fn: RewardFn | None = None) -> dict[str, Any]:
    """Train with PPO / MA-PPO and write the run's outputs; returns the final metrics.

    ``reward_fn`` replaces the reward named by ``--reward`` as the source of scores (tests use
    a synthetic reward); the critic still starts from ``--reward-model`` (default: rm/, or the
    policy with the APPS reward).
    """
    from . import ppo_report

    common.start(config)
    check_options(config)
    run_dir = RunDir(config.run_dir)
    name = run_name(config)
    policy, reward_model = model_sources(config, run_dir)
    prompts = common.load_split(config, "ppo", config.max_records)
    held_out = common.load_split(config, "eval", config.eval_prompts, report=False).records if config.eval_prompts else []
    models = build_models(config, policy, reward_model, reward_fn or make_reward(config))
    ctx = make_context(config, models, prompts.records)
    rule = ctx.rule
    stage_key = f"{STAGE}/{name}"
    root = checkpoint_root(run_dir, name)
    expected = fingerprint(config, name, len(prompts.records))
    start = 0
    if config.resume:
        start = resume(ctx, root, expected)
    else:
        if eng.is_main() and latest_common(root, critic=not ctx.critic_free) is not None:
            common.say(f"fresh run: removing old checkpoints in {root} (pass --resume to continue them)")
        checkpoints.clear_checkpoints(root)
    if start == 0:  # nothing to continue: an earlier run's model and samples must not outlive this one's start
        common.clear_previous_outputs(run_dir, STAGE, name)
    what_runs = describe(config, rule)
    common.say(f"ppo '{name}': {what_runs}")
    k = group_size(config)
    per_step = f"{config.rollout_batch_size} prompts x {k} = {responses_per_step(config)} responses" if k > 1 else f"{config.rollout_batch_size} responses"
    common.say(
        f"policy {policy}, reward {models.reward.name}"
        + ("" if ctx.critic_free else f", critic from {reward_model}")
        + f", {len(prompts.records)} prompts, {config.max_steps} steps of {per_step}, {eng.world_size()} process(es)"
        + (f", resuming at step {start}" if start else "")
    )
    inputs = {
        "policy": policy, "reward_model": reward_model, "reward": models.reward.name, "dataset": config.dataset,
        "data_file": config.data_file, "source": prompts.source, "prompts": len(prompts.records),
        "eval_prompts": len(held_out), "processes": eng.world_size(), "credit_assignment": what_runs,
        "responses_per_step": responses_per_step(config),
    }  # fmt: skip
    common.record(run_dir, stage_key, config, inputs, None, status="running")
    if rule.needs_text and config.parse_workers > 0 and not ctx.critic_free:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: this process holds DeepSpeed's and OpenMP's threads (and maybe CUDA)
        spawn = multiprocessing.get_context("spawn")
        ctx.executor = ProcessPoolExecutor(max_workers=config.parse_workers, mp_context=spawn)
        for _ in range(config.parse_workers):  # workers load the parser during the first evaluation
            ctx.executor.submit(warm_up, rule)
    monitor = Monitor(run_dir, f"{STAGE}-{name}", total_steps=config.max_steps, start_step=start, enabled=eng.is_main())
    last: dict[str, float] = {}
    rows: list[dict] = []
    durations: list[float] = []
    try:
        if held_out and start == 0 and config.eval_every:
            scores, rows = evaluate(ctx, held_out, 0)
            monitor.log(0, scores, "eval")
        for step in range(start, config.max_steps):
            last = ppo_step(ctx, step)
            done = step + 1
            durations.append(last["step_time"])
            monitor.log(done, last, "train")
            monitor.advance(done, _live(last))
            final = done == config.max_steps
            if held_out and (final or (config.eval_every and done % config.eval_every == 0)):
                scores, rows = evaluate(ctx, held_out, done)
                monitor.log(done, scores, "eval")
            if config.save_every and done % config.save_every == 0 and not final:
                save(ctx, root, done, {"fingerprint": expected, "stage": stage_key})
    finally:
        monitor.close()
        if ctx.executor is not None:
            ctx.executor.shutdown()
        if hasattr(models.reward, "close"):
            models.reward.close()
    out_dir = run_dir.stage_dir(STAGE, name)
    # the critic first: the actor's config.json is what marks ppo/<name> as finished
    if models.critic is not None:
        checkpoints.export_pretrained(models.critic, out_dir / "critic", tokenizer=models.tokenizer, unwrap=lambda m: m.model)
    checkpoints.export_pretrained(models.actor, out_dir, tokenizer=models.tokenizer)
    metrics: dict[str, Any] = {}
    if eng.is_main():
        # the whole history, including the part before a resume
        history = artifacts.read_jsonl(monitor.path) if monitor.path.is_file() else []
        metrics = final_metrics(last, history, durations, start)
        if rows:
            artifacts.write_jsonl(run_dir.samples_path(name), rows)
        for metric in ("score", "kl", "reward"):
            monitor.plot(metric, title=f"ppo {name}: {metric}", xlabel="PPO step")
        ppo_report.print_final_table(name, history, metrics)
    common.record(run_dir, stage_key, config, inputs, metrics, status="finished")
    return metrics


def final_metrics(last: dict, history: list[dict], durations: list[float], start: int) -> dict[str, Any]:
    """run.json's summary: the last step's rollout metrics and the eval curve's ends."""
    keys = ("score", "reward", "kl", "response_length", "segment_length", "parse_fallbacks")
    metrics: dict[str, Any] = {k: last[k] for k in keys if k in last}
    metrics["steps"] = max((row["step"] for row in history), default=start + len(durations))
    timed = durations[1:] or durations  # the first step includes one-off warm-up
    if timed:
        metrics["seconds_per_step"] = round(sum(timed) / len(timed), 4)
    evals = [row for row in history if row.get("split") == "eval"]
    if evals:
        metrics["eval_score_start"] = evals[0]["score"]
        metrics["eval_score"] = evals[-1]["score"]
        metrics["eval_response_length"] = evals[-1]["response_length"]
    if start:
        metrics["resumed_from_step"] = start
    return metrics
