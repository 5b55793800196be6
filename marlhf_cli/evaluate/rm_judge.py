"""The reward model as a judge: the response with the higher score wins (``--rm``).

Why: the paper checks how far its reward model agrees with GPT-4 (Table 1), and a reward
model costs nothing per pair. Scores are read exactly as ``marlhf rm`` trains and PPO uses
them: prompt tokens (the end kept when too long) + response tokens + EOS, the score at the
last real token (:func:`marlhf_cli.train.scoring.sequence_scores`). Equal scores (within
1e-6) are a tie, which in practice means identical responses.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .pairs import Pair


def score_texts(model, tokenizer, prompts: Sequence[str], responses: Sequence[str], *, max_prompt: int, max_response: int, batch_size: int, advance: Callable[[int], None] = lambda n: None) -> list[float]:
    """One reward score per (prompt, response), in batches of ``batch_size``."""
    import torch

    from ..train.encode import attention_mask, encode_prompt, encode_response, pad_right
    from ..train.scoring import sequence_scores

    rows = [encode_prompt(tokenizer, p, max_prompt) + encode_response(tokenizer, r, max_response) for p, r in zip(prompts, responses)]
    scores: list[float] = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            part = rows[start : start + batch_size]
            ids, mask = pad_right(part, tokenizer.pad_token_id), attention_mask(part)
            scores.extend(float(s) for s in sequence_scores(model, ids, mask).cpu())
            advance(len(part))
    return scores


def judge(pairs: Sequence[Pair], reward_model: str, *, max_prompt: int, max_response: int, batch_size: int, advance: Callable[[int], None] = lambda n: None) -> list[dict]:
    """Per-pair rows: scores of both sides and the verdict for side A."""
    from ..models import load_reward_model, load_tokenizer
    from ..train.forward import disable_dropout

    tokenizer = load_tokenizer(reward_model)
    model = load_reward_model(reward_model)
    disable_dropout(model)
    model.eval().requires_grad_(False)
    prompts = [p.prompt for p in pairs]
    both = score_texts(
        model, tokenizer, prompts + prompts, [p.response_a for p in pairs] + [p.response_b for p in pairs],
        max_prompt=max_prompt, max_response=max_response, batch_size=max(1, batch_size), advance=advance,
    )  # fmt: skip
    rows = []
    for pair, a, b in zip(pairs, both[: len(pairs)], both[len(pairs) :]):
        verdict = "tie" if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) else "win" if a > b else "loss"
        rows.append({
            "key": pair.key, "prompt": pair.prompt, "response_a": pair.response_a, "response_b": pair.response_b,
            "verdict": verdict, "score_a": a, "score_b": b,
        })  # fmt: skip
    return rows
