"""What each option accepts: every check of one option's value, by field name.

They run in :func:`marlhf_cli.config.resolve`, so a bad value stops any command in one line
(exit 2) before a model, a dataset, a parser or a process group is touched. Checks that
relate several options (e.g. --rollout-batch-size a multiple of --mini-batch-size) stay with
the stage that needs them.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable

from .errors import UserError
from .wording import count

# The choices below are also defined where they are used (marlhf_cli.macro, engine.py,
# evaluate/prompts.py), which this module must not import (they pull in torch);
# tests/test_option_values.py keeps the two in step.
RULES = ("fixed", "randomized", "ppl", "parsing", "code", "turn")
PAPER_RULES = RULES[:5]  # segment --rule all: the paper's (turn cuts a conversation, not a text)
VALUE_FUNCTIONS = ("equal", "unit", "position", "first")
VALUE_HEAD_INITS = ("zero", "random", "reward-model")
RATIO_MODES = ("token", "macro")
PARSER_BACKENDS = ("auto", "spacy", "stanza")
DTYPES = ("auto", "fp32", "bf16")
SCHEDULES = ("cosine", "linear", "constant")
JUDGE_TASKS = ("auto", "tldr", "hh", "webgpt")
REWARDS = ("model", "apps")
ADVANTAGES = ("gae", "rloo", "grpo", "mc", "tree")  # marlhf_cli.macro.ADVANTAGE_ESTIMATORS
LOSS_AGGREGATIONS = ("token-mean", "sequence-mean", "token-sum")  # marlhf_cli.macro.LOSS_AGGREGATIONS
X_AXES = ("step", "tokens")  # marlhf ppo --compare --x-axis (train/ppo/report.py)
GENERATIONS = ("auto", "eager", "compiled")  # marlhf_cli.generation.compiled.MODES
DPO_LOSS_TYPES = ("sigmoid", "ipo")  # marlhf_cli.train.dpo_loss.LOSS_TYPES


def parse_list(text: Any, kind: type, flag: str) -> list:
    """'4,8,16' (or '[4, 8]' from YAML) -> sorted unique values; one-line error otherwise."""
    parts = [p.strip() for p in str(text).strip().strip("[]").split(",") if p.strip()]
    try:
        values = sorted({kind(float(p)) if kind is int and float(p).is_integer() else kind(p) for p in parts})
    except ValueError:
        raise UserError(f"{flag} expects comma-separated {kind.__name__}s, got '{text}'") from None
    if not values:
        raise UserError(f"{flag} is empty")
    return values


@dataclass(frozen=True)
class Accepts:
    """What one option accepts: a test of its value and the words an error uses for it."""

    test: Callable[[Any], bool]
    expected: str
    choices: tuple = ()  # one_of's: a misspelt one is named in the error

    def check(self, flag: str, value: Any) -> None:
        if not self.test(value):
            shown = f"{value:g}" if isinstance(value, float) else repr(value)
            raise UserError(f"{flag} must be {self.expected}, got {shown}{self._meant(value)}")

    def _meant(self, value: Any) -> str:
        import difflib

        words = [str(choice) for choice in self.choices]
        close = difflib.get_close_matches(str(value), words, n=1, cutoff=0.6) if isinstance(value, str) else []
        return f" (did you mean {close[0]}?)" if close else ""


def at_least(low: float) -> Accepts:
    return Accepts(lambda v: v >= low, f"{low} or more")


def above(low: float) -> Accepts:
    return Accepts(lambda v: v > low, f"> {low}")


def between(low: float, high: float, *, high_open: bool = False, low_open: bool = False) -> Accepts:
    def test(v: float) -> bool:
        return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

    return Accepts(test, f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")


def one_of(*choices: Any) -> Accepts:
    return Accepts(lambda v: v in choices, "one of " + ", ".join(str(c) for c in choices), choices)


def numbers(kind: type, item: Accepts) -> Accepts:
    """A comma-separated list of numbers (bon's --n and --temperature, passk's --k)."""

    def test(text: Any) -> bool:
        try:
            values = parse_list(text, kind, "")
        except UserError:
            return False
        return all(item.test(v) for v in values)

    return Accepts(test, f"comma-separated {kind.__name__}s, each {item.expected}")


def _segment_length(n: float) -> bool:
    return (math.isinf(n) and n > 0) or (n >= 1 and n == int(n))


def rule_list(spec: Any) -> list[str]:
    """segment's --rule: 'ppl', 'fixed,code' or 'all' -> rule names (ValueError if none or unknown)."""
    names = list(PAPER_RULES) if spec == "all" else [r.strip() for r in str(spec).split(",") if r.strip()]
    if not names or any(name not in RULES for name in names):
        raise ValueError(spec)
    return names


