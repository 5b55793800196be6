"""``marlhf ppo``: PPO and MA-PPO, Algorithm 1 of Chai et al. (ICLR 2025).

Each step of :func:`run` is one iteration of the paper's Algorithm 1::

    for step in 1 .. max_steps:
        x        ~ the PPO prompts                       (PromptSchedule)
        y        ~ pi_old(. | x), with old/ref log-probs, critic values and the RM score
                                                         (experience.make_experience)
        segments = termination rule on y                 (estimators: --advantage)
        A, Q     = GAE over segments, broadcast to tokens (or: group baseline; mc's sampled values)
        for epoch, minibatch: clipped policy and value updates (update.ppo_update)

MA-PPO and PPO are the same code: ``--termination fixed --n 1`` makes every token its own
segment, which is token-level PPO exactly (tested), and the run says so when it starts.
``--advantage`` picks steps 4-5 from a registry of estimators (:mod:`.estimators`): ``gae``
(the above), ``rloo|grpo`` (a group baseline over ``--samples-per-prompt`` responses to each
prompt, :mod:`marlhf_cli.macro.baselines`) and ``mc`` (the macro actions' boundary values
from continuations sampled by the policy, :mod:`marlhf_cli.macro.montecarlo`); the last
three build, train, checkpoint and export no critic.

Inputs: the policy and reference come from the run's SFT model, the critic and the reward
from its reward model (``--policy`` / ``--reward-model`` override; the ``tiny`` alias works
for both). With ``--reward apps`` (the default for ``--dataset apps``) the score is the
generated program's test outcome, with ``--reward py:FILE.py:FUNCTION`` the user's function's
(:mod:`marlhf_cli.rewards.function`), with several of them (``--reward model,py:f.py:g``)
their ``--reward-weights`` sum; without ``model`` among them no rm/ is needed and the critic starts from the
policy. A reward function that fails stops every process with the last completed step
checkpointed (:mod:`.stopping`). Outputs under the run directory: ``ppo/<name>/`` (actor, ``critic/``,
``checkpoints/``), ``metrics/ppo-<name>.jsonl``, ``tb/ppo-<name>/``, ``plots/ppo-<name>-*.png``,
``samples/<name>.jsonl`` and the ``ppo/<name>`` entry of ``run.json``.

Reproducibility: the prompts of step s are a pure function of (seed, s), and every random
draw of step s (sampling, randomized segments, minibatch order) comes from generators seeded
with (seed, s, rank). A run resumed from a checkpoint at step k therefore repeats exactly
what the uninterrupted run did after step k (on a CPU; GPU kernels may not be bitwise
deterministic).

The package, in the order a step uses it: ``settings`` (name, estimator, group size, option
checks), ``models`` (engines, reference, reward), ``context`` (prompt schedule, per-step
settings), ``sampling`` and ``experience`` (the rollout), ``rewards`` (where scores come
from), ``credit`` (termination rule -> segment advantages, or the group baselines),
``update`` (the PPO epochs), ``metrics``, ``evaluation`` (held-out prompts),
``estimators`` (the --advantage registry), ``continuations`` (mc's sampled values),
``checkpointing`` (resume), ``sampling_copy`` (ZeRO-3's sampling copy) and ``report`` (final
table, ``--compare``). Its command-line flags are in :mod:`marlhf_cli.train.flags`, which
loads no torch.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ... import artifacts, checkpoints, engine as eng, lora
from ...artifacts import RunDir
from ...data.records import PROMPT_KINDS
from ...errors import UserError
from ...generation import compiled
from ...macro.segmentation import warm_up
from ...models import check_context, check_heads
from ...seeding import derived_seed
from ...wording import count
from .. import common
from ..monitor import Monitor, as_logged
from . import before_after, completions, credit, critic_fit, episodes, stopping, value_head
from .checkpointing import check_resumable, checkpoint_root, extend, latest_common, mark_finished, resume, save
from .context import Context, make_context
from ...episodes import episode_tokens
from .estimators import CreditInputs, mc_cost
from .evaluation import evaluate, held_out_prompts
from .experience import make_experience
from .metrics import final_metrics, live_metrics, reduce_metrics
from .models import build_models, check_rollout_memory
from ...scoring.rewards import RewardFn
from ..sources import model_sources, uses_reward_model
from .settings import STAGE, RunPlan, fingerprint, make_rewards, plan_run, run_name  # RunPlan, run_name: for callers
from .update import ppo_update


def run(config, *, reward_fn: RewardFn | None = None, given_flags: Sequence[str] = ()) -> dict[str, Any]:
    """Train with PPO / MA-PPO and write the run's outputs; returns the final metrics.

    ``reward_fn`` replaces the reward named by ``--reward`` as the source of scores (tests use
    a synthetic reward); the critic still starts from ``--reward-model`` (default: rm/, or the
    policy with the APPS reward). ``given_flags``: the estimator-specific flags typed on the
    command line (one the estimator does not read is an error: settings.plan_run).
    """
    plan = plan_run(config, given_flags)  # what the run is: estimator, rule, K, name; all below read it
    with RunDir(config.run_dir).writing(f"{STAGE}/{plan.name}"):  # one writer of ppo/<name> at a time
        return _train(config, plan, reward_fn)


def _train(config, plan: RunPlan, reward_fn: RewardFn | None) -> dict[str, Any]:
    """:func:`run` once its plan is made and it holds the run's outputs."""
    # inputs: the policy (actor and reference), the critic's and the reward's source, prompts
    common.start(config)
    run_dir = RunDir(config.run_dir)
    policy, reward_model = model_sources(config, run_dir)  # after the option checks: those are fixed first
    # resolved before anything is fingerprinted (as --dtype auto is), so a resume compares it
    config.generation, generation_why = compiled.resolve(config.generation)
    name = plan.name
    # a causal LM as the reward (a random score head), a reward model as the policy: refused unless asked
    scores_with_model = reward_fn is None and uses_reward_model(config)
    head_notes = check_heads(policy=policy, reward_model=reward_model if scores_with_model else None, allow=config.allow_new_head)
    for model in dict.fromkeys((policy, reward_model)):  # before any weight loads
        if config.env:  # a whole episode after the prompt
            check_context(model, config.max_prompt_length, episode_tokens(config), prompt_flag="--max-prompt-length",
                          response_flag="--max-episode-tokens")  # fmt: skip
        else:
            check_context(model, config.max_prompt_length, config.max_new_tokens, prompt_flag="--max-prompt-length",
                          response_flag="--max-new-tokens")  # fmt: skip
    check_rollout_memory(config, plan, policy)  # before any weight loads
    prompts = common.load_split(config, "ppo", config.max_records).require(STAGE, PROMPT_KINDS)
    root = checkpoint_root(run_dir, name)
    expected = {**fingerprint(config, plan, len(prompts.records)), **lora.base_identity(config, policy=policy, reward_model=reward_model)}
    extension = None  # or a finished run made longer: its exports are the start (train/extending.py)
    if config.resume:  # before any model loads: nothing to resume, or a changed option, is one line
        extension = check_resumable(root, expected, config, critic=plan.critic)
    held_out = held_out_prompts(config)
    evaluated = f"{count(len(held_out), 'distinct held-out prompt')} for evaluation"
    common.say(common.describe_records(STAGE, prompts, evaluated, bool(config.split_shares)))
    rewards = [("reward", reward_fn)] if reward_fn is not None else make_rewards(config)
    for _, reward in rewards:
        if hasattr(reward, "check_records"):  # a Python function: the record fields it needs exist
            reward.check_records(prompts.records + held_out, f"the records of {prompts.source}")
    models = build_models(config, plan, policy, reward_model, reward_fn if reward_fn is not None else rewards, extension)
    compiled.announce(config, generation_why, models.sampler.module, device=models.device, say=common.say,
                               rows=plan.responses_per_step // eng.world_size())  # fmt: skip
    ctx = make_context(config, plan, models, prompts.records)
    stage_key = f"{STAGE}/{name}"  # the run's entry in run.json
    start = _resume_or_start_fresh(ctx, run_dir, name, root, expected, extension)
    inputs = _announce(ctx, run_dir, name, stage_key, policy, reward_model, prompts, len(held_out), start)
    for note in head_notes:
        common.say(note)
    _start_parse_pool(ctx)

    # Algorithm 1's outer loop: one PPO step per iteration, held-out evaluation and resume
    # checkpoints on their schedules
    monitor = Monitor(run_dir, f"{STAGE}-{name}", total_steps=config.max_steps, start_step=start, enabled=eng.is_main(), config=config)
    # the critic's fit pooled over its last steps (critic_fit.py), carried across a resume
    fit = critic_fit.last_window(artifacts.read_jsonl(monitor.path) if start and monitor.path.is_file() else [])
    last: dict[str, float] = {}
    rows: list[dict] = []  # the latest evaluation's samples
    durations: list[float] = []
    completed, saved = start, start  # steps whose update finished; the newest checkpoint's step
    checkpoint_state = {"fingerprint": expected, "stage": stage_key}
    before = run_dir.samples_path(name + before_after.BEFORE_SUFFIX)
    if start == 0 and eng.is_main():
        before.unlink(missing_ok=True)  # another run of this name's, never this one's
    try:
        if held_out and (start == 0 and config.eval_every or start == config.max_steps):
            # (a run resumed at its last step, whose evaluation failed, evaluates it now)
            scores, rows = evaluate(ctx, held_out, start)
            monitor.log(start, scores, "eval")
            if start == 0 and eng.is_main():  # what the end compares with, whatever resumes between
                artifacts.write_jsonl(before, rows)
        for step in range(start, config.max_steps):
            last = ppo_step(ctx, step)
            if not ctx.critic_free:  # from the figures as logged: a resumed run reads them back
                fit = (fit + [as_logged(last)])[-critic_fit.FIT_WINDOW :]
                last["explained_variance_pooled"] = critic_fit.pooled_explained_variance(fit)
                last["explained_variance_within"] = critic_fit.within_step_explained_variance(fit)
            completed = done = step + 1
            durations.append(last["step_time"])
            monitor.log(done, last, "train")
            monitor.advance(done, live_metrics(last))
            final = done == config.max_steps
            if ctx.completions:
                monitor.table(done, "completions", completions.COLUMNS, ctx.completions)
            if held_out and ctx.evaluates(done):
                scores, rows = evaluate(ctx, held_out, done)
                monitor.log(done, scores, "eval")
            if config.save_every and done % config.save_every == 0 and not final:
                save(ctx, root, done, checkpoint_state)
                saved = done
    except UserError as error:
        if not stopping.stopped_everywhere(error):
            raise
        # the reward failed while scoring, and every process knows (stopping.agree)
        error = stopping.stop(ctx, error, root, completed, saved, checkpoint_state)
        common.record(run_dir, stage_key, config, inputs, None, status="failed")
        eng.barrier()  # no process exits (and gets the others killed by torchrun) before run.json says so
        raise error
    finally:
        monitor.close()
        if ctx.executor is not None:
            ctx.executor.shutdown()
        if hasattr(models.reward, "close"):
            models.reward.close()

    _export_models(models, run_dir.stage_dir(STAGE, name))
    mark_finished(ctx, root, checkpoint_state)  # once exported: what a longer --max-steps extends
    metrics: dict[str, Any] = {}
    if eng.is_main():
        metrics = _report(monitor, run_dir, name, last, rows, durations, start, show_samples=config.show_samples)
        if extension is not None:
            metrics = {k: v for k, v in metrics.items() if k != "resumed_from_step"} | {"extended_from_step": start}
    common.record(run_dir, stage_key, config, inputs, metrics, status="finished")
    common.push_if_asked(config, run_dir.stage_dir(STAGE, name))
    return metrics


def ppo_step(ctx: Context, step: int) -> dict[str, float]:
    """One iteration of Algorithm 1 (0-based ``step``); returns the step's metrics."""
    config, models = ctx.config, ctx.models
    rank, processes = eng.rank(), eng.world_size()
    began = time.perf_counter()
    torch.manual_seed(derived_seed(config.seed, step, rank, "rollout"))

    # 1. a batch of prompts, each repeated K times (a group; K = 1 for PPO / MA-PPO; tree: K^D)
    records, sample_numbers = ctx.schedule.for_rank(step, rank, processes, ctx.plan.group_size)

    # 2-3. sample responses with the actor (tree: a tree per prompt, its leaves the
    # responses); old/ref log-probs, values, rewards. A text rule
    # with a --parse-workers pool starts parsing as soon as the responses exist, so the
    # parser runs while the scoring forwards do.
    estimator = ctx.estimator
    sampler = models.sampler.model()
    segmentation: dict[str, Any] = {}  # the parse started on the pool, if any

    def start_segmentation(response_ids, mask):
        # a tree's segments are its levels; an episode's are cut turn by turn (credit.segment_episodes)
        if estimator.segments and estimator.draws is None and ctx.episodes is None:
            segmentation["pending"] = credit.start_segmentation(
                ctx.rule, response_ids, mask, tokenizer=models.tokenizer, sample_seeds=sample_numbers, executor=ctx.executor
            )

    draw = estimator.draws(ctx, step, sample_numbers) if estimator.draws else None
    if ctx.episodes is not None:  # --env: each row an episode, its environment seeded by (seed, step, sample number)
        draw = episodes.draw(ctx, step, records, sample_numbers)
    failure = None
    try:
        experience = make_experience(
            models.actor, models.reference, models.critic, models.reward, models.tokenizer,
            [ctx.chat.prompt(r) for r in records], records, ctx.rollout,
            device=models.device, sampler=sampler, on_sampled=start_segmentation,
            draw=draw,
        )  # fmt: skip
    except UserError as error:  # a user's reward function failed: before this step's update
        failure = error
    else:
        failure = stopping.not_finite(experience, None, step + 1)
    stopping.agree(failure)  # every process stops, or none

    # 4-5. credit assignment by the --advantage estimator (estimators.py): gae cuts responses
    # into macro actions and runs GAE over them, broadcast to tokens; rloo / grpo give each
    # response one advantage from its group; mc values each macro action's boundaries by
    # sampling continuations from them; tree reads its values off the leaves of each node
    credited = time.perf_counter()
    estimator.assign(experience, CreditInputs(ctx, step, sample_numbers, sampler, segmentation.get("pending")))
    credit_seconds = time.perf_counter() - credited
    # the trackers' table at evaluation steps: the rollout's responses with their macro actions
    ctx.completions = completions.rows(experience, models.tokenizer) if eng.is_main() and ctx.evaluates(step + 1) else None

    # 6. PPO epochs over minibatches: clipped policy loss (actor), clipped value loss (critic;
    # grpo and mc add beta * KL to the policy loss instead of the KL penalty in the reward).
    # The critic's warm-up steps (--critic-warmup-steps) train the critic alone.
    trained = time.perf_counter()
    warming = step < config.critic_warmup_steps and models.critic is not None
    generator = torch.Generator().manual_seed(derived_seed(config.seed, step, rank, "minibatches"))
    compiled.before_training(sampler)  # the static caches make room for the update unless measured to fit
    update_stats = ppo_update(models.actor, models.critic, experience, ctx.update, generator=generator, train_actor=not warming)
    stopping.agree(stopping.not_finite(experience, update_stats, step + 1))
    compiled.after_training(sampler, models.device)
    training_seconds = time.perf_counter() - trained

    timings = {
        "generation_time": experience.generation_seconds,
        "scoring_time": experience.scoring_seconds,
        "credit_time": credit_seconds,  # mc: continuation_time included
        "continuation_time": experience.continuation_seconds,
        "training_time": training_seconds,
    }
    metrics = reduce_metrics(experience, update_stats, timings, gamma=config.gamma)
    if not estimator.segments:  # one advantage per response: a "segment length" would be the response's
        del metrics["segment_length"]
    metrics["step_time"] = time.perf_counter() - began
    metrics["tokens_per_second"] = metrics["response_tokens"] / max(metrics["step_time"], 1e-9)
    metrics["generation_captures"] = float(compiled.captures(sampler))  # flat after the first steps
    metrics["generation_replays"] = float(compiled.replays(sampler))  # tokens drawn by a recorded step
    metrics["actor_lr"] = eng.current_lr(models.actor)
    if warming:  # reported apart: the actor did not move at this step
        metrics["critic_warmup"] = 1.0
    if models.critic is not None:
        metrics["critic_lr"] = eng.current_lr(models.critic)
    return metrics


# ---------------------------------------------------------------------------------------
# the stage's start and end


def _resume_or_start_fresh(ctx: Context, run_dir: RunDir, name: str, root, expected: dict, extension) -> int:
    """The step to start at: the newest complete checkpoint's with --resume (a finished run's
    last step when ``extension`` makes it longer), else 0 (and an earlier run's checkpoints,
    model and samples are removed so they cannot outlive this start)."""
    start = 0
    if extension is not None:
        start = extend(ctx, root, expected, extension, name)
    elif ctx.config.resume:
        start = resume(ctx, root, expected)
    else:
        if eng.is_main() and latest_common(root, critic=not ctx.critic_free) is not None:
            common.say(f"fresh run: removing old checkpoints in {root} (pass --resume to continue them)")
        checkpoints.clear_checkpoints(root)
    if start == 0:
        common.clear_previous_outputs(run_dir, STAGE, name)
    return start


def _announce(ctx: Context, run_dir: RunDir, name: str, stage_key: str, policy: str, reward_model: str, prompts, eval_prompts: int, start: int) -> dict:
    """The start-up lines, and run.json's entry marked running; returns the run's inputs."""
    config, models = ctx.config, ctx.models
    plan = ctx.plan
    what_runs = plan.describe(config)
    common.say(f"ppo '{name}': {what_runs}")
    if note := ctx.chat.note(ctx.schedule.records):  # plain-text data needs no word
        common.say(note)
    k = plan.group_size
    per_step = (
        f"{count(config.rollout_batch_size, 'prompt')} x {k} = {count(plan.responses_per_step, 'response')}" if k > 1
        else count(config.rollout_batch_size, "response")
    )  # fmt: skip
    critic = "" if ctx.critic_free else ", " + (
        value_head.describe(models.value_head, reward_model, models.value_head_scale, models.value_head_offset) if models.value_head else f"critic from {reward_model}"
    ) + (f" (the first {count(config.critic_warmup_steps, 'step')} train it alone)" if config.critic_warmup_steps else "")
    common.say(
        f"policy {policy}, reward {models.reward.name}"
        + critic
        + f", {count(len(prompts.records), 'prompt')}, {count(config.max_steps, 'step')} of {per_step}, {count(eng.world_size(), 'process')}"
        + (f", resuming at step {start}" if start else "")
    )
    if ctx.estimator.name == "mc":  # its cost is the continuations: say how many a step may sample
        common.say(mc_cost(config, plan.rule, plan.responses_per_step))
    inputs = {
        "policy": policy, "reward_model": reward_model, "reward": models.reward.name, "dataset": config.dataset,
        "data_file": config.data_file, "source": prompts.source, "prompts": len(prompts.records),
        "eval_prompts": eval_prompts, "processes": eng.world_size(), "credit_assignment": what_runs,
        "responses_per_step": plan.responses_per_step, "chat_template": ctx.chat.example(ctx.schedule.records),
    }  # fmt: skip
    common.record(run_dir, stage_key, config, inputs, None, status="running")
    return inputs


def _start_parse_pool(ctx: Context) -> None:
    """--parse-workers > 0 with a text rule: a process pool that parses while the model scores."""
    config = ctx.config
    if not (ctx.rule.needs_text and config.parse_workers > 0 and ctx.estimator.segments):
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: this process holds DeepSpeed's and OpenMP's threads (and maybe CUDA)
    spawn = multiprocessing.get_context("spawn")
    ctx.executor = ProcessPoolExecutor(max_workers=config.parse_workers, mp_context=spawn)
    for _ in range(config.parse_workers):  # workers load the parser during the first evaluation
        ctx.executor.submit(warm_up, ctx.rule)


def _export_models(models, out_dir) -> None:
    # the critic first: the actor's config.json is what marks ppo/<name> as finished
    if models.critic is not None:
        checkpoints.export_pretrained(
            models.critic, out_dir / "critic", tokenizer=models.tokenizer, unwrap=lambda m: m.model, save=models.critic_save
        )
    checkpoints.export_pretrained(models.actor, out_dir, tokenizer=models.tokenizer, save=models.actor_save)


def _report(monitor: Monitor, run_dir: RunDir, name: str, last: dict, rows: list[dict], durations: list[float], start: int,
            show_samples: int = 0) -> dict[str, Any]:
    """Rank 0: the summary metrics, the samples, the plots, the final table, then the
    held-out prompts before and after (``show_samples`` of them) and the paired gain."""
    from . import report

    # the whole history, including the part before a resume
    history = artifacts.read_jsonl(monitor.path) if monitor.path.is_file() else []
    metrics = final_metrics(last, history, durations, start)
    if rows:
        artifacts.write_jsonl(run_dir.samples_path(name), rows)
    plotted = [("score", "score"), ("reward", "reward"), *([("kl", "KL, k1 estimate (unbiased; a step's mean may dip below 0)")] if "kl" in last else []),
               ("advantage_l2", "L2 norm of a response's advantages (mean over responses)"),
               ("q_l2", "L2 norm of a response's Q-values (mean over responses)")]  # fmt: skip
    if "explained_variance_pooled" in last:
        plotted.append(("explained_variance_pooled", f"critic's explained variance, last {critic_fit.FIT_WINDOW} steps pooled"))
        plotted.append(("explained_variance_within", f"critic's explained variance within steps, last {critic_fit.FIT_WINDOW} pooled"))
    for metric, label in plotted:
        monitor.plot(metric, title=f"ppo {name}: {label}", xlabel="PPO step")
    for line in report.critic_lines(history):  # before the table: a run ends on its result
        common.say(line)
    report.print_final_table(name, history, metrics)
    before = run_dir.samples_path(name + before_after.BEFORE_SUFFIX)
    gain = before_after.paired_gain(artifacts.read_jsonl(before), rows) if rows and before.is_file() and metrics["steps"] else None
    if gain is not None:  # the run's result, last
        for line in before_after.sample_lines(artifacts.read_jsonl(before), rows, show_samples):
            common.say(line)
        common.say(before_after.gain_line(gain))
        metrics["eval_gain"] = {key: gain[key] for key in ("prompts", "before", "after", "gain", "gain_ci")}
    return metrics
