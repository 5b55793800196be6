"""What every step of a run shares: the prompt schedule, the models and the step's settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from ... import engine as eng
from ...chat import ChatFormat
from ...errors import UserError
from ...wording import count
from .. import loop
from .estimators import Estimator
from .experience import RolloutSettings
from .models import Models
from .settings import RunPlan, micro_batch
from .update import UpdateSettings


@dataclass
class PromptSchedule:
    """Which prompts step s uses: a pure function of (seed, s), cycling through epochs."""

    records: Sequence[dict]
    batch_size: int  # global
    seed: int

    def __post_init__(self):
        if len(self.records) < self.batch_size:
            raise UserError(
                f"only {count(len(self.records), 'PPO prompt')} for --rollout-batch-size {self.batch_size}: "
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



@dataclass
class Context:
    """Everything a step needs, built once."""

    config: Any
    plan: RunPlan  # the estimator, the rule, K and the name, resolved once (settings.plan_run)
    models: Models
    schedule: PromptSchedule
    rollout: RolloutSettings
    update: UpdateSettings
    executor: Any = None  # a process pool for the parsing/code rules (--parse-workers)
    chat: ChatFormat | None = None  # how a record's prompt becomes text; None: from --chat-template
    completions: list | None = None  # the last step's completions table (completions.py), at evaluation steps
    episodes: Any = None  # --env: the run's episodes (marlhf_cli.episodes.Episodes), None for single responses

    def evaluates(self, done: int) -> bool:
        """Whether the run evaluates (and logs its completions table) after ``done`` steps."""
        return done == self.config.max_steps or bool(self.config.eval_every and done % self.config.eval_every == 0)

    def __post_init__(self):
        if self.chat is None:
            self.chat = ChatFormat(self.models.tokenizer, self.config.chat_template)

    @property
    def estimator(self) -> Estimator:
        """The --advantage estimator's registry entry (:mod:`.estimators`)."""
        return self.plan.estimator

    @property
    def rule(self):
        """The termination rule that cuts responses into macro actions."""
        return self.plan.rule

    @property
    def critic_free(self) -> bool:
        return not self.plan.critic


def make_context(config, plan: RunPlan, models: Models, records: Sequence[dict]) -> Context:
    """The step's settings from the config and its plan (also what the benchmarks build)."""
    micro = micro_batch(config)
    # GRPO and mc put the KL to the reference in the loss (beta * k3), not in the reward
    kl_in_loss = plan.estimator.kl_in_loss
    # a chat template's end-of-turn token ends a response as EOS does
    chat = ChatFormat(models.tokenizer, config.chat_template)
    rollout = RolloutSettings.from_config(config, forward_batch_size=micro, stop_token_ids=chat.stop_ids)
    from ...episodes import from_config as episodes_of

    return Context(
        config=config, plan=plan, models=models, chat=chat, episodes=episodes_of(config),
        schedule=PromptSchedule(records, config.rollout_batch_size, config.seed),
        rollout=dataclasses.replace(rollout, kl_coef=0.0) if kl_in_loss else rollout,
        update=UpdateSettings(
            epochs=config.ppo_epochs, mini_batch_size=config.mini_batch_size // eng.world_size(),
            micro_batch_size=micro, clip_range=config.clip_range, value_clip_range=config.value_clip_range,
            ratio=config.ratio, temperature=config.temperature, kl_loss_coef=config.kl_coef if kl_in_loss else 0.0,
            loss_aggregation=config.loss_aggregation, max_new_tokens=config.max_new_tokens,
        ),
    )  # fmt: skip
