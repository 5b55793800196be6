"""Judge templates: which one a comparison uses, and how a pair becomes the judge's message.

Templates live in ``templates/judge/<task>.txt`` (see its README for the placeholders).
Placeholders are ``{{prompt}}``, ``{{response_a}}`` and ``{{response_b}}``, replaced by plain
string substitution in one pass, so a JSON example in a template needs no escaping and a
response that itself contains ``{{prompt}}`` is never expanded a second time.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..config import TEMPLATES_DIR
from ..errors import UserError

JUDGE_TEMPLATES = TEMPLATES_DIR / "judge"
TASKS = ("tldr", "hh", "webgpt")
PLACEHOLDERS = ("{{prompt}}", "{{response_a}}", "{{response_b}}")
_PLACEHOLDER = re.compile(r"\{\{(prompt|response_a|response_b)\}\}")


@dataclass(frozen=True)
class Template:
    name: str  # the task name, or the file's path for --template
    text: str

    @property
    def sha(self) -> str:
        """Part of the cache key: editing a template never reuses the old template's verdicts."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]

    def render(self, prompt: str, first: str, second: str) -> str:
        values = {"prompt": prompt, "response_a": first, "response_b": second}
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.text)


def detect_task(prompts: Sequence[str]) -> str | None:
    """tldr, hh or webgpt from the shape of the dataset prompts (marlhf's own formats)."""
    votes = {"tldr": 0, "hh": 0, "webgpt": 0}
    for prompt in prompts:
        text = prompt.rstrip()
        if text.endswith("TL;DR:"):
            votes["tldr"] += 1
        elif "Human:" in text and text.endswith("Assistant:"):
            votes["hh"] += 1
        elif text.startswith("Question:") and text.endswith("Answer:"):
            votes["webgpt"] += 1
    task, count = max(votes.items(), key=lambda kv: kv[1])
    return task if prompts and count * 2 > len(prompts) else None


def load_template(task: str, template_file: str | None, prompts: Sequence[str]) -> Template:
    """The user's ``--template`` file, else the built-in one for ``--task`` (auto-detected)."""
    if template_file:
        path = Path(template_file)
        if not path.is_file():
            raise UserError(f"{path}: template file not found")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{path}: template is not UTF-8 text") from None
        missing = [p for p in PLACEHOLDERS if p not in text]
        if missing:
            raise UserError(f"{path}: template lacks {', '.join(missing)} (see templates/judge/README.md)")
        return Template(str(path), text)
    if task == "auto":
        detected = detect_task(prompts)
        if detected is None:
            raise UserError(
                "cannot tell the task from the prompts: pass --task tldr|hh|webgpt, or --template FILE"
            )
        task = detected
    if task not in TASKS:
        raise UserError(f"--task must be auto, {', '.join(TASKS)}, got '{task}'")
    return Template(task, (JUDGE_TEMPLATES / f"{task}.txt").read_text(encoding="utf-8"))
