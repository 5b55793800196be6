"""Counts in messages agree with their number ('1 step', '2 steps')."""

import pytest

from marlhf_cli.wording import count


@pytest.mark.parametrize("number, noun, expected", [
    (1, "step", "1 step"), (0, "step", "0 steps"), (2, "problem", "2 problems"), (1024, "record", "1,024 records"),
    (1, "reply", "1 reply"), (3, "reply", "3 replies"), (1, "process", "1 process"), (2, "process", "2 processes"),
    (1.5, "second", "1.5 seconds"), (1.0, "second", "1 second"),
])  # fmt: skip
def test_count_agrees_with_its_number(number, noun, expected):
    assert count(number, noun) == expected


def test_an_explicit_plural_wins():
    assert count(2, "file or folder", "files or folders") == "2 files or folders"
