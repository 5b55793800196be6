"""The completions table ``ppo`` gives its trackers (``--report-to``) at each evaluation step:
what the termination rule made of real responses while training runs.

One row per response of the step's rollout (the first :data:`ROWS`): the prompt's end, the
response with ``@@`` after every macro action (as ``marlhf segment`` prints them: the mark
before a segment's trailing whitespace), its score, and each macro action's advantage in order.
Rows come from the training rollout, not the held-out evaluation, because only the rollout
has advantages; ``rloo`` and ``grpo`` give one advantage to a whole response (one segment).
"""

from __future__ import annotations

from ...segment import MARK, split_trailing_space

COLUMNS = ["prompt", "response", "score", "segment_advantages"]
ROWS = 8
PROMPT_CHARS = 300  # the prompt's end (TL;DR posts are long; the cue is at the end)


def marked(pieces: list[str]) -> str:
    """The segments' texts joined with ``@@`` after each one (before its trailing whitespace)."""
    out = []
    for text in pieces:
        visible, trailing = split_trailing_space(text)
        out.append(visible + MARK + trailing)
    return "".join(out)


def rows(experience, tokenizer, limit: int = ROWS) -> list[list]:
    """The table's rows for the first ``limit`` responses of ``experience`` (credit assigned)."""
    out = []
    for index in range(min(limit, experience.batch_size)):
        length = int(experience.mask[index].sum())
        ids = experience.response_ids[index, :length].tolist()
        segments = experience.segment_ids[index, :length].tolist() if experience.segment_ids is not None else [0] * length
        advantages = experience.advantages[index, :length].tolist()
        pieces, values, start = [], [], 0
        for position in range(1, length + 1):
            if position == length or segments[position] != segments[start]:
                pieces.append(tokenizer.decode(ids[start:position], skip_special_tokens=True))
                values.append(advantages[start])
                start = position
        prompt = experience.prompts[index]
        out.append([
            prompt if len(prompt) <= PROMPT_CHARS else "..." + prompt[-PROMPT_CHARS:],
            marked(pieces), round(float(experience.raw_scores[index]), 4), " ".join(f"{v:+.3f}" for v in values),
        ])  # fmt: skip
    return out
