"""What a PPO run is, read from its config once: :func:`plan_run` resolves the estimator, the
termination rule, the group size and the name into a :class:`RunPlan` (checking the
combinations of options on the way), and every part of the stage reads that plan; nothing
derives them again from the raw options. Also the run's inputs (models, rewards) and its
fingerprint. Pure functions of the config (and the run directory); nothing here loads a model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ... import engine as eng
from ...errors import UserError
from ...macro import TerminationRule
from ...macro.segmentation import missing_parser
from ...wording import count
from . import credit
from .estimators import ESTIMATORS, Estimator
from ..sources import reward_specs
from ...scoring.rewards import RewardFn

STAGE = "ppo"


@dataclass(frozen=True)
class RunPlan:
    """What a PPO run is, resolved once from its options before anything loads."""

    name: str  # --name, or one from the credit assignment (vanilla, fixed5, ppl, grpo-k8, ...)
    estimator: Estimator  # --advantage's registry entry
    rule: TerminationRule  # --termination, --n, --cutoff (read only where estimator.segments)
    group_size: int  # K responses per prompt: --samples-per-prompt, or the estimator's default
    responses_per_step: int  # over all processes: --rollout-batch-size x K
    # the frozen reference is loaded and run: something reads its log-probs (the KL, in the
    # reward or the loss, at --kl-coef > 0; the ppl rule's cuts). Else it is never run
    reference: bool = True

    @property
    def critic(self) -> bool:
        """gae builds, trains, checkpoints and exports a critic; rloo, grpo and mc do not (their
        baseline comes from the group, mc's values from sampling)."""
        return self.estimator.critic

    def describe(self, config) -> str:
        """The start-up line's account of what this run does (also run.json's credit_assignment)."""
        return self.estimator.describe(config, self.rule, self.group_size)


def plan_run(config, given_flags: Sequence[str] = ()) -> RunPlan:
    """The :class:`RunPlan` of ``config``, after the checks of option combinations the stage
    cannot run with (one-line errors; each value on its own was checked when the options were
    resolved: config.ACCEPTS). ``given_flags``: the estimator-specific flags typed on the
    command line, checked first (:func:`_check_flags_apply`)."""
    if config.advantage not in ESTIMATORS:
        raise UserError(f"no advantage estimator called {config.advantage!r}; choose one of {', '.join(ESTIMATORS)}")
    estimator = ESTIMATORS[config.advantage]
    _check_flags_apply(config, estimator, given_flags)
    try:
        rule = credit.make_rule(config)
    except ValueError as err:
        raise UserError(str(err)) from None
    if estimator.leaves is not None:  # tree: K^D leaves per prompt (a --samples-per-prompt typed was refused above)
        k = estimator.leaves(config)
    else:
        k = estimator.group_size if config.samples_per_prompt is None else config.samples_per_prompt
    reference = config.kl_coef > 0 or (estimator.segments and rule.name == "ppl")
    plan = RunPlan(_name(config, estimator, rule, k), estimator, rule, k, config.rollout_batch_size * k, reference)
    _check_combinations(config, plan)
    return plan


def run_name(config) -> str:
    """The name of the run ``config`` describes (:attr:`RunPlan.name`; tests and benchmarks)."""
    return plan_run(config).name


def _name(config, estimator: Estimator, rule: TerminationRule, k: int) -> str:
    """``--name``, or one derived from the credit assignment (vanilla, fixed5, ppl, ...)."""
    if config.name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.name):
            raise UserError(f"--name '{config.name}': use letters, digits, '.', '_' and '-' only")
        return config.name
    suffix = "" if config.loss_aggregation == "token-mean" else f"-{config.loss_aggregation}"
    suffix += "" if k == estimator.group_size or estimator.leaves is not None else f"-k{k}"
    ratio = "" if config.ratio == "token" else f"-{config.ratio}-ratio"
    if not estimator.segments:
        return config.advantage + ratio + suffix
    name = f"fixed{'-inf' if math.isinf(rule.n) else int(rule.n)}" if rule.name == "fixed" else rule.name
    if estimator.name == "mc":  # mc-<rule>[-m<M>][-b<B>]: M and B set the cost
        name = f"mc-{name}"
        name += "" if config.mc_rollouts == 2 else f"-m{config.mc_rollouts}"
        name += "" if not _cap_binds(config, rule) else f"-b{config.mc_max_boundaries}"
        return name + ratio + suffix
    if estimator.name == "tree":  # tree-<rule>[-b<K>][-d<D>]: K^D leaves per prompt
        name = f"tree-{name}"
        name += "" if config.tree_branches == 2 else f"-b{config.tree_branches}"
        name += "" if config.tree_depth == 2 else f"-d{config.tree_depth}"
        return name + ratio + suffix
    if credit.is_vanilla(rule):
        return "vanilla" + suffix
    if config.value_function != "equal":
        name += f"-{config.value_function}"
    return name + ratio + suffix


def _cap_binds(config, rule) -> bool:
    """--mc-max-boundaries can change this run: a fixed rule makes at most ceil(T / n) - 1
    inner boundaries in T tokens, so a larger cap (cpu-tiny's 4 on fixed 8) changes nothing
    and stays out of the run's name."""
    cap = config.mc_max_boundaries
    if cap is None:
        return False
    if rule.name == "fixed":
        return not math.isinf(rule.n) and math.ceil(config.max_new_tokens / rule.n) - 1 > cap
    return True


