"""The study's protocol as data: ``benchmarks/credit_study/protocol.yaml`` read into one object.

The code takes every design choice from here (tasks, arms, grids, seeds, threshold, the
decision rule), so the text of PROTOCOL.md and the runs cannot drift apart without the
report noticing: every saved run records :func:`Protocol.digest` of the mode it ran under.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROTOCOL_FILE = Path(__file__).resolve().parents[1] / "credit_study" / "protocol.yaml"
AXES = ("steps", "responses", "tokens")
AXIS_LABELS = {"steps": "PPO steps", "responses": "responses generated", "tokens": "tokens generated"}


@dataclass(frozen=True)
class Arm:
    name: str
    family: str
    flags: dict


@dataclass(frozen=True)
class Tuning:
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    extend_factor: float
    max_extensions: int
    tie_tolerance: float


@dataclass(frozen=True)
class Comparison:
    a: str  # family
    b: str

    @property
    def name(self) -> str:
        return f"{self.a} vs {self.b}"


@dataclass
class Protocol:
    mode: str
    folder: str
    responses_per_step: int
    window: int
    stage: dict
    arms: dict[str, Arm]
    families: dict[str, str]  # family -> its name in prose
    comparisons: tuple[Comparison, ...]
    axis: str
    alpha: float
    correction: str
    confidence: float
    bootstrap_resamples: int
    power_simulations: int
    power_scenarios: dict[str, dict]
    threshold: float
    tokens: dict[str, int]  # task -> response tokens
    steps_ladder: tuple[int, ...]
    calibration_reach: float
    tuning: Tuning
    decided_seeds: int
    other_seeds: int
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.tokens)

    def family_arms(self, family: str) -> tuple[str, ...]:
        return tuple(name for name, arm in self.arms.items() if arm.family == family)

    def reported_seeds(self, decided: bool) -> tuple[int, ...]:
        return tuple(range(self.decided_seeds if decided else self.other_seeds))

    def digest(self) -> str:
        """A short hash of everything that decides what a run is and how it is judged."""
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def summary(self) -> str:
        return (f"protocol {self.digest()} (mode {self.mode}): tasks "
                + ", ".join(f"{t} {n} tokens" for t, n in self.tokens.items())
                + f"; steps ladder {list(self.steps_ladder)}; threshold {self.threshold:g}; {len(self.arms)} arms; "
                f"tuning seeds {list(self.tuning.seeds)}, rates {list(self.tuning.lrs)} (x{self.tuning.extend_factor:g} "
                f"beyond an edge, at most {self.tuning.max_extensions} per side); reported seeds {self.decided_seeds} "
                f"(family bests) / {self.other_seeds} (the rest); decided on {self.axis}, log-rank, "
                f"{self.correction} over tasks, alpha {self.alpha:g}")  # fmt: skip


def load(mode: str = "full", path: Path = PROTOCOL_FILE) -> Protocol:
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if mode not in document["modes"]:
        raise ValueError(f"protocol {path} has no mode {mode!r}; it has {', '.join(document['modes'])}")
    settings = document["modes"][mode]
    statistics = document["statistics"]
    families = document["families"]
    arms = {}
    for name, spec in document["arms"].items():
        if spec["family"] not in families:
            raise ValueError(f"arm {name}: unknown family {spec['family']!r}")
        arms[name] = Arm(name, spec["family"], dict(spec["flags"]))
    comparisons = tuple(Comparison(c["a"], c["b"]) for c in document["comparisons"])
    for c in comparisons:
        if c.a not in families or c.b not in families:
            raise ValueError(f"comparison {c.name}: unknown family")
    tuning = settings["tuning"]
    raw = {key: value for key, value in document.items() if key != "modes"} | {"mode": mode, "settings": settings}
    return Protocol(
        mode=mode, folder=settings["folder"], responses_per_step=int(document["responses_per_step"]),
        window=int(document["window"]), stage=dict(document["stage"]), arms=arms, families=dict(families),
        comparisons=comparisons, axis=document["decision"]["axis"], alpha=float(document["decision"]["alpha"]),
        correction=document["decision"]["correction"], confidence=float(statistics["confidence"]),
        bootstrap_resamples=int(settings.get("bootstrap_resamples", statistics["bootstrap_resamples"])),
        power_simulations=int(settings.get("power_simulations", statistics["power_simulations"])),
        power_scenarios=dict(statistics["power_scenarios"]), threshold=float(settings["threshold"]),
        tokens={task: int(spec["tokens"]) for task, spec in settings["tasks"].items()},
        steps_ladder=tuple(int(s) for s in settings["steps_ladder"]),
        calibration_reach=float(settings["calibration_reach"]),
        tuning=Tuning(tuple(int(s) for s in tuning["seeds"]), tuple(float(x) for x in tuning["lrs"]),
                      float(tuning["extend_factor"]), int(tuning["max_extensions"]), float(tuning["tie_tolerance"])),
        decided_seeds=int(settings["reported"]["decided_seeds"]), other_seeds=int(settings["reported"]["other_seeds"]),
        raw=raw,
    )  # fmt: skip


def needed_reach(protocol: Protocol) -> int:
    """Tuning runs of the best arm that must reach the threshold for a budget to pass calibration."""
    return math.ceil(protocol.calibration_reach * len(protocol.tuning.seeds) - 1e-9)
