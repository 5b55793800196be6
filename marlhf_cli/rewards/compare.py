"""Is a program's output right? Output comparison in the manner of APPS and Code Jam judges.

Standard-input problems (:func:`stdout_matches`): outputs are compared as lines of
whitespace-separated tokens, ignoring leading/trailing whitespace on each line and blank
lines; if the line structure differs, the flat token sequences are compared instead (APPS
accepts "1 2 3" for "1\\n2\\n3"). Tokens must be equal, except numbers written with a
decimal point or an exponent on either side, which may differ by the tolerance (absolute
*or* relative, as Code Jam states it; ``output_validator_flags: float_tolerance 1e-6``).
Integers are never compared with a tolerance: APPS's own fallback (``np.allclose``) would
accept 1000000 for 1000001, which a judge would not.

Call-based problems (:func:`value_matches`): the function's JSON result is compared with the
expected value structurally (tuples are lists after JSON; floats within the tolerance). APPS
stores many expected values wrapped in a one-element list (``[[False], [True]]`` for a
function returning a bool), so a result equal to the wrapped value also matches.
"""

from __future__ import annotations

import math
import re
from typing import Any

APPS_FLOAT_TOLERANCE = 1e-6  # ours: close to np.allclose's rtol 1e-5 / atol 1e-8, but symmetric
_FLOAT_SYNTAX = re.compile(r"[.eE]|inf|nan", re.IGNORECASE)


def parse_tolerance(flags: Any, default: float | None = APPS_FLOAT_TOLERANCE) -> float | None:
    """The float tolerance named in ``output_validator_flags`` (e.g. ``float_tolerance 1e-6``)."""
    if isinstance(flags, str):
        words = flags.split()
        for i, word in enumerate(words[:-1]):
            if word == "float_tolerance":
                try:
                    return abs(float(words[i + 1]))
                except ValueError:
                    break
    return default


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def tokens_equal(actual: str, expected: str, tolerance: float | None) -> bool:
    if actual == expected:
        return True
    if tolerance is None or not (_FLOAT_SYNTAX.search(actual) or _FLOAT_SYNTAX.search(expected)):
        return False
    a, b = _number(actual), _number(expected)
    if a is None or b is None:
        return False
    return floats_close(a, b, tolerance)


def floats_close(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    difference = abs(a - b)
    return difference <= tolerance or difference <= tolerance * abs(b)


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def stdout_matches(actual: str, expected: Any, tolerance: float | None = APPS_FLOAT_TOLERANCE) -> bool:
    """Whether a standard-input program's output matches the expected output (module doc)."""
    if isinstance(expected, list):  # some APPS rows store the expected output as a list of lines
        expected = "\n".join(str(line) for line in expected)
    expected = str(expected)
    want, got = _lines(expected), _lines(actual)
    if len(want) == len(got) and all(len(w) == len(g) for w, g in zip(want, got)):
        return all(tokens_equal(g, w, tolerance) for wl, gl in zip(want, got) for w, g in zip(wl, gl))
    flat_want = [t for line in want for t in line]
    flat_got = [t for line in got for t in line]
    return len(flat_want) == len(flat_got) and all(tokens_equal(g, w, tolerance) for w, g in zip(flat_want, flat_got))


def values_equal(actual: Any, expected: Any, tolerance: float | None = APPS_FLOAT_TOLERANCE) -> bool:
    """Structural equality of JSON-like values, floats within ``tolerance`` (``True == 1`` as in APPS)."""
    if isinstance(actual, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(actual, int) and isinstance(expected, int):
            return actual == expected
        return actual == expected or (tolerance is not None and floats_close(float(actual), float(expected), tolerance))
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(actual) == len(expected) and all(values_equal(a, e, tolerance) for a, e in zip(actual, expected))
    if isinstance(actual, dict) and isinstance(expected, dict):
        if set(map(str, actual)) != set(map(str, expected)):
            return False
        by_key = {str(k): v for k, v in actual.items()}
        return all(values_equal(by_key[str(k)], v, tolerance) for k, v in expected.items())
    return actual == expected


def value_matches(actual: Any, expected: Any, tolerance: float | None = APPS_FLOAT_TOLERANCE) -> bool:
    """A call-based result against APPS's expected value (which may be wrapped in a list)."""
    if values_equal(actual, expected, tolerance):
        return True
    return isinstance(expected, list) and len(expected) == 1 and values_equal(actual, expected[0], tolerance)
