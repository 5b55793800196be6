"""A judge's reply -> A, B or E (tie), or *unparsed* with the reason; never a guess.

Letters name **positions**: A is the response shown first, B the one shown second, E means
equal. Mapping positions back to the two files is :mod:`.judge`'s job.

Accepted, tried in this order (the first format that yields anything decides):

1. the whole reply is one answer: ``B``, ``**A**``, ``[[E]]``, ``"Tie"``, ``B.``;
2. JSON (bare, inside a fenced code block, or embedded in prose) with a choice key
   (``choice``, ``answer``, ``verdict``, ``winner``, ``preferred``, ``overall``, ``better``),
   or per-criterion JSON (WebGPT: ``{"factual_accuracy": "A", "coherence": "E",
   "helpfulness": "A"}``, values may also be ``{"choice": "A", ...}``): the judge's own
   overall choice when it gives one, else the majority of the criteria (an even split is E);
3. labelled answers in prose: ``Answer: B``, ``Final verdict - [[A]]``, ``Preferred
   summary: B``, ``Winner: tie``;
4. a line holding only an answer, first or last (reasoning before or after the letter),
   also inside a fenced block.

Unparsed, with a reason: an empty reply, no answer in any format, a choice value that is no
answer (``"C"``), and *conflicting* answers (``Answer: A`` ... ``Answer: B``), because
picking one of them would be a guess. Only capital A/B/E count as letters, so the article
"a" in "answer: a good summary" is never read as A.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

WORDS = {"tie": "E", "tied": "E", "equal": "E", "equally good": "E", "both": "E", "same": "E"}
CHOICE_KEYS = ("choice", "answer", "verdict", "winner", "preferred", "preference", "overall", "better", "final", "final_answer", "result")
CRITERIA = ("factual_accuracy", "coherence", "helpfulness")

_DECOR = " \t\r\n*_`'\"[](){}<>.,;:!"
_KEYWORD = r"(?i:final\s+)?(?i:answer|verdict|choice|winner|decision|preferred(?:\s+(?:response|summary|answer))?|better\s+(?:response|summary|answer)|preference)"
# On one line only; a letter followed by a lowercase word is the article ("Answer: A good
# summary ...") unless the word continues a verdict ("Answer: A is better").
_LABELLED = re.compile(
    _KEYWORD
    + r"[ \t]*(?i:is)?[ \t]*[:=\-–]*[ \t]*[\*_`'\"\[\(]*[ \t]*(?i:(?:response|summary|answer|option|assistant)[ \t]+)?"
    + r"(?P<answer>[ABE](?![A-Za-z0-9])(?![ \t]+(?!is\b|was\b|wins\b|because\b|since\b)[a-z])|(?i:tie|equal)(?![A-Za-z]))"
)
_DOUBLE_BRACKET = re.compile(r"\[\[\s*(?P<answer>[ABE]|(?i:tie|equal))\s*\]\]")
_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)```", re.DOTALL)


@dataclass
class Parsed:
    """``choice``: "A", "B", "E" or None (unparsed); ``how``: the format that decided, or the
    reason it is unparsed; ``criteria``: per-criterion letters when the judge gave them."""

    choice: str | None
    how: str
    criteria: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.choice is not None


def letter(value: object) -> str | None:
    """'A'/'B'/'E' from a bare answer token (decorations stripped), else None."""
    if not isinstance(value, str):
        return None
    token = value.strip(_DECOR)
    if token in ("A", "B", "E"):
        return token
    for prefix in ("Response ", "Summary ", "Answer ", "Option ", "Assistant "):
        if token.startswith(prefix) and token[len(prefix):] in ("A", "B"):
            return token[len(prefix):]
    return WORDS.get(token.lower())


def _json_objects(text: str) -> list[dict]:
    """Every JSON object in ``text``: the whole reply, fenced blocks, or embedded in prose."""
    found: list[dict] = []
    decoder = json.JSONDecoder()
    index = text.find("{")
    while index != -1:
        try:
            obj, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
            continue
        if isinstance(obj, dict):
            found.append(obj)
        index = text.find("{", end)
    return found


def _from_object(obj: dict) -> Parsed | None:
    lowered = {str(k).strip().lower().replace(" ", "_").replace("-", "_"): v for k, v in obj.items()}
    nested = lowered.get("criteria") if isinstance(lowered.get("criteria"), dict) else {}
    criteria: dict[str, str] = {}
    for name, value in {**lowered, **{str(k).lower().replace(" ", "_"): v for k, v in nested.items()}}.items():
        if name in CHOICE_KEYS or name == "criteria":
            continue
        if isinstance(value, dict):
            value = next((value[k] for k in value if str(k).lower() in CHOICE_KEYS), None)
        choice = letter(value)
        if choice and (name in CRITERIA or name in {"accuracy", "factuality", "factual", "helpful", "coherent"}):
            criteria[name] = choice
    overall = [lowered[k] for k in CHOICE_KEYS if k in lowered]
    if overall:
        value = overall[0]
        if isinstance(value, dict):
            value = next((value[k] for k in value if str(k).lower() in CHOICE_KEYS), None)
        choice = letter(value)
        if choice is None:
            return Parsed(None, f"unparsed: choice value {value!r} is not A, B or E", criteria)
        return Parsed(choice, "json-criteria" if criteria else "json", criteria)
    if criteria:
        a = sum(v == "A" for v in criteria.values())
        b = sum(v == "B" for v in criteria.values())
        return Parsed("A" if a > b else "B" if b > a else "E", "json-criteria-majority", criteria)
    return None


def _agree(found: list[Parsed]) -> Parsed | None:
    if not found:
        return None
    choices = {p.choice for p in found}
    if None in choices:
        return next(p for p in found if p.choice is None)
    if len(choices) > 1:
        return Parsed(None, f"unparsed: conflicting answers {sorted(choices)}")
    return found[-1]


def parse(reply: str | None) -> Parsed:
    """The judge's choice in ``reply`` (module doc for the formats and the refusals)."""
    text = (reply or "").strip()
    if not text:
        return Parsed(None, "unparsed: empty reply")
    whole = letter(text)
    if whole:
        return Parsed(whole, "letter")
    parsed = _agree([p for p in (_from_object(o) for o in _json_objects(text)) if p is not None])
    if parsed:
        return parsed
    labelled = [m.group("answer") for m in _LABELLED.finditer(text)] + [m.group("answer") for m in _DOUBLE_BRACKET.finditer(text)]
    parsed = _agree([Parsed(letter(a), "labelled") for a in labelled])
    if parsed:
        return parsed
    blocks = [b.strip() for b in _FENCE.findall(text)]
    fenced = [Parsed(letter(b), "fenced") for b in blocks if letter(b)]
    if fenced:
        return _agree(fenced)
    lines = [line for line in _FENCE.sub(lambda m: m.group(1), text).splitlines() if line.strip()]
    edges = [lines[0], lines[-1]] if len(lines) > 1 else lines
    parsed = _agree([Parsed(letter(line), "line") for line in edges if letter(line)])
    if parsed:
        return parsed
    return Parsed(None, "unparsed: no answer found")
