"""Environments a user writes in Python (``--env py:FILE.py:NAME``), and calling them safely.

``NAME`` is a class, or any callable, that makes one environment for one episode::

    class GuessNumber:
        def __init__(self, record: dict, seed: int): ...       # the dataset record, a seed
        def reset(self) -> str: ...                             # the first user message
        def step(self, reply: str) -> tuple[str | None, float | None, bool]: ...

``step`` gets the assistant's reply (its text, special tokens dropped) and returns the next
observation (a user message, or ``{"role": "tool", "content": ...}``; ``None`` once the
episode is over), the reward for that turn (``None`` counts as 0) and whether the episode is
over: Gymnasium's ``(observation, reward, terminated)`` without its ``info``. A list or a
dict with those three keys is taken too. The seed is derived from the run's seed, the step
and the episode's group (the episodes of one record in a step share it: one game), so a
resumed run replays every episode as the uninterrupted run played it; an environment that
draws anything at random must draw it from that seed.

Each call runs in a thread of its own and is given ``--env-timeout`` seconds: an environment
that raises, hangs past its limit or returns the wrong thing stops the run with one line
that names it (with its traceback when it raised), as a failing reward function does. The
code is the user's own and is trusted like their reward functions (not sandboxed: an
environment that runs model-written programs sandboxes them itself, as the shipped
``program_repair`` does).
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import UserCodeError, UserError
from ..rewards.function import _one_line, load_function, user_traceback

FLAG = "--env"
ROLES = ("user", "tool")


@dataclass(frozen=True)
class Observation:
    """What an environment said after a turn: its text, the role it speaks in, the turn's reward
    and whether the episode is over."""

    text: str | None
    role: str
    reward: float
    done: bool


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable ``--env py:FILE.py:NAME`` names (imported by path, as ``--reward py:...``)."""
    return load_function(spec, flag=FLAG)


def observation(spec: str, returned: Any, where: str) -> Observation:
    """``step``'s return as an :class:`Observation`, or a one-line error saying what is wrong."""
    if isinstance(returned, dict) and {"observation", "reward", "done"} <= set(returned):
        returned = (returned["observation"], returned["reward"], returned["done"])
    if not isinstance(returned, (tuple, list)) or len(returned) != 3:
        raise UserError(f"{FLAG} {spec}: step() returned {_described(returned)} {where}, not (observation, reward, done)")
    text, reward, done = returned
    if not isinstance(done, bool):
        raise UserError(f"{FLAG} {spec}: step() returned done = {_described(done)} {where}, not True or False")
    if reward is None:
        reward = 0.0
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise UserError(f"{FLAG} {spec}: step() returned the reward {_described(reward)} {where}, not a finite number")
    role = "user"
    if isinstance(text, dict):
        role, text = text.get("role", "user"), text.get("content")
        if role not in ROLES:
            raise UserError(f"{FLAG} {spec}: step() returned an observation in the role {role!r} {where}: one of {', '.join(ROLES)}")
    if done:
        if text is not None and not isinstance(text, str):
            raise UserError(f"{FLAG} {spec}: step() returned the observation {_described(text)} {where}, not a string or None")
        return Observation(text or None, role, float(reward), True)
    if not isinstance(text, str):
        raise UserError(f"{FLAG} {spec}: step() returned the observation {_described(text)} {where} with the episode not "
                        "over: the next turn needs a message (a string)")  # fmt: skip
    return Observation(text, role, float(reward), False)


def _described(value: Any) -> str:
    """'None', 'int 42', "str 'yes'": a value and its type, cut to a line's share."""
    if value is None:
        return "None"
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"


class Environments:
    """The environments of one batch of episodes, one per episode, called side by side.

    ``make(record, seed)`` is the user's factory; every call (making, ``reset``, ``step``) runs
    in a daemon thread of its own, joined with ``timeout`` seconds, so a slow environment does
    not hold up the others and a hung one cannot keep the process from exiting.
    """

    def __init__(self, spec: str, factory: Callable[..., Any], records: Sequence[dict], seeds: Sequence[int], *, timeout: float):
        self.spec, self.timeout, self.seeds = spec, float(timeout), list(seeds)
        self.instances = self._all("making the environment", [lambda r=r, s=s: factory(r, s) for r, s in zip(records, seeds)])
        for index, instance in enumerate(self.instances):
            for method in ("reset", "step"):
                if not callable(getattr(instance, method, None)):
                    raise UserError(f"{FLAG} {spec}: it made a {type(instance).__name__} (episode {index + 1}), which has no "
                                    f"{method}() method")  # fmt: skip

    def reset(self) -> list[str]:
        """Each episode's first user message."""
        firsts = self._all("reset()", [instance.reset for instance in self.instances])
        for index, first in enumerate(firsts):
            if not isinstance(first, str):
                raise UserError(f"{FLAG} {self.spec}: reset() returned {_described(first)} (episode {index + 1}), not the first "
                                "user message (a string)")  # fmt: skip
        return firsts

    def step(self, replies: dict[int, str], turns: dict[int, int]) -> dict[int, Observation]:
        """``step(reply)`` of the episodes in ``replies`` (episode index -> the assistant's reply;
        ``turns``: episode index -> the turn's number, 0-based, for the messages)."""
        order = list(replies)
        returned = self._all("step()", [lambda i=i: self.instances[i].step(replies[i]) for i in order], order, turns)
        return {i: observation(self.spec, r, f"(episode {i + 1}, turn {turns[i] + 1})") for i, r in zip(order, returned)}

    def _all(self, what: str, calls: Sequence[Callable[[], Any]], episodes: Sequence[int] | None = None,
             turns: dict[int, int] | None = None) -> list:  # fmt: skip
        """Run ``calls`` side by side; their results in order, or the first failure as one line."""
        episodes = list(range(len(calls))) if episodes is None else list(episodes)
        results: list[Any] = [None] * len(calls)
        errors: list[BaseException | None] = [None] * len(calls)

        def run(index: int) -> None:
            try:
                results[index] = calls[index]()
            except BaseException as err:  # the user's code: any exception is theirs to see
                errors[index] = err

        threads = [threading.Thread(target=run, args=(i,), daemon=True, name=f"marlhf-env-{i}") for i in range(len(calls))]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self.timeout  # the calls run side by side: one limit for all
        for index, thread in enumerate(threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                at = self._where(episodes[index], turns)
                raise UserError(f"{FLAG} {self.spec}: {what} did not return within {self.timeout:g} s ({at}; --env-timeout)")
        for index, err in enumerate(errors):
            if err is not None:
                at = self._where(episodes[index], turns)
                raise UserCodeError(f"{FLAG} {self.spec}: {what} raised {_one_line(err)} ({at})", details=user_traceback(err))
        return results

    @staticmethod
    def _where(episode: int, turns: dict[int, int] | None) -> str:
        return f"episode {episode + 1}" + (f", turn {turns[episode] + 1}" if turns is not None else "")
