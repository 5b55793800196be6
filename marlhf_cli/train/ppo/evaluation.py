"""PPO's held-out evaluation: sample each held-out prompt once with the current policy and
score it with the reward, sharded over processes; the mean score is the stage's eval curve.
The prompts are distinct (a source may hold several records of one prompt).

The samples' ``prompt`` is the record's text (the transcript for a conversation, whatever
``--chat-template`` renders), ``rendered_prompt`` the text the policy saw where a chat
template made another, ``eos`` says the response ended at a stop token (EOS or the
template's end of turn), and a conversation's prompt turns ride along as ``conversation``."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ... import engine as eng
from ...data.records import one_per_prompt
from ...episodes.rollout import transcript_text
from ...errors import UserError
from ...seeding import derived_seed
from .. import common
from . import stopping
from .experience import generate
from ...scoring.rewards import scoring_batch
from ..forward import resident


def sample_prompt(record: dict, rendered: str | None = None) -> dict:
    """A samples row's prompt: the record's text (what a judge reads, and how two files'
    rows are matched), its turns when it is a conversation (``judge --rm`` renders them with a
    chat template), and ``rendered``, the text the policy was given, when it is another (a
    chat template's rendering of the turns)."""
    row = {"prompt": record["prompt"]}
    if "conversation" in record:
        row["conversation"] = {"prompt": record["conversation"]["prompt"]}
    if rendered is not None and rendered != record["prompt"]:
        row["rendered_prompt"] = rendered
    return row


def held_out_prompts(config: Any) -> list[dict]:
    """The first ``--eval-prompts`` distinct prompts of the eval split, one record each (the
    record goes with its prompt: the APPS reward needs its tests); says so when there are fewer."""
    if not config.eval_prompts:
        return []
    records = one_per_prompt(common.load_split(config, "eval", None, report=False).records)
    if len(records) < config.eval_prompts:
        common.say(
            f"the eval split has {len(records)} distinct prompts: evaluating {len(records)}, "
            f"not {config.eval_prompts} (--eval-prompts)"
        )
    return records[: config.eval_prompts]


def _gather_rows(rows: list[dict]) -> list[dict]:
    """Every process's rows on every process, in rank order."""
    if eng.world_size() == 1:
        return rows
    gathered: list[Any] = [None] * eng.world_size()
    torch.distributed.all_gather_object(gathered, rows)
    return [row for part in gathered for row in part]


@torch.no_grad()
def evaluate(ctx: Any, records: Sequence[dict], step: int) -> tuple[dict[str, float], list[dict]]:
    """Mean reward score on held-out prompts at the training temperature; also the samples.

    Prompts are sharded over processes. Sampling and scoring run no collective (the sampler
    holds whole parameters, the reward model is not sharded), so shards may differ in size.
    """
    config, models = ctx.config, ctx.models
    rank, processes = eng.rank(), eng.world_size()
    mine = list(records[rank::processes])
    chunk = max(1, config.rollout_batch_size // processes)
    rows: list[dict] = []
    sampler = models.sampler.model()  # a collective under ZeRO-3: every process calls it once
    failure = None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived_seed(config.seed, step, rank, "eval"))
        try:
            _score_shard(ctx, mine, chunk, rank, processes, sampler, rows)
        except UserError as error:  # a user's reward function failed (train/ppo/stopping.py)
            failure = error
    stopping.agree(failure)
    rows = sorted(_gather_rows(rows), key=lambda row: row["index"])  # back in held-out order
    for row in rows:
        del row["index"]
    n = max(len(rows), 1)
    metrics = {
        "score": sum(r["score"] for r in rows) / n,
        "response_length": sum(r["length"] for r in rows) / n,
        "eos_rate": sum(r["eos"] for r in rows) / n,
        "prompts": float(len(rows)),
    }
    for key in (key for key in (rows[0] if rows else {}) if key.startswith("score_")):  # several --reward
        metrics[key] = sum(r[key] for r in rows) / n
    if rows and "turns" in rows[0]:  # --env: assistant turns per episode
        metrics["turns"] = sum(r["turns"] for r in rows) / n
    return metrics, rows


def _score_shard(ctx: Any, mine: Sequence[dict], chunk: int, rank: int, processes: int, sampler, rows: list[dict]) -> None:
    """Sample and score this process's held-out prompts, appending one row per prompt."""
    config, models = ctx.config, ctx.models
    for start in range(0, len(mine), chunk):
        part = mine[start : start + chunk]
        if ctx.episodes is not None:
            _play_shard(ctx, part, [rank + (start + i) * processes for i in range(len(part))], sampler, rows)
            continue
        prompts = [ctx.chat.prompt(r) for r in part]
        prompt_ids, prompt_mask, response_ids, mask, has_eos, _ = generate(
            sampler, models.tokenizer, prompts, ctx.rollout, device=models.device
        )
        batch = scoring_batch(models.tokenizer, prompts, part, prompt_ids, prompt_mask, response_ids, mask, has_eos)
        with resident(getattr(models.reward, "model", None), models.device, config.offload_frozen):
            scores = models.reward(batch).float().cpu()
        parts = {f"score_{name}": part for name, part in getattr(models.reward, "last", {}).items()}
        lengths = mask.sum(dim=1).cpu()
        for i, record in enumerate(part):
            rows.append({
                "index": rank + (start + i) * processes, **sample_prompt(record, prompts[i]), "response": batch.responses[i],
                "score": float(scores[i]), **{key: float(part[i]) for key, part in parts.items()},
                "length": int(lengths[i]), "eos": bool(has_eos[i]),
            })  # fmt: skip


def _play_shard(ctx: Any, part: Sequence[dict], indices: Sequence[int], sampler, rows: list[dict]) -> None:
    """--env: one episode per held-out record (its environment seeded by the record's place in
    the held-out list, the same at every evaluation); the score is the episode's return, the
    response its transcript, and ``episode`` its messages."""
    from .episodes import held_out

    drawn = held_out(ctx, sampler, part, indices)
    returns, lengths, turns = drawn.returns(), drawn.mask.sum(dim=1).cpu(), drawn.turns
    for i, record in enumerate(part):
        rows.append({
            "index": indices[i], **sample_prompt(record, drawn.prompts[i]), "response": transcript_text(drawn.transcripts[i]),
            "episode": drawn.transcripts[i], "score": float(returns[i]), "length": int(lengths[i]), "eos": bool(drawn.has_eos[i]),
            "turns": int(turns[i]),
        })  # fmt: skip
