"""One line for the user on stderr, from rank 0 only: what every layer says through.

The stages call it as ``train.common.say``; the sampler (``generation/``), which sits below
the stages, calls it here.
"""

from __future__ import annotations


def say(message: str) -> None:
    from . import engine as eng

    if eng.is_main():
        from rich.console import Console

        Console(stderr=True).print(message, highlight=False, soft_wrap=True)