def parses(parse: Callable[[Any], Any] | str) -> Callable[[Any], bool]:
    """A test that ``parse`` takes the value: it raises no ValueError (what it returns may be
    empty: ``--report-to none`` parses to no tracker). ``parse`` may be named as
    "module:function" under marlhf_cli, imported when first used (this module loads before
    anything heavy)."""

    def test(value: Any) -> bool:
        function = parse
        if isinstance(function, str):
            module, name = function.split(":")
            function = getattr(importlib.import_module(module, __package__), name)
        try:
            function(value)
        except ValueError:
            return False
        return True

    return test


def _model_source(value: Any) -> bool:
    """A model named as a local path exists; aliases, hub ids (owner/name) and run-directory
    names (sft, ppo/<name>) are left to the loaders. A hub id never starts with '/', '.' or '~'
    and has one slash, so a missing folder is caught here, before torch is imported (~3 s)."""
    text = str(value)
    local = text.startswith(("/", "./", "../", "~")) or text.count("/") >= 2
    return not local or Path(text).expanduser().exists()


MODEL_SOURCE = Accepts(_model_source, "an existing folder, an alias (tiny, smollm2-135m, random:...) or a hub id owner/name")


@dataclass(frozen=True)
class RewardChoice(Accepts):
    """A named reward, or ``py:FILE.py:FUNCTION``: then the file is imported (the user's own
    code, docs/rewards.md) and the callable looked up, so a typo
    fails in one line before anything loads. With ``several``, a comma-separated list of them
    (ppo's TRL-like reward_funcs)."""

    several: bool = False

    def check(self, flag: str, value: Any) -> None:
        from .rewards.function import is_function_spec, load_function

        parts = reward_list(value)
        if len(parts) > 1 and not self.several:
            raise UserError(f"{flag} takes one reward here, got {len(parts)}: {value}")
        if len(parts) != len(set(parts)):
            raise UserError(f"{flag} names a reward twice: {value}")
        for part in parts:
            if is_function_spec(part):
                load_function(part, flag)
            else:
                super().check(flag, part)


@dataclass(frozen=True)
class EnvironmentChoice(Accepts):
    """``--env py:FILE.py:NAME``: the file is imported and the name looked up, so a typo fails
    in one line before anything loads (docs/environments.md)."""

    def check(self, flag: str, value: Any) -> None:
        from .rewards.function import is_function_spec, load_function

        if not is_function_spec(value):
            raise UserError(f"{flag} must be {self.expected}, got {value!r}")
        load_function(value, flag)


ENVIRONMENT = EnvironmentChoice(lambda v: True, "py:FILE.py:NAME (a Python file and the class or function in it that makes an environment)")


def reward_list(value: Any) -> list[str]:
    """``--reward model,py:r.py:length`` (or repeated, joined by the CLI; a YAML list) -> the rewards."""
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return [part.strip() for part in text.split(",") if part.strip()]


def rewards(*names: str, several: bool = False) -> Accepts:
    words = f"one of {', '.join(names)}, or py:FILE.py:FUNCTION" + (" (several comma-separated)" if several else "")
    return RewardChoice(lambda v: v in names, words, names, several=several)


def weight_list(text: Any) -> list[float]:
    """``--reward-weights 1,0.5`` (or ``[1, 0.5]`` from YAML) -> the weights in order
    (ValueError unless finite numbers)."""
    values = [float(part.strip()) for part in str(text).strip().strip("[]").split(",") if part.strip()]
    if not values or not all(math.isfinite(value) for value in values):
        raise ValueError(text)
    return values


