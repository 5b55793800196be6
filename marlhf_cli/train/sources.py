"""The models a stage starts from: the flags, else the run directory's stages (a one-line
"run marlhf sft first" otherwise), and ``ppo``'s rewards as named by ``--reward``.

Imports nothing heavy: the command line calls these before it imports a stage, so a run
directory without its sft/ or rm/ is answered before torch is imported.
"""

from __future__ import annotations

from typing import Any

from ..accepts import reward_list
from ..accepts import reward_weights as checked_weights
from ..artifacts import RunDir


def base_model(config: Any, run_dir: RunDir) -> str:
    """``marlhf rm``'s start: ``--model``, or the run's SFT model (a one-line error naming ``marlhf sft`` if absent)."""
    return str(config.model) if config.model else str(run_dir.require("sft"))


def dpo_sources(config: Any, run_dir: RunDir) -> tuple[str, str]:
    """``marlhf dpo``'s (policy, reference): the flags, else the run's SFT model for both (the
    paper's; a one-line error naming ``marlhf sft`` if absent)."""
    policy = str(config.policy) if config.policy else str(run_dir.require("sft"))
    return policy, str(config.reference) if config.reference else policy


def reward_specs(config) -> list[str]:
    """``--reward`` as a list, each ``model``, ``apps`` or ``py:FILE.py:FUNCTION``; by default
    ``apps`` for the APPS dataset (its reward is the tests' outcome, docs/method.md "Program
    rewards") and ``model`` (the reward model) for everything else; ``env`` with ``--env`` (the
    environment rewards each turn)."""
    if getattr(config, "env", None):
        return ["env"]
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
