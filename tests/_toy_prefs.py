"""A toy preference set a tiny model learns in seconds: chosen says "good", rejected "bad".

Shared by the engine, SFT and reward-model tests (a helper module, not a fixture in the
shared conftest). Written in TRL's prompt/chosen/rejected format, so the data layer
detects it from the file alone.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = ["cats", "rain", "trains", "music", "bread", "rivers", "stars", "chess", "paint", "snow", "tea", "boats"]
WORDS = ["today", "always", "indeed", "truly", "here", "now", "still", "again"]


def write_toy_preferences(path: Path, n: int = 200, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(n):
            topic, word = rng.choice(TOPICS), rng.choice(WORDS)
            row = {
                "prompt": f"Question {index}: tell me about {topic}.\nAnswer:",
                "chosen": f" {topic.capitalize()} are good, {word}.",
                "rejected": f" {topic.capitalize()} are bad, {word}.",
            }
            handle.write(json.dumps(row) + "\n")
    return path
