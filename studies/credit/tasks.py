"""The credit-assignment study's tasks: rewards a random-init tiny policy can learn on a CPU.

Each reward is a number in [0, 1] given once, at the response's last token (as a reward
model's score), computed from the response's token ids; a random policy earns about 0.1 and
the best policy 1.0, so "a fraction of the best achievable score" is the same threshold on
every task. Tokens are sorted into 10 equally large classes by where their (tied) embedding
points along a fixed random direction u; class 9 is the "target" set of the original task.

* ``target``: the fraction of response tokens in the target class. Every token counts, so a
  terminal reward must be credited back over the whole response (the paper's setting).
* ``pairs``: the response read as consecutive 2-token units (tokens 0-1, 2-3, ...); a unit
  scores when its second token's class is the first's plus one (mod 10). The reward is
  decided by units, not by tokens one by one: a place where a macro action means something.
* ``prefix``: the fraction of the first 4 response tokens in the target class; the rest of
  the response is irrelevant, so the credit has to travel from the last token back to the
  first few.
* ``units`` (the study's second edition, which replaces ``pairs``: nothing learned that one):
  the response read as consecutive 5-token units (tokens 0-4, 5-9, ...); a unit scores when
  all five of its tokens lie in the upper six classes (4-9). A token in those classes earns
  nothing unless its four unit-mates do too: the reward is carried by units, not by tokens
  one by one (a random policy earns 0.6^5 = 0.08). Units line up with ``fixed --n 5``'s
  segments, the one place in the study where a macro action is exactly a unit of the reward.

EOS is not counted as a response token; a response with nothing to score gets 0.
"""

from __future__ import annotations

import torch

TASKS = ("target", "pairs", "prefix", "units")
CLASSES = 10
PREFIX_TOKENS = 4
UNIT_TOKENS = 5
UNIT_LOWEST_CLASS = 4  # a unit scores when all its tokens are in classes 4..9


def token_classes(embedding: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Class 0..9 of every token id: deciles of the embedding's projection on a random direction."""
    direction = torch.randn(embedding.shape[1], generator=torch.Generator().manual_seed(seed))
    order = torch.argsort(embedding.float() @ direction)
    classes = torch.empty(len(order), dtype=torch.long)
    classes[order] = torch.arange(len(order)) * CLASSES // len(order)
    return classes


def task_scores(task: str, ids: torch.Tensor, mask: torch.Tensor, classes: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """[B] scores in [0, 1] of responses ``ids`` [B, T] with real-token ``mask`` [B, T]."""
    mask = mask.bool()
    if eos_token_id is not None:
        mask = mask & (ids != eos_token_id)
    cls = classes[ids.clamp(min=0, max=len(classes) - 1)]
    target = (cls == CLASSES - 1) & mask
    if task == "target":
        return target.sum(1).float() / mask.sum(1).clamp(min=1).float()
    if task == "prefix":
        first = mask[:, :PREFIX_TOKENS]
        return target[:, :PREFIX_TOKENS].sum(1).float() / first.sum(1).clamp(min=1).float()
    if task == "pairs":
        units = ids.shape[1] // 2
        a, b = cls[:, 0 : 2 * units : 2], cls[:, 1 : 2 * units : 2]
        whole = mask[:, 0 : 2 * units : 2] & mask[:, 1 : 2 * units : 2]
        hits = ((b - a) % CLASSES == 1) & whole
        return hits.sum(1).float() / whole.sum(1).clamp(min=1).float()
    if task == "units":
        units = ids.shape[1] // UNIT_TOKENS
        shape = (ids.shape[0], units, UNIT_TOKENS)
        upper = ((cls >= UNIT_LOWEST_CLASS) & mask)[:, : units * UNIT_TOKENS].reshape(shape)
        whole = mask[:, : units * UNIT_TOKENS].reshape(shape).all(2)  # a unit cut by EOS or padding is no unit
        hits = upper.all(2) & whole
        return hits.sum(1).float() / whole.sum(1).clamp(min=1).float()
    raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


class TaskReward:
    """A study task as the PPO stage's reward function (a ``RewardFn``). The token classes come
    from the embedding of ``model``, the policy's initial weights (random-init: 'tiny' or a
    'random:<shape>')."""

    def __init__(self, task: str, model: str = "tiny"):
        from marlhf_cli.models import load_causal_lm, load_tokenizer

        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        self.task = task
        self.name = f"task {task}"
        self.classes = token_classes(load_causal_lm(model).get_input_embeddings().weight.detach().cpu())
        self.eos_token_id = load_tokenizer(model).eos_token_id

    def __call__(self, batch) -> torch.Tensor:
        return task_scores(self.task, batch.response_ids.cpu(), batch.response_mask.cpu(), self.classes, self.eos_token_id)
