"""What a PPO run is, read from its config: name, estimator, group size, inputs, option checks.

Pure functions of the config (and the run directory), shared by the stage, its checkpoints and
the benchmarks; nothing here loads a model.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

from ... import engine as eng
from ...artifacts import RunDir
from ...errors import UserError
from ...macro.segmentation import missing_parser
from ...rewards.function import is_function_spec
from . import credit
from .rewards import RewardFn

STAGE = "ppo"


def run_name(config) -> str:
    """``--name``, or one derived from the credit assignment (vanilla, fixed5, ppl, ...)."""
    if config.name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", config.name):
            raise UserError(f"--name '{config.name}': use letters, digits, '.', '_' and '-' only")
        return config.name
    k = group_size(config)
    suffix = "" if config.loss_aggregation == "token-mean" else f"-{config.loss_aggregation}"
    suffix += "" if k == DEFAULT_GROUP_SIZE[config.advantage] else f"-k{k}"
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
    aggregation = "" if config.loss_aggregation == "token-mean" else f", {config.loss_aggregation} loss"
    if config.advantage == "rloo":
        what = f"RLOO (no critic: {k} responses per prompt, leave-one-out baseline, KL penalty in the reward"
    elif config.advantage == "grpo":
        what = f"GRPO (no critic: {k} responses per prompt, group-normalised score, KL loss k3 x {config.kl_coef:g}"
    else:
        per_prompt = f", {k} responses per prompt" if k > 1 else ""
        return credit.describe(rule, config.value_function, config.ratio) + per_prompt + aggregation
    ratio = "one ratio per response" if config.ratio == "macro" else "token ratios"
    return what + f"; {ratio}{aggregation}; termination rules and value functions do not apply)"


def reward_kind(config) -> str:
    """``model``, ``apps`` or ``function`` (``--reward py:FILE.py:FUNCTION``); by default
    ``apps`` for the APPS dataset (its reward is the tests' outcome, docs/method.md "Program
    rewards") and ``model`` (the reward model) for everything else."""
    if config.reward:
        return "function" if is_function_spec(config.reward) else config.reward
    return "apps" if config.dataset == "apps" else "model"


def model_sources(config, run_dir: RunDir) -> tuple[str, str]:
    """(policy, critic source): the flags, else the run's sft/ and rm/ (or a 'run X first' error).

    With ``--reward apps`` or a Python function there is no reward model: the critic starts
    from the policy (docs/method.md "Program rewards") unless ``--reward-model`` names one,
    and no rm/ is needed.
    """
    policy = str(config.policy) if config.policy else str(run_dir.require("sft"))
    if config.reward_model:
        return policy, str(config.reward_model)
    if reward_kind(config) in ("apps", "function"):
        return policy, policy
    return policy, str(run_dir.require("rm"))


def make_reward(config) -> RewardFn | None:
    """The reward named by ``--reward`` when it is not the reward model (built with the models)."""
    if reward_kind(config) == "apps":
        from ...rewards.apps import AppsReward

        return AppsReward()  # the compiler signal: run the response against the problem's tests
    if reward_kind(config) == "function":
        from ...rewards.function import FunctionReward

        return FunctionReward(config.reward)  # the user's own function (rewards/function.py)
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



def optimizer_steps(config) -> int:
    """Optimizer steps per engine over the run (for the learning-rate schedule)."""
    return config.max_steps * config.ppo_epochs * (responses_per_step(config) // config.mini_batch_size)


def micro_batch(config) -> int:
    """Sequences per forward in each process (the engines' micro batch)."""
    return config.mini_batch_size // (config.gradient_accumulation_steps * eng.world_size())
