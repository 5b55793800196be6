"""The reward model as a judge: the response with the higher score wins (``--rm``).

Why: the paper checks how far its reward model agrees with GPT-4 (Table 1), and a reward
model costs nothing per pair. Scores are read exactly as ``marlhf rm`` trains and PPO uses
them: prompt tokens (the end kept when too long) + response tokens + EOS (or, for a sample
that carries its conversation, rendered with ``--chat-template`` and ended by the template's
end-of-turn token: :mod:`marlhf_cli.chat`), the score at the last real token
(:func:`marlhf_cli.scoring.heads.sequence_scores`). Equal scores (within
1e-6) are a tie, which in practice means identical responses.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from ..chat import ChatFormat, Rendered
from .pairs import Pair


def score_texts(model, tokenizer, prompts: Sequence[str], responses: Sequence[str], *, max_prompt: int, max_response: int, batch_size: int, advance: Callable[[int], None] = lambda n: None) -> list[float]:
    """One reward score per plain-text (prompt, response), in batches of ``batch_size``."""
    rendered = [Rendered(((p, False),), r, tokenizer.eos_token_id) for p, r in zip(prompts, responses)]
    return score_rendered(model, tokenizer, rendered, max_prompt=max_prompt, max_response=max_response, batch_size=batch_size, advance=advance)


def score_rendered(model, tokenizer, rendered: Sequence[Rendered], *, max_prompt: int, max_response: int, batch_size: int, advance: Callable[[int], None] = lambda n: None) -> list[float]:
    """One reward score per rendered (prompt, response) (:mod:`marlhf_cli.chat`), read on the
    response's end token, in batches of ``batch_size``."""
    import torch

    from ..encode import attention_mask, encode_prompt, encode_response, pad_right
    from ..scoring.heads import sequence_scores

    rows = [
        encode_prompt(tokenizer, r.prompt, max_prompt) + encode_response(tokenizer, r.response, max_response, r.end_id)
        for r in rendered
    ]
    scores: list[float] = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            ids, mask = pad_right(part, tokenizer.pad_token_id), attention_mask(part)
            scores.extend(float(s) for s in sequence_scores(model, ids, mask).cpu())
            advance(len(part))
    return scores


def judge(pairs: Sequence[Pair], reward_model: str, *, max_prompt: int, max_response: int, batch_size: int, chat_template: str = "auto", conversations: Mapping[str, dict] | None = None, advance: Callable[[int], None] = lambda n: None) -> tuple[list[dict], dict]:
    """Per-pair rows (scores of both sides and the verdict for side A), and the first pair's
    rendered text (side A) for the result file.

    A prompt with turns in ``conversations`` is rendered with ``chat_template`` (as ``marlhf
    rm`` rendered its training data), the others as plain text (or by a template file).
    """
    from ..models import load_reward_model, load_tokenizer
    from ..train.forward import disable_dropout

    tokenizer = load_tokenizer(reward_model)
    chat = ChatFormat(tokenizer, chat_template)
    model = load_reward_model(reward_model)
    disable_dropout(model)
    model.eval().requires_grad_(False)
    records = [{"prompt": p.prompt, **({"conversation": conversations[p.prompt]} if p.prompt in (conversations or {}) else {})} for p in pairs]
    rendered = [chat.render(r, text=p.response_a) for r, p in zip(records, pairs)]
    rendered += [chat.render(r, text=p.response_b) for r, p in zip(records, pairs)]
    both = score_rendered(
        model, tokenizer, rendered, max_prompt=max_prompt, max_response=max_response, batch_size=max(1, batch_size), advance=advance,
    )  # fmt: skip
    rows = []
    for pair, a, b in zip(pairs, both[: len(pairs)], both[len(pairs) :]):
        verdict = "tie" if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) else "win" if a > b else "loss"
        rows.append({
            "key": pair.key, "prompt": pair.prompt, "response_a": pair.response_a, "response_b": pair.response_b,
            "verdict": verdict, "score_a": a, "score_b": b,
        })  # fmt: skip
    return rows, chat.shown(rendered[0])
