"""Seeds derived from a run's seed, so that every random draw of a stage is reproducible and
independent of the others (a resumed run, another process or another temperature draws the
same numbers as the uninterrupted run would)."""

from __future__ import annotations

import hashlib
from typing import Any


def derived_seed(*parts: Any) -> int:
    """A well-mixed 63-bit seed from its parts, e.g. (seed, step, rank, purpose)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
