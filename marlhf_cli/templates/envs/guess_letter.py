"""Guess my letter: a small text game with a known optimum, for ``marlhf ppo --env``.

    marlhf ppo --env py:templates/envs/guess_letter.py:GuessLetter \\
        --dataset templates/prompts/guess-letter.jsonl --max-turns 4 --termination turn ...

The environment thinks of one letter from a to h (the record's ``secret``, else one drawn
from the episode's seed). Each assistant turn is a guess: the first letter of the reply, in
either case ("C", "c.", "cat" all guess c; "I guess c" guesses i). The answer says:

* "Right, it was c." and the episode ends, reward +1;
* "No, my letter comes later than c." (or earlier), reward 0;
* "That is not a letter from a to h. ...", reward -0.25, when the reply's first letter is
  another (or it has none): a wasted turn.

**The optimum** is a binary search over the eight letters: it finds any letter within four
guesses (d, then b or f, then one more, then the last), so with ``--max-turns 4`` the best
return is 1 on every episode. A player that ignores the answers but never wastes a turn and
never repeats a guess finds it within four guesses half the time (4 of 8 letters): 0.5. A
player that guesses letters at random, as a random-init model does (about 40% of a tokenizer's
tokens start with a to h), wastes most turns and scores below 0. ``optimal_guess`` is the
binary search, for tests and to compare against.

Written for marlhf; plain Python, no marlhf import (copy it and change it).
"""

from __future__ import annotations

import random
import re

LETTERS = "abcdefgh"
WASTED = -0.25


def first_letter(reply: str) -> str | None:
    """The guess a reply makes: its first letter, lower-cased, or None."""
    found = re.search(r"[A-Za-z]", reply)
    return found.group(0).lower() if found else None


def optimal_guess(low: str = LETTERS[0], high: str = LETTERS[-1]) -> str:
    """The binary search's next guess when the letter is known to lie in [low, high]."""
    return chr((ord(low) + ord(high)) // 2)


class GuessLetter:
    """One episode of the game (module docstring): made with the dataset record and a seed."""

    def __init__(self, record: dict, seed: int):
        columns = record.get("columns") or {}
        secret = str(columns.get("secret", record.get("secret", ""))).strip().lower()
        self.secret = secret if len(secret) == 1 and secret in LETTERS else random.Random(seed).choice(LETTERS)
        self.prompt = record.get("prompt") or (
            f"Let's play a game. I am thinking of one letter from {LETTERS[0]} to {LETTERS[-1]}. "
            "Guess it: answer with the letter. After each guess I will say whether my letter comes earlier or later."
        )

    def reset(self) -> str:
        return self.prompt

    def step(self, reply: str) -> tuple[str | None, float, bool]:
        guess = first_letter(reply)
        if guess is None or guess not in LETTERS:
            shown = f"'{guess}'" if guess else "That"
            return (f"{shown} is not a letter from {LETTERS[0]} to {LETTERS[-1]}. Guess again: one letter.", WASTED, False)
        if guess == self.secret:
            return (f"Right, it was {self.secret}.", 1.0, True)
        where = "later" if self.secret > guess else "earlier"
        return (f"No, my letter comes {where} than {guess}.", 0.0, False)
