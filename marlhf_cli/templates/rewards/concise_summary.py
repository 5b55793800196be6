"""A reward a person can read and check: a concise summary, on the post's topic, in its own words.

    marlhf ppo --reward py:templates/rewards/concise_summary.py:concise_summary ...

(the README's third command, ``--preset cpu-real``). The score of a summary of a post (a
TL;DR prompt: ``SUBREDDIT: ... TITLE: ... POST: ... TL;DR:``) is the product of four terms
in [0, 1], each closing a trick the others leave open:

* **on topic**: how many of the post's ten most frequent content words (four letters or
  more, neither a function word nor a word every post uses, counted over title and post;
  ties go to the first seen, so the title's words lead) the summary uses, five of them
  counting in full;
* **concise**: 1 for 8 to 30 words, falling linearly to 0 at 0 and at 60 words, so neither
  a couple of keywords nor a retelling pays;
* **in its own words**: 1 minus the share of the summary's 4-word sequences found in the
  post, so copying the post's sentences does not pay;
* **written, not listed**: the summary's share of function words ("the", "to", "and", ...,
  each distinct one counted at most twice) as a ratio to the 30% that ordinary English
  holds, capped at 1, so a list of the post's keywords scores 0, and the same list with a
  "the" before each keyword loses a third.

On the embedded TL;DR sample's first post (tests/test_reward_template.py): a one-sentence
summary in the poster's words that names the problem scores 0.86, the dataset's own
reference summary 0.52, a list of keywords 0, a sentence copied from the post 0, the post's
first 70 words 0, a fluent sentence about something else 0. What it leaves open: a salad of
the post's keywords and varied function words ("the midterm a scholarship of failed ...")
scores 1, as any reward counting words would let it; read the samples a run prints.
Written for marlhf.
"""

from __future__ import annotations

import re
from collections import Counter

WORD = re.compile(r"[a-z][a-z']*")
FUNCTION_WORDS = frozenset(
    "a an the and or but if so to of in on at by for with from as is are was were be been being am do does did have has had "
    "i me my we our you your he him his she her it its they them their this that these those not no what when where "
    "who which how there here than then too very can could will would should may might must just about into over after "
    "before up out off down because while also".split()
)  # fmt: skip
# words too common in posts of every kind to say what one is about: never topic words
GENERIC = frozenset(
    "first back really like know want think feel going make made still even much many some every other only "
    "get got thing things something time year years week weeks month months today ago since".split()
)  # fmt: skip
TOPIC_WORDS, ENOUGH_TOPIC, BUDGET, LONGEST, PROSE_SHARE = 10, 5, (8, 30), 60, 0.30


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def post_of(prompt: str) -> str:
    """The title and post of a TL;DR prompt (the whole prompt when it has another shape)."""
    body = prompt.rsplit("TL;DR:", 1)[0]
    body = body.split("TITLE:", 1)[-1] if "TITLE:" in body else body
    return body.replace("POST:", " ")


def topic(post: str) -> list[str]:
    """The post's most frequent content words (ties: first seen first)."""
    counts = Counter(w for w in words(post) if len(w) >= 4 and w not in FUNCTION_WORDS and w not in GENERIC)
    return [w for w, _ in counts.most_common(TOPIC_WORDS)]


def length_term(n: int) -> float:
    low, high = BUDGET
    if n < low:
        return n / low
    if n <= high:
        return 1.0
    return max(0.0, (LONGEST - n) / (LONGEST - high))


def copied_share(summary: list[str], post: list[str]) -> float:
    """The share of the summary's 4-word sequences that appear in the post."""
    grams = [tuple(summary[i : i + 4]) for i in range(len(summary) - 3)]
    if not grams:
        return 0.0
    seen = {tuple(post[i : i + 4]) for i in range(len(post) - 3)}
    return sum(g in seen for g in grams) / len(grams)


def prose_words(summary: list[str]) -> int:
    """The summary's function words, each distinct one counted at most twice ("the X the Y
    the Z ..." is not prose)."""
    counts = Counter(w for w in summary if w in FUNCTION_WORDS)
    return sum(min(n, 2) for n in counts.values())


def terms(prompt: str, completion: str) -> dict[str, float]:
    """The four terms of one summary, by name (their product is the score)."""
    post = post_of(prompt)
    summary, source, wanted = words(completion), words(post), topic(post)
    if not summary:
        return {"on_topic": 0.0, "concise": 0.0, "own_words": 0.0, "written": 0.0}
    used = set(summary)
    return {
        "on_topic": min(1.0, sum(w in used for w in wanted) / min(ENOUGH_TOPIC, max(len(wanted), 1))),
        "concise": length_term(len(summary)),
        "own_words": 1.0 - copied_share(summary, source),
        "written": min(1.0, prose_words(summary) / len(summary) / PROSE_SHARE),
    }


def concise_summary(prompts, completions, **kwargs) -> list[float]:
    """One score per summary: the product of its four terms (module docstring)."""
    out = []
    for prompt, completion in zip(prompts, completions):
        parts = terms(prompt, completion)
        out.append(parts["on_topic"] * parts["concise"] * parts["own_words"] * parts["written"])
    return out
