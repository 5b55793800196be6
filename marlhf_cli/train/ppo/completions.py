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


def marked(pieces: list[str], read: frozenset[int] = frozenset()) -> str:
    """The segments' texts joined with ``@@`` after each one (before its trailing whitespace);
    the pieces at the indices ``read`` (an episode's observations) go in as they are."""
    out = []
    for index, text in enumerate(pieces):
        if index in read:
            out.append(text)
            continue
        visible, trailing = split_trailing_space(text)
        out.append(visible + MARK + trailing)
    return "".join(out)


def rows(experience, tokenizer, limit: int = ROWS) -> list[list]:
    """The table's rows for the first ``limit`` responses of ``experience`` (credit assigned).
    An episode (``--env``) is shown whole: its turns with their macro actions, each observation
    between them in brackets as the model read it (its template's role words included), not a
    macro action (it has no advantage)."""
    out = []
    episode = getattr(experience, "episode", None)
    for index in range(min(limit, experience.batch_size)):
        real = experience.mask[index] if episode is None else episode.attention[index]
        length = int(real.sum())
        ids = experience.response_ids[index, :length].tolist()
        acting = experience.mask[index, :length].tolist()
        segments = experience.segment_ids[index, :length].tolist() if experience.segment_ids is not None else [0] * length
        advantages = experience.advantages[index, :length].tolist()
        pieces, values, read, start = [], [], set(), 0
        for position in range(1, length + 1):
            if position == length or acting[position] != acting[start] or segments[position] != segments[start]:
                text = tokenizer.decode(ids[start:position], skip_special_tokens=True)
                if acting[start]:
                    pieces.append(text)
                    values.append(advantages[start])
                else:  # an observation: shown as read, not drawn
                    read.add(len(pieces))
                    pieces.append(f"[{' '.join(text.split())}] ")
                start = position
        prompt = experience.prompts[index]
        out.append([
            prompt if len(prompt) <= PROMPT_CHARS else "..." + prompt[-PROMPT_CHARS:],
            marked(pieces, frozenset(read)), round(float(experience.raw_scores[index]), 4), " ".join(f"{v:+.3f}" for v in values),
        ])  # fmt: skip
    return out
