"""The demo's reward (templates/rewards/concise_summary.py, the README's third command):
each of its four terms on hand-made summaries of an embedded post, the figures its
docstring states, and its range on any text."""

from __future__ import annotations

import importlib.util
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.config import TEMPLATES_DIR
from marlhf_cli.data.tldr import format_prompt

PATH = TEMPLATES_DIR / "rewards" / "concise_summary.py"
spec = importlib.util.spec_from_file_location("concise_summary", PATH)
reward = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reward)

ROW = json.loads((TEMPLATES_DIR.parent / "data" / "samples" / "tldr.jsonl").read_text().splitlines()[0])
POST = ROW["info"]["post"]
PROMPT = format_prompt(ROW["info"]["subreddit"], ROW["info"]["title"], POST)
GOOD = ("I failed my first organic chemistry midterm and worry about my scholarship GPA. How do I recover, "
        "and should I go to office hours?")  # fmt: skip


def score(text: str) -> float:
    return reward.concise_summary(prompts=[PROMPT], completions=[text])[0]


def test_the_topic_is_the_posts_own_frequent_content_words():
    topic = reward.topic(reward.post_of(PROMPT))
    assert topic[:3] == ["midterm", "scholarship", "failed"]  # repeated in the post, or first seen in the title
    assert "post" not in topic and "first" not in topic and "that" not in topic  # the label, a generic word, a function word
    assert len(topic) == reward.TOPIC_WORDS


@pytest.mark.parametrize("name, text, expected, terms", [
    ("good", GOOD, 0.857, {"on_topic": 1.0, "concise": 1.0, "written": 1.0}),
    ("reference", ROW["summaries"][0]["text"], 0.522, {"on_topic": 0.6, "written": 1.0}),
    ("keywords", "midterm scholarship chemistry organic office hours grade notes", 0.0, {"written": 0.0}),
    ("copied", POST.split(". ")[0] + ". " + POST.split(". ")[1], 0.0, {"own_words": 0.0, "on_topic": 1.0}),
    ("retelling", " ".join(POST.split()[:70]), 0.0, {"concise": 0.0}),
    ("off topic", "My cat keeps waking me up at night and I do not know what to do about it.", 0.0, {"on_topic": 0.0, "concise": 1.0}),
    ("empty", "", 0.0, {"on_topic": 0.0, "concise": 0.0}),
])  # fmt: skip
def test_each_trick_is_closed_by_its_term(name, text, expected, terms):
    """The docstring's figures: each summary's score, and the term that decides it."""
    assert score(text) == pytest.approx(expected, abs=5e-4), name
    parts = reward.terms(PROMPT, text)
    for term, value in terms.items():
        assert parts[term] == pytest.approx(value), (name, term, parts)


def test_a_repeated_function_word_between_keywords_is_not_prose():
    listed = "the midterm the scholarship the failed the panicking the freshman"
    assert reward.terms(PROMPT, listed)["written"] == pytest.approx(2 / 10 / reward.PROSE_SHARE)
    assert score(listed) == pytest.approx(2 / 3)


@pytest.mark.parametrize("words, expected", [(0, 0.0), (4, 0.5), (8, 1.0), (30, 1.0), (45, 0.5), (60, 0.0), (80, 0.0)])
def test_the_word_budget(words, expected):
    assert reward.length_term(words) == pytest.approx(expected)


def test_copied_share_counts_four_word_sequences_found_in_the_post():
    post = reward.words("one two three four five six")
    assert reward.copied_share(reward.words("one two three four"), post) == 1.0
    assert reward.copied_share(reward.words("one two three four nine"), post) == 0.5  # of 2 sequences, 1 copied
    assert reward.copied_share(reward.words("one two three"), post) == 0.0  # too short to hold one


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300), st.text(max_size=400))
def test_scores_lie_in_0_1_for_any_text(prompt, completion):
    (value,) = reward.concise_summary(prompts=[prompt], completions=[completion])
    assert 0.0 <= value <= 1.0


def test_a_prompt_of_another_shape_is_read_whole():
    prompt = "Summarise: the dishwasher leaks, the dishwasher floods the kitchen floor."
    assert reward.topic(reward.post_of(prompt))[0] == "dishwasher"
