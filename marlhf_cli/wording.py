"""Counts in messages: '1 step', '2 steps', never '1 steps'."""

from __future__ import annotations

IRREGULAR = {"reply": "replies", "process": "processes"}


def count(number: int | float, noun: str, plural: str | None = None) -> str:
    """``number`` and ``noun``, the noun in the plural unless ``number`` is 1 (thousands
    separated: '1,024 records')."""
    many = plural or IRREGULAR.get(noun) or f"{noun}s"
    shown = f"{number:,}" if isinstance(number, int) else f"{number:g}"
    return f"{shown} {noun if number == 1 else many}"
