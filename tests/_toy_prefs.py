"""A toy preference set a tiny model learns in seconds: chosen says "good", rejected "bad".

Shared by the engine, SFT, reward-model and GPU tests (a helper module, not a fixture in the
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


def sft_then_rm(run_dir: Path, data: Path, *extra: str) -> Path:
    """``marlhf sft`` (tiny, 8 steps) then ``marlhf rm`` (16 steps) on ``data`` into ``run_dir``,
    in this process, as a user runs them; ``extra`` flags go to both. The reward model learns
    the toy preference (held-out accuracy >= 0.9)."""
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    common = ["--dataset", str(data), "--run-dir", str(run_dir), "--max-prompt-length", "32",
              "--max-response-length", "16", "--save-every", "0", "--eval-records", "20", *extra]  # fmt: skip
    sft = CliRunner().invoke(app, ["sft", "--model", "tiny", *common, "--batch-size", "4", "--max-steps", "8",
                                   "--lr", "2e-3", "--eval-every", "4"])  # fmt: skip
    assert sft.exit_code == 0, sft.output
    reward = CliRunner().invoke(app, ["rm", *common, "--batch-size", "8", "--max-steps", "16", "--lr", "2e-3",
                                      "--eval-every", "8"])  # fmt: skip
    assert reward.exit_code == 0, reward.output
    return run_dir
