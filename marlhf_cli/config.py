"""Stage configurations (one dataclass per stage, :mod:`marlhf_cli.stage_configs`), resolved
as defaults < preset < file < flags.

A configuration file (YAML, via ``--config`` or a preset under ``templates/presets/``) may
hold keys for every stage at its top level and per-stage sections::

    seed: 1                # applies to every stage that has a 'seed' field
    model: tiny
    ppo:                   # applies to 'marlhf ppo' only, and wins over the top level
      termination: ppl
      rollout_batch_size: 8

Unknown keys are an error (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from .accepts import expected_words, flag_name, validate
from .errors import UserError
from .stage_configs import (
    CommonConfig,
    DataConfig,
    TrainingDataConfig,
    EngineConfig,
    TrackingConfig,
    LoRAConfig,
    LoRATrainingConfig,
    SFTConfig,
    RMConfig,
    PPOConfig,
    DPOConfig,
    SegmentConfig,
    BonConfig,
    JudgeConfig,
    PassKConfig,
)

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"  # also at the repository top (a link)
PRESETS_DIR = TEMPLATES_DIR / "presets"


STAGES: dict[str, type] = {
    "sft": SFTConfig,
    "rm": RMConfig,
    "ppo": PPOConfig,
    "dpo": DPOConfig,
    "segment": SegmentConfig,
    "bon": BonConfig,
    "judge": JudgeConfig,
    "passk": PassKConfig,
}


_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


KIND_WORDS = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "text"}
# the float options for which inf means something (a segment length: one segment per response);
# every other float option takes finite numbers only: inf or nan would train on NaN
INFINITE_OK = frozenset({"n"})


def _finite(name: str, value: Any) -> Any:
    """``value``, or a one-line error where a float option got inf or nan."""
    if isinstance(value, float) and not math.isfinite(value) and not (math.isinf(value) and name in INFINITE_OK):
        raise UserError(f"{flag_name(name)} (config key '{name}') must be a finite number, got {value}")
    return value


def _coerce(name: str, value: Any, annotation: str, stage: str) -> Any:
    """Convert a YAML or flag value to the field's annotated type ('inf' only where it means
    something: INFINITE_OK); a value of another type is an error in the words of what the
    option accepts."""
    return _finite(name, _converted(name, value, annotation, stage))


def _converted(name: str, value: Any, annotation: str, stage: str) -> Any:
    if value is None:
        return None
    kind = next((k for k in _SCALARS if re.search(rf"\b{k}\b", annotation)), None)
    if kind is None:
        return value
    if kind == "float" and re.search(r"\bstr\b", annotation) and isinstance(value, str):
        try:  # a number or a word (--lam 0.9, --lam adaptive): the word is checked by ACCEPTS
            return float(value)
        except ValueError:
            return value.strip()
    if kind == "float" and isinstance(value, str) and value.strip().lower() in {"inf", "infinity"}:
        return math.inf
    if kind == "str" and isinstance(value, (list, tuple)):  # a YAML list: the flag's comma-separated form
        return ",".join(map(str, value))
    wrong = (
        (kind == "bool" and not isinstance(value, bool))
        or (kind in ("int", "float") and isinstance(value, bool))
        or (kind == "int" and isinstance(value, float) and not value.is_integer())
    )
    try:
        if wrong:
            raise TypeError
        return _SCALARS[kind](value)
    except (TypeError, ValueError):
        accepts = expected_words(stage, name)
        what = KIND_WORDS[kind]
        if accepts:  # 'a whole number >= 1, or inf' says the kind itself; '1 or more' does not
            what = accepts if accepts.startswith(("a ", "one of", "comma-separated", "three")) else f"{what}, {accepts}"
        raise UserError(f"{flag_name(name)} (config key '{name}') must be {what}, got {value!r}") from None


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the later
    value silently: a user's second ``lr:`` would win without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}' on line {key_node.start_mark.line + 1}",
                                                        key_node.start_mark)  # fmt: skip
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Load a YAML config file into a dict, with one-line errors for users."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: a folder, not a config file (--config takes a YAML file)")
    if not path.is_file():
        raise UserError(f"{path}: config file not found")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeys) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{path}: not valid YAML ({first})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config file must be a mapping of keys to values")
    return data


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
        raise UserError(f"unknown preset '{name}' (known: {known})")
    return path


def _shipped(data: Any) -> Any:
    """A preset's ``templates/...`` (and ``py:templates/...``) values as the installed package's
    files, so a preset that names a shipped prompt file or reward runs from any folder, not only
    from a checkout's root (where ``templates/`` is a link to the same files)."""
    if isinstance(data, dict):
        return {key: _shipped(value) for key, value in data.items()}
    if isinstance(data, str) and re.match(r"(py:)?templates/", data):
        prefix, _, rest = data.partition("templates/")
        return f"{prefix}{TEMPLATES_DIR / rest}"
    return data


def _stage_values(stage: str, data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The keys of one config file that apply to ``stage``: top level, then its section."""
    cls = STAGES[stage]
    names = {f.name for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in STAGES:
            continue
        key = key.replace("-", "_")
        if key in names:
            values[key] = value
        elif not any(key in {f.name for f in fields(other)} for other in STAGES.values()):
            raise UserError(f"{source}: unknown config key '{key}'")
    section = data.get(stage) or {}
    if not isinstance(section, dict):
        raise UserError(f"{source}: section '{stage}' must be a mapping")
    for key, value in section.items():
        key = key.replace("-", "_")
        if key not in names:
            raise UserError(f"{source}: unknown key '{key}' in section '{stage}'")
        values[key] = value
    return values


def resolve(
    stage: str,
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Any:
    """Build a stage config: defaults, then the preset, then ``--config``, then flags.

    ``flags`` holds only the options the user actually gave (None means "not given").
    """
    cls = STAGES[stage]
    merged: dict[str, Any] = {}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if preset:
        path = preset_path(preset)
        layers.append((str(path), _shipped(read_config_file(path))))
    if config_file:
        layers.append((str(config_file), read_config_file(config_file)))
    for source, data in layers:
        merged.update(_stage_values(stage, data, source))
    for key, value in (flags or {}).items():
        if value is not None:
            merged[key.replace("-", "_")] = value
    annotations = {f.name: str(f.type) for f in fields(cls)}
    unknown = set(merged) - set(annotations)
    if unknown:
        raise UserError(f"unknown option{'s' if len(unknown) > 1 else ''} for '{stage}': {', '.join(sorted(unknown))}")
    kwargs = {key: _coerce(key, value, annotations[key], stage) for key, value in merged.items()}
    config = cls(**kwargs)
    validate(stage, config)
    return config


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain data (inf written as the string 'inf' so YAML/JSON stay portable)."""
    out = dataclasses.asdict(config)
    return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in out.items()}


def to_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


__all__ = [
    "CommonConfig", "DataConfig", "TrainingDataConfig", "EngineConfig", "LoRAConfig", "LoRATrainingConfig", "SFTConfig", "RMConfig", "PPOConfig", "DPOConfig",
    "SegmentConfig", "BonConfig", "JudgeConfig", "PassKConfig", "STAGES", "resolve", "validate", "read_config_file", "to_dict", "to_yaml",
]  # fmt: skip