def reward_weights(specs: list[str], text: Any) -> list[float]:
    """``--reward-weights`` for the rewards ``specs``: one per reward, 1 each when not given."""
    if text is None:
        return [1.0] * len(specs)
    weights = weight_list(text)
    if len(weights) != len(specs):
        raise UserError(f"--reward-weights gives {count(len(weights), 'weight')} for {count(len(specs), 'reward')} ({', '.join(specs)})")
    return weights


SEGMENT_LENGTH = Accepts(_segment_length, "a whole number >= 1, or inf")
POSITIVE = at_least(1)

# By field name, for every stage with that field; STAGE_ACCEPTS wins where a stage's field
# means something else. None values (not given, "all", "the default") are not checked.
ACCEPTS: dict[str, Accepts] = {
    "seed": between(0, 2**32 - 1),  # what every generator takes (numpy's the narrowest)
    "max_records": POSITIVE,
    "split_shares": Accepts(parses(".data.splits:parse_split_shares"), "three shares SFT/RM/PPO such as 20/40/40 or 50/0/50 (none negative, not all 0), or four with the held-out share last (0/0/2/1)"),
    "eval_records": at_least(0),
    "lr": at_least(0),  # 0 freezes the weights (the step-cost benchmarks sample identically)
    "batch_size": POSITIVE,
    "epochs": POSITIVE,
    "max_steps": POSITIVE,
    "max_prompt_length": POSITIVE,
    "max_response_length": POSITIVE,
    "max_new_tokens": POSITIVE,
    "eval_every": at_least(0),
    "save_every": at_least(0),
    "zero_stage": one_of(0, 1, 2, 3),
    "dtype": Accepts(lambda v: v in DTYPES, f"one of {', '.join(DTYPES)} (fp16 does not run on the CPU)"),
    "gradient_accumulation_steps": POSITIVE,
    "lr_scheduler": one_of(*SCHEDULES),
    "warmup_ratio": between(0, 1, high_open=True),
    "weight_decay": at_least(0),
    "max_grad_norm": at_least(0),
    "nproc": POSITIVE,
    "trainable_layers": at_least(0),
    "lora_rank": at_least(0),
    "lora_alpha": above(0),
    "lora_dropout": between(0, 1, high_open=True),
    "lora_targets": Accepts(parses(".lora:target_names"), "all-linear or comma-separated module names (q_proj,v_proj)"),
    "reward": rewards(*REWARDS, several=True),
    "reward_weights": Accepts(parses(weight_list), "comma-separated numbers, one per --reward"),
    "advantage": one_of(*ADVANTAGES),
    "samples_per_prompt": POSITIVE,  # rloo/grpo/mc need 2 or more: checked by the stage
    "mc_rollouts": POSITIVE,
    "mc_max_boundaries": at_least(0),  # 0: no inner boundary, one macro action per response
    "tree_branches": at_least(2),
    "tree_depth": POSITIVE,
    "env": ENVIRONMENT,
    "max_turns": POSITIVE,
    "max_episode_tokens": POSITIVE,
    "env_timeout": above(0),
    "rollout_batch_size": POSITIVE,
    "mini_batch_size": POSITIVE,
    "ppo_epochs": POSITIVE,
    "actor_lr": at_least(0),
    "critic_lr": at_least(0),
    "value_head_init": one_of(*VALUE_HEAD_INITS),
    "critic_warmup_steps": at_least(0),
    "clip_range": above(0),
    "value_clip_range": above(0),
    "gamma": between(0, 1),
    "beta": above(0),  # dpo
    "loss_type": one_of(*DPO_LOSS_TYPES),
    "label_smoothing": between(0, 0.5, high_open=True),
    "length_penalty": at_least(0),
    "reference": MODEL_SOURCE,
    "lam": Accepts(lambda v: v == "adaptive" or (not isinstance(v, str) and 0 <= v <= 1), "a number in [0, 1], or adaptive"),
    "lam_alpha": above(0),
    "critic_lambda": between(0, 1),
    "kl_coef": at_least(0),
    "kl_estimator": one_of("k1", "k3"),
    "reward_clip": above(0),
    "missing_eos_penalty": at_least(0),
    "temperature": above(0),
    "top_k": at_least(0),
    "top_p": between(0, 1, low_open=True),
    "generation": one_of(*GENERATIONS),
    "report_to": Accepts(parses(".tracking:parse"), "none, or one or more of tensorboard, wandb, trackio, mlflow (comma-separated)"),
    "push_to_hub": Accepts(parses(".hub_push:check_repo_id"), "a Hub repository id, owner/name"),
    "termination": one_of(*RULES),
    "n": SEGMENT_LENGTH,
    "cutoff": POSITIVE,
    "value_function": one_of(*VALUE_FUNCTIONS),
    "ratio": one_of(*RATIO_MODES),
    "loss_aggregation": one_of(*LOSS_AGGREGATIONS),
    "parser_backend": one_of(*PARSER_BACKENDS),
    "parse_workers": at_least(0),
    "eval_prompts": at_least(0),
    "show_samples": at_least(0),
    "rule": Accepts(parses(rule_list), f"{', '.join(RULES)}, several of them comma-separated, or all"),
    "backend": one_of(*PARSER_BACKENDS),
    "format": one_of("text", "json"),
    "task": one_of(*JUDGE_TASKS),
    "sample": POSITIVE,
    "concurrency": POSITIVE,
    "timeout": above(0),
    "max_retries": at_least(0),
    "retry_wait": at_least(0),
    "max_tokens": POSITIVE,
    "split": one_of("eval", "all"),
    "limit": POSITIVE,
    "k": numbers(int, POSITIVE),
    "time_limit": above(0),
    "memory_mb": POSITIVE,
    "workers": POSITIVE,
    "max_tests": POSITIVE,
    "model": MODEL_SOURCE,
    "policy": MODEL_SOURCE,
    "reward_model": MODEL_SOURCE,
    "tokenizer": MODEL_SOURCE,
}
STAGE_ACCEPTS: dict[str, dict[str, Accepts]] = {
    "bon": {"n": numbers(int, POSITIVE), "temperature": numbers(float, above(0)), "reward": rewards("model"),
            "policy": Accepts(lambda v: all(_model_source(p.strip()) for p in str(v).split(",")), MODEL_SOURCE.expected + ", or several comma-separated")},
    "passk": {"n": POSITIVE, "reward": rewards("apps")},
}
# Fields whose flag is not --<field-with-dashes>.
FLAG_NAMES = {"judge_model": "--model", "rm_judge": "--rm"}


