"""TL;DR summarisation: openai/summarize_from_feedback ("comparisons") -> preference records.

Prompt (the paper's format)::

    SUBREDDIT: r/{subreddit}
    TITLE: {title}
    POST: {post}
    TL;DR:

and ``chosen``/``rejected`` are the two summaries as written (they start with a space).

Row shapes understood (one is picked per file from its first row):

* ``hub``: ``info{post,title,subreddit}``, ``summaries[{text}]`` (two), ``choice`` (0/1,
  the index of the preferred summary). Rows whose ``info.post`` is null are CNN/DM articles
  (validation split) and are dropped as "not a Reddit post".
* ``flat``: ``post``, ``subreddit``, ``title``, ``chosen``, ``rejected`` (the comparisons
  file in ../shared/data/tldr).
* ``reference``: ``post``, ``subreddit``, ``title``, ``summary`` -> demonstration records
  (prompt + chosen) for SFT, such as the posts-with-reference file.

Rows are grouped by post, so one post never lands in two splits (posts repeat across rows).
"""

from __future__ import annotations

from .hub import HubSpec
from .records import (
    INVALID,
    NOT_REDDIT,
    WRONG_TYPE,
    Dropped,
    Parsed,
    RowProblem,
    get_field,
    get_list,
    get_text,
    preference,
    type_name,
)

NAME = "tldr"
DESCRIPTION = "TL;DR summarisation (openai/summarize_from_feedback, comparisons)"
HUB = HubSpec(repo="openai/summarize_from_feedback", config="comparisons", eval_split="validation")
SAMPLE = "tldr.jsonl"


def format_prompt(subreddit: str, title: str, post: str) -> str:
    """The paper's TL;DR prompt; ``subreddit`` may be given with or without 'r/'."""
    subreddit = subreddit.strip()
    if subreddit.startswith("r/"):
        subreddit = subreddit[2:]
    return f"SUBREDDIT: r/{subreddit}\nTITLE: {title.strip()}\nPOST: {post.strip()}\nTL;DR:"


def detect(row: dict) -> str | None:
    """The row shape (see module doc), or ``None`` when the row is not TL;DR data."""
    if {"info", "summaries", "choice"} <= row.keys():
        return "hub"
    if {"post", "title", "subreddit"} <= row.keys():
        if {"chosen", "rejected"} <= row.keys():
            return "flat"
        if "summary" in row:
            return "reference"
    return None


def parse(row: dict, variant: str) -> Parsed:
    """One source row -> record; raises RowProblem / Dropped."""
    if variant == "hub":
        return _parse_hub(row)
    post = get_text(row, "post")
    prompt = format_prompt(get_text(row, "subreddit"), get_text(row, "title"), post)
    if variant == "reference":
        return Parsed({"prompt": prompt, "chosen": get_text(row, "summary")}, post.strip())
    return Parsed(preference(prompt, get_text(row, "chosen"), get_text(row, "rejected")), post.strip())


def _parse_hub(row: dict) -> Parsed:
    info = get_field(row, "info")
    if not isinstance(info, dict):
        raise RowProblem(WRONG_TYPE, "info", f"expected an object, got {type_name(info)}")
    if info.get("post") is None and info.get("article") is not None:
        raise Dropped(NOT_REDDIT)
    post = get_text(info, "post", parent="info")
    prompt = format_prompt(get_text(info, "subreddit", parent="info"), get_text(info, "title", parent="info"), post)
    summaries = get_list(row, "summaries")
    if len(summaries) != 2:
        raise RowProblem(INVALID, "summaries", f"expected 2 summaries, got {len(summaries)}")
    texts = [get_text(s, "text", parent=f"summaries[{i}]") for i, s in enumerate(summaries)]
    choice = get_field(row, "choice")
    if isinstance(choice, bool) or not isinstance(choice, int):
        raise RowProblem(WRONG_TYPE, "choice", f"expected an integer, got {type_name(choice)}")
    if choice not in (0, 1):
        raise RowProblem(INVALID, "choice", f"expected 0 or 1, got {choice}")
    return Parsed(preference(prompt, texts[choice], texts[1 - choice]), post.strip())
