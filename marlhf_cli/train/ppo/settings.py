"""What a PPO run is, read from its config: name, estimator, group size, inputs, option checks.

Pure functions of the config (and the run directory), shared by the stage, its checkpoints and
the benchmarks; nothing here loads a model.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from ... import engine as eng
from ...accepts import reward_list
from ...accepts import reward_weights as checked_weights
from ...artifacts import RunDir
from ...errors import UserError
from ...macro.segmentation import missing_parser
from ...wording import count
from . import credit
from .estimators import ESTIMATORS, estimator_of, group_size
from .rewards import RewardFn

STAGE = "ppo"


def run_name(config) -> str:
    """``--name``, or one derived from the credit assignment (vanilla, fixed5, ppl, ...)."""
    if config.name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.name):
            raise UserError(f"--name '{config.name}': use letters, digits, '.', '_' and '-' only")
        return config.name
    k = group_size(config)
    estimator = estimator_of(config)
    suffix = "" if config.loss_aggregation == "token-mean" else f"-{config.loss_aggregation}"
    suffix += "" if k == estimator.group_size else f"-k{k}"
    ratio = "" if config.ratio == "token" else f"-{config.ratio}-ratio"
    if not estimator.segments:
        return config.advantage + ratio + suffix
    rule = credit.make_rule(config)
    name = f"fixed{'-inf' if math.isinf(rule.n) else int(rule.n)}" if rule.name == "fixed" else rule.name
    if estimator.name == "mc":  # mc-<rule>[-m<M>][-b<B>]: M and B set the cost
        name = f"mc-{name}"
        name += "" if config.mc_rollouts == 2 else f"-m{config.mc_rollouts}"
        name += "" if not _cap_binds(config, rule) else f"-b{config.mc_max_boundaries}"
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


def is_critic_free(config) -> bool:
    """rloo, grpo, mc: the baseline comes from the group (and mc's values from sampling);
    there is no critic."""
    return not estimator_of(config).critic


def check_critic_free_flags(config, given_flags: Sequence[str]) -> None:
    """Estimator-specific flags given on the command line to an estimator that does not read
    them (critic or macro-action flags with rloo/grpo, critic flags with mc, mc's flags with
    the others) are a user error: they could only be silently ignored. Values from a preset or
    a config file simply do not apply, and the start-up line says what runs."""
    estimator = estimator_of(config)
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


def describe(config, rule) -> str:
    """The start-up line's account of what this run does (also run.json's credit_assignment)."""
    return estimator_of(config).describe(config, rule, group_size(config))


def reward_specs(config) -> list[str]:
    """``--reward`` as a list, each ``model``, ``apps`` or ``py:FILE.py:FUNCTION``; by default
    ``apps`` for the APPS dataset (its reward is the tests' outcome, docs/method.md "Program
    rewards") and ``model`` (the reward model) for everything else."""
    if config.reward:
        return reward_list(config.reward)
    return ["apps" if config.dataset == "apps" else "model"]


def reward_weights(config) -> list[float]:
    """``--reward-weights``, one per reward (1 each by default)."""
    return checked_weights(reward_specs(config), config.reward_weights)


def uses_reward_model(config) -> bool:
    return "model" in reward_specs(config)


def model_sources(config, run_dir: RunDir) -> tuple[str, str]:
    """(policy, critic source): the flags, else the run's sft/ and rm/ (or a 'run X first' error).

    Without ``model`` among the rewards (``--reward apps``, Python functions) there is no
    reward model: the critic starts from the policy (docs/method.md "Program rewards") unless
    ``--reward-model`` names one, and no rm/ is needed.
    """
    policy = str(config.policy) if config.policy else str(run_dir.require("sft"))
    if config.reward_model:
        return policy, str(config.reward_model)
    if not uses_reward_model(config):
        return policy, policy
    return policy, str(run_dir.require("rm"))


def make_rewards(config) -> list[tuple[str, RewardFn | None]]:
    """``--reward``'s rewards as (name, reward), in order; the reward model's is None (it is
    built with the models: build_models). The names key each one's logged mean (score_<name>):
    model, apps, or a function's name."""
    out: list[tuple[str, RewardFn | None]] = []
    for spec in reward_specs(config):
        if spec == "model":
            out.append(("model", None))
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
    missing = missing_parser(rule) if estimator_of(config).segments else None  # before any model is loaded
    if missing:
        raise UserError(f"--termination parsing needs a parser: {missing}")
    processes = eng.world_size()
    if responses_per_step(config) % config.mini_batch_size:
        raise UserError(
            f"the {count(responses_per_step(config), 'response')} of a step (--rollout-batch-size {config.rollout_batch_size} x "
            f"--samples-per-prompt {k}) must be a multiple of --mini-batch-size {config.mini_batch_size}"
        )
    if config.critic_warmup_steps and config.critic_warmup_steps >= config.max_steps and not is_critic_free(config):
        raise UserError(
            f"--critic-warmup-steps {config.critic_warmup_steps} leaves no step that trains the actor: "
            f"it must be less than --max-steps {config.max_steps}"
        )
    if config.rollout_batch_size % processes:
        raise UserError(f"--rollout-batch-size {config.rollout_batch_size} must be a multiple of the {processes} processes")
    eng.micro_batch_size(config.mini_batch_size, config.gradient_accumulation_steps, processes)


def fingerprint(config, name: str, prompts: int) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it."""
    keys = ("seed", "rollout_batch_size", "mini_batch_size", "ppo_epochs", "max_steps", "termination", "n",
            "value_function", "ratio", "policy", "reward_model", "reward", "reward_weights", "advantage")  # fmt: skip
    return {"name": name, "prompts": prompts, "samples_per_prompt": group_size(config), **{k: getattr(config, k) for k in keys}}


def responses_per_step(config) -> int:
    """Responses generated per PPO step over all processes: prompts x K."""
    return config.rollout_batch_size * group_size(config)



def optimizer_steps(config, engine: str = "actor", steps: int | None = None) -> int:
    """Optimizer steps the ``engine`` (actor or critic) makes in the run's first ``steps`` steps
    (default: all of them; the length of its learning-rate schedule): the actor makes none
    during the critic's warm-up."""
    steps = config.max_steps if steps is None else steps
    if engine == "actor":
        steps = max(steps - config.critic_warmup_steps, 0)
    return steps * config.ppo_epochs * (responses_per_step(config) // config.mini_batch_size)


def micro_batch(config) -> int:
    """Sequences per forward in each process (the engines' micro batch)."""
    return config.mini_batch_size // (config.gradient_accumulation_steps * eng.world_size())
