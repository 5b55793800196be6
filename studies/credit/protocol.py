"""The study's protocol as data: an edition's ``protocol.yaml`` read into one object.

The code takes every design choice from here (tasks, arms, grids, seeds, threshold, the
decision rule), so the text of PROTOCOL.md and the runs cannot drift apart without the
report noticing: every saved run records :func:`Protocol.digest` of the mode it ran under.

Two editions share this code (the first, which predates protocol files, reads its own in
``first.py``). The second (``second/protocol.yaml``) budgets runs in
steps and picks by mean score. The third (``third/protocol.yaml``) budgets them
in generated tokens (an arm runs as many steps as its tokens per step allow), fixes the
critic's rate by its explained variance, picks rates and arms by how many tuning runs reach
the threshold, and applies Holm over every decided test; its comparisons may name an arm as
well as a family (the family's best arm).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent  # each edition's folder: its protocol and its records
PROTOCOL_FILES = {1: HERE / "first" / "protocol.yaml", 2: HERE / "second" / "protocol.yaml", 3: HERE / "third" / "protocol.yaml",
                  4: HERE / "fourth" / "protocol.yaml"}
PROTOCOL_FILE = PROTOCOL_FILES[2]
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
    pick: str = "score"  # score: mean training score (2nd edition) | reach: tuning runs that reach the threshold


@dataclass(frozen=True)
class CriticRate:
    """The third edition's critic learning rate: chosen per task, before the tuning, as the
    rate of ``lrs`` whose critic fits its targets best (mean explained variance over the second
    half of the runs of ``arms`` at actor rate ``actor_lr``, on the tuning seeds, ``budget`` tokens)."""

    arms: tuple[str, ...]
    actor_lr: float
    lrs: tuple[float, ...]
    budget: int


@dataclass(frozen=True)
class Comparison:
    a: str  # a family (its best arm) or an arm
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
    edition: int = 2
    budgets: tuple[int, ...] = ()  # 3rd edition: the token budgets' ladder (steps_ladder is empty)
    critic: CriticRate | None = None
    default_rule: dict = field(default_factory=dict)  # 3rd edition: when `first` becomes the default
    names: dict = field(default_factory=dict)  # 3rd edition: arm -> its name in prose, where a comparison names it

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.tokens)

    @property
    def ladder(self) -> tuple[int, ...]:
        """The calibration's rungs: steps (2nd edition) or generated tokens (3rd)."""
        return self.budgets or self.steps_ladder

    @property
    def unit(self) -> str:
        return "tokens" if self.budgets else "steps"

    def tests(self) -> int:
        """The decided tests Holm's first step divides alpha by."""
        return len(self.tasks) * (len(self.comparisons) if self.correction == "holm-all" else 1)

    def side_arms(self, side: str) -> tuple[str, ...]:
        """The arms a comparison's side chooses from: a family's, or the one arm it names."""
        return (side,) if side in self.arms else self.family_arms(side)

    def side_name(self, side: str) -> str:
        return self.families.get(side) or self.names.get(side, side)

    def family_arms(self, family: str) -> tuple[str, ...]:
        return tuple(name for name, arm in self.arms.items() if arm.family == family)

    def reported_seeds(self, decided: bool) -> tuple[int, ...]:
        return tuple(range(self.decided_seeds if decided else self.other_seeds))

    def digest(self) -> str:
        """A short hash of everything that decides what a run is and how it is judged."""
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def summary(self) -> str:
        if self.edition >= 3:
            return self._summary3()
        return (f"protocol {self.digest()} (mode {self.mode}): tasks "
                + ", ".join(f"{t} {n} tokens" for t, n in self.tokens.items())
                + f"; steps ladder {list(self.steps_ladder)}; threshold {self.threshold:g}; {len(self.arms)} arms; "
                f"tuning seeds {list(self.tuning.seeds)}, rates {list(self.tuning.lrs)} (x{self.tuning.extend_factor:g} "
                f"beyond an edge, at most {self.tuning.max_extensions} per side); reported seeds {self.decided_seeds} "
                f"(family bests) / {self.other_seeds} (the rest); decided on {self.axis}, log-rank, "
                f"{self.correction} over tasks, alpha {self.alpha:g}")  # fmt: skip

    def _summary3(self) -> str:
        t, c = self.tuning, self.critic
        critic = f"critic rate from {list(c.lrs)} by explained variance ({', '.join(c.arms)} at actor rate {c.actor_lr:g})" if c else "actor = critic rate"
        return (f"protocol {self.digest()} (edition {self.edition}, mode {self.mode}): tasks "
                + ", ".join(f"{task} {n} tokens" for task, n in self.tokens.items())
                + f"; token budgets {list(self.budgets)}; threshold {self.threshold:g}; {len(self.arms)} arms; {critic}; "
                f"tuning seeds {list(t.seeds)}, actor rates {list(t.lrs)} picked by {t.pick} (x{t.extend_factor:g} beyond an "
                f"edge, at most {t.max_extensions} per side); reported seeds {self.decided_seeds} (compared arms) / "
                f"{self.other_seeds} (the rest); decided on {self.axis}, log-rank, {self.correction} over {self.tests()} "
                f"tests, alpha {self.alpha:g}")  # fmt: skip


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
        if not {c.a, c.b} <= set(families) | set(arms):
            raise ValueError(f"comparison {c.name}: unknown family or arm")
    tuning = settings["tuning"]
    critic = settings.get("critic")
    if critic is not None:
        critic = CriticRate(tuple(critic["arms"]), float(critic["actor_lr"]), tuple(float(x) for x in critic["lrs"]), int(critic["budget"]))
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
        steps_ladder=tuple(int(s) for s in settings.get("steps_ladder", ())),
        budgets=tuple(int(s) for s in settings.get("budgets", ())),
        calibration_reach=float(settings["calibration_reach"]),
        tuning=Tuning(tuple(int(s) for s in tuning["seeds"]), tuple(float(x) for x in tuning["lrs"]),
                      float(tuning["extend_factor"]), int(tuning["max_extensions"]), float(tuning["tie_tolerance"]),
                      tuning.get("pick", "score")),
        decided_seeds=int(settings["reported"]["decided_seeds"]), other_seeds=int(settings["reported"]["other_seeds"]),
        raw=raw, edition=int(document.get("edition", 2)), critic=critic,
        default_rule=dict(document["decision"].get("default_rule", {})), names=dict(document.get("names", {})),
    )  # fmt: skip


def needed_reach(protocol: Protocol) -> int:
    """Tuning runs of the best arm that must reach the threshold for a budget to pass calibration."""
    return math.ceil(protocol.calibration_reach * len(protocol.tuning.seeds) - 1e-9)