def flag_name(field_name: str) -> str:
    return FLAG_NAMES.get(field_name, "--" + field_name.replace("_", "-"))


def expected_words(stage: str, field_name: str) -> str | None:
    """What ``field_name`` of ``stage`` accepts, in an error's words (None: no check)."""
    accepts = STAGE_ACCEPTS.get(stage, {}).get(field_name) or ACCEPTS.get(field_name)
    return accepts.expected if accepts is not None else None


def check_fields(config: Any, names: Iterable[str], stage: str | None = None) -> None:
    """One-line error for the first of ``names`` whose value ACCEPTS (or STAGE_ACCEPTS) rejects."""
    special = STAGE_ACCEPTS.get(stage or "", {})
    for name in names:
        value = getattr(config, name)
        accepts = special.get(name) or ACCEPTS.get(name)
        if value is not None and accepts is not None:
            accepts.check(flag_name(name), value)


def validate(stage: str, config: Any) -> None:
    """One-line errors for option values no run of ``stage`` can use (see ACCEPTS)."""
    check_fields(config, [f.name for f in fields(config)], stage)
    if getattr(config, "reward_weights", None) is not None:  # ppo: one weight per reward
        reward_weights(reward_list(config.reward) if config.reward else ["the default"], config.reward_weights)
    if getattr(config, "chat_template", None) is not None:
        from .chat import check_template_file

        check_template_file(config.chat_template)
    from .lora import check_options  # LoRA options that cannot go together (imports no torch)

    check_options(config)
    if getattr(config, "label_smoothing", 0) and config.loss_type != "sigmoid":  # dpo
        raise UserError(f"--label-smoothing is conservative DPO's, a sigmoid loss: it does not apply to --loss-type {config.loss_type}")
    if isinstance(getattr(config, "dataset", None), str):
        from .data.loader import check_source

        check_source(config.dataset, config.data_file)