def _check_flags_apply(config, estimator: Estimator, given_flags: Sequence[str]) -> None:
    """Estimator-specific flags given on the command line to an estimator that does not read
    them (critic or macro-action flags with rloo/grpo, critic flags with mc, mc's flags with
    the others) are a user error: they could only be silently ignored. Values from a preset or
    a config file simply do not apply, and the start-up line says what runs."""
    if estimator.leaves is not None and "--samples-per-prompt" in given_flags:
        raise UserError(
            f"--advantage {config.advantage} samples its own responses per prompt: --samples-per-prompt does not "
            f"apply (drop it; --tree-branches K and --tree-depth D make K^D)"
        )
    if "--lam-alpha" in given_flags and config.lam != "adaptive":
        raise UserError(f"--lam-alpha is the alpha of --lam adaptive: it does not apply to --lam {config.lam:g} (drop it, or use --lam adaptive)")
    ignored = [flag for flag in given_flags if flag[2:].replace("-", "_") not in estimator.reads]
    if ignored:
        fields = [flag[2:].replace("-", "_") for flag in ignored]
        readers = [e.name for e in ESTIMATORS.values() if all(f in e.reads for f in fields)]
        raise UserError(
            f"--advantage {config.advantage} {estimator.what_it_is}: {', '.join(ignored)} "
            f"{'does' if len(ignored) == 1 else 'do'} not apply (drop {'it' if len(ignored) == 1 else 'them'}, "
            f"or use --advantage {readers[0] if readers else 'gae'})"
        )


REWARDS = ("model", "apps")


def make_rewards(config) -> list[tuple[str, RewardFn | None]]:
    """``--reward``'s rewards as (name, reward), in order; the reward model's is None (it is
    built with the models: build_models). The names key each one's logged mean (score_<name>):
    model, apps, or a function's name."""
    out: list[tuple[str, RewardFn | None]] = []
    for spec in reward_specs(config):
        if spec == "model":
            out.append(("model", None))
        elif spec == "env":
            from .episodes import EnvironmentReward

            out.append(("env", EnvironmentReward(config.env)))  # never called: the episodes carry their rewards
        elif spec == "apps":
            from ...rewards.apps import AppsReward

            out.append(("apps", AppsReward()))  # the compiler signal: run the response against the problem's tests
        else:
            from ...rewards.function import FunctionReward

            name = spec.rsplit(":", 1)[-1]
            while name in {taken for taken, _ in out}:
                name += "_"
            out.append((name, FunctionReward(spec)))  # the user's own function (rewards/function.py)
    return out


def _check_episodes(config, plan: RunPlan) -> None:
    """--env's combinations: what does not apply to episodes, or not yet."""
    if not config.env:
        return
    if plan.estimator.name == "tree" and plan.rule.name != "turn":
        raise UserError(f"--advantage tree on --env episodes branches where turns end: add --termination turn (got "
                        f"--termination {plan.rule.name})")  # fmt: skip
    if config.reward:
        raise UserError("--reward does not apply with --env: an episode's rewards are its environment's (step() returns them)")
    if config.missing_eos_penalty:
        raise UserError("--missing-eos-penalty does not apply with --env: an environment rewards or penalises each turn itself")


def _check_combinations(config, plan: RunPlan) -> None:
    _check_episodes(config, plan)
    k, responses = plan.group_size, plan.responses_per_step
    if k < (1 if plan.critic else 2):
        least = "1" if plan.critic else "2 (a group baseline needs other responses)"
        raise UserError(f"--samples-per-prompt must be at least {least} with --advantage {config.advantage}, got {k}")
    missing = missing_parser(plan.rule) if plan.estimator.segments else None  # before any model is loaded
    if missing:
        raise UserError(f"--termination parsing needs a parser: {missing}")
    processes = eng.world_size()
    if responses % config.mini_batch_size:
        raise UserError(
            f"the {count(responses, 'response')} of a step (--rollout-batch-size {config.rollout_batch_size} x "
            f"--samples-per-prompt {k}) must be a multiple of --mini-batch-size {config.mini_batch_size}"
        )
    if config.critic_warmup_steps and config.critic_warmup_steps >= config.max_steps and plan.critic:
        raise UserError(
            f"--critic-warmup-steps {config.critic_warmup_steps} leaves no step that trains the actor: "
            f"it must be less than --max-steps {config.max_steps}"
        )
    if config.rollout_batch_size % processes:
        raise UserError(f"--rollout-batch-size {config.rollout_batch_size} must be a multiple of the {processes} processes")
    eng.micro_batch_size(config.mini_batch_size, config.gradient_accumulation_steps, processes)


def fingerprint(config, plan: RunPlan, prompts: int) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it."""
    keys = ("seed", "rollout_batch_size", "mini_batch_size", "ppo_epochs", "max_steps", "termination", "n",
            "value_function", "ratio", "policy", "reward_model", "reward", "reward_weights", "advantage")  # fmt: skip
    if config.env:  # an episode's budgets decide what a step draws (absent otherwise: earlier checkpoints still match)
        keys += ("env", "max_turns", "max_episode_tokens", "max_new_tokens")
    return {"name": plan.name, "prompts": prompts, "samples_per_prompt": plan.group_size, **{k: getattr(config, k) for k in keys}}


def optimizer_steps(config, plan: RunPlan, engine: str = "actor", steps: int | None = None) -> int:
    """Optimizer steps the ``engine`` (actor or critic) makes in the run's first ``steps`` steps
    (default: all of them; the length of its learning-rate schedule): the actor makes none
    during the critic's warm-up."""
    steps = config.max_steps if steps is None else steps
    if engine == "actor":
        steps = max(steps - config.critic_warmup_steps, 0)
    return steps * config.ppo_epochs * (plan.responses_per_step // config.mini_batch_size)


def micro_batch(config) -> int:
    """Sequences per forward in each process (the engines' micro batch)."""
    return config.mini_batch_size // (config.gradient_accumulation_steps * eng.world_size())
