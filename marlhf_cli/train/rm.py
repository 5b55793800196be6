"""``marlhf rm``: a pairwise reward model, initialised from the run's SFT model.

Loss: ``-log sigmoid(r(prompt, chosen) - r(prompt, rejected))`` averaged over pairs. The
score is read at the last real token of prompt + response + EOS (see
:mod:`.scoring` for why not at the first pad), which is also where PPO places it; under a
chat template (:mod:`marlhf_cli.chat`) that token is the template's end of turn.

Pairs whose chosen and rejected responses become identical after truncation to
``max_response_length`` teach nothing (their loss is log 2 whatever the model does); they
are left out and counted.

Held-out evaluation reports accuracy (share of pairs with r_chosen > r_rejected), the mean
margin, and the mean and standard deviation of all held-out scores; the last two are stored
in ``rm/config.json`` (``marlhf_reward_mean``, ``marlhf_reward_std``) for
:func:`.scoring.normalized_score`. ``rm/`` loads with
``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .. import checkpoints, engine as eng, lora
from ..wording import count
from ..artifacts import RunDir
from . import common, extending, loop
from .sources import base_model
from ..chat import NONE, ChatFormat
from ..encode import Cuts, attention_mask, encode_prompt, encode_response, pad_right

STAGE = "rm"


# ---------------------------------------------------------------------------------------
# pairs


def encode_pair(tokenizer, record: dict, max_prompt: int, max_response: int, chat: ChatFormat | None = None,
                cuts: Cuts | None = None) -> dict | None:
    """``{"chosen": ids, "rejected": ids, "prompt_length": P}``, each prompt + response + its
    end token (EOS, or the chat template's end of turn, where the score is read), the first P
    ids the prompt's (``marlhf dpo`` scores the responses alone); None if they coincide."""
    chat = chat or ChatFormat(tokenizer, NONE)
    prompt = encode_prompt(tokenizer, chat.prompt(record), max_prompt, cuts)
    chosen, rejected = (chat.render(record, key) for key in ("chosen", "rejected"))
    chosen_ids = encode_response(tokenizer, chosen.response, max_response, chosen.end_id, cuts)
    rejected_ids = encode_response(tokenizer, rejected.response, max_response, rejected.end_id, cuts)
    if chosen_ids == rejected_ids:
        return None
    return {"chosen": prompt + chosen_ids, "rejected": prompt + rejected_ids, "prompt_length": len(prompt)}


def encode_pairs(tokenizer, records: Sequence[dict], max_prompt: int, max_response: int, chat: ChatFormat | None = None,
                 cuts: Cuts | None = None) -> tuple[list[dict], int]:
    """Encoded pairs and how many were left out as identical after truncation."""
    pairs = [encode_pair(tokenizer, r, max_prompt, max_response, chat, cuts) for r in records]
    kept = [p for p in pairs if p is not None]
    return kept, len(pairs) - len(kept)


def collate(pairs: Sequence[dict], pad_id: int) -> dict:
    """Chosen sequences first, then rejected, in one right-padded batch of 2B rows."""
    rows = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    return {"input_ids": pad_right(rows, pad_id), "attention_mask": attention_mask(rows), "pairs": len(pairs)}


# ---------------------------------------------------------------------------------------
# loss and metrics


def pair_count(batch: dict) -> int:
    return int(batch["pairs"])


def pair_sums(engine, batch: dict) -> dict:
    """Summed pairwise loss, correct pairs, margins, and score moments of one batch."""
    import torch.nn.functional as F

    scores = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    n = int(batch["pairs"])
    chosen, rejected = scores[:n], scores[n:]
    margin = chosen - rejected
    detached = scores.detach().double()
    return {
        "loss": -F.logsigmoid(margin).sum(),
        "correct": (margin.detach() > 0).sum(),
        "margin": margin.detach().sum(),
        "score": detached.sum(),
        "score_sq": (detached**2).sum(),
    }


def summarize(sums: dict[str, float], pairs: float) -> dict[str, float]:
    n = max(pairs, 1.0)
    mean = sums.get("score", 0.0) / (2 * n)
    variance = max(sums.get("score_sq", 0.0) / (2 * n) - mean**2, 0.0)
    return {
        "loss": sums.get("loss", float("nan")) / n,
        "accuracy": sums.get("correct", 0.0) / n,
        "margin": sums.get("margin", 0.0) / n,
        "score_mean": mean,
        "score_std": math.sqrt(variance),
        "pairs": pairs,
    }


# ---------------------------------------------------------------------------------------
# the stage


def build_task(config: Any, tokenizer, train_records, eval_records, chat: ChatFormat | None = None,
               cuts: Cuts | None = None) -> tuple[loop.Task, int]:
    """The pairs task and how many pairs were identical; ``cuts`` counts what the length
    limits cut of the training pairs (each pair: one prompt, two responses)."""
    chat = chat or ChatFormat(tokenizer, config.chat_template)
    train, dropped = encode_pairs(tokenizer, train_records, config.max_prompt_length, config.max_response_length, chat, cuts)
    held_out, dropped_eval = encode_pairs(tokenizer, eval_records, config.max_prompt_length, config.max_response_length, chat)
    pad_id = tokenizer.pad_token_id
    task = loop.Task(
        name=STAGE,
        train=train,
        eval=held_out,
        collate=lambda pairs: collate(pairs, pad_id),
        count=pair_count,
        sums=pair_sums,
        summarize=summarize,
        live=("loss", "accuracy"),
        size=lambda pair: max(len(pair["chosen"]), len(pair["rejected"])),
        fingerprint={"train_examples": len(train), "model": str(config.model), "trainable_layers": config.trainable_layers},
    )
    return task, dropped + dropped_eval


@dataclass
class PairPlan:
    """What a stage that trains on preference pairs (``rm``, ``dpo``) knows before its model
    loads: the encoded task, the pairs left out, the chat format and cuts (for run.json), the
    steps and the resume plan."""

    task: loop.Task
    identical: int
    chat: ChatFormat
    cuts: Cuts
    steps: int
    plan: Any


def plan_pairs(stage: str, config: Any, run_dir: RunDir, model_name: str, tokenizer, train, held_out,
               build: Callable[..., tuple[loop.Task, int]]) -> PairPlan:
    """The start-up both pair stages share, saying each thing once: the records, the chat
    format, the cuts, the pairs left out; then the steps and whether it resumes. ``build``
    is the stage's own ``build_task``."""
    chat = ChatFormat(tokenizer, config.chat_template)
    common.say(common.describe_records(stage, train, f"{len(held_out.records)} held out for evaluation", bool(config.split_shares)))
    if note := chat.note(train.records):  # plain-text data needs no word
        common.say(note)
    cuts = Cuts()
    task, identical = build(config, tokenizer, train.records, held_out.records, chat, cuts)
    if cut := cuts.describe(config.max_prompt_length, config.max_response_length):
        common.say(f"{stage}: {cut}")
    if identical:
        common.say(f"left out {count(identical, 'pair')} whose responses are identical after truncation to {config.max_response_length} tokens")
    steps = loop.total_steps(len(task.train), config.batch_size, config.epochs, config.max_steps)
    if lora.enabled(config):
        task.fingerprint.update(lora.base_identity(config, model=model_name))
    return PairPlan(task, identical, chat, cuts, steps, loop.plan_resume(config, run_dir, stage, task, steps))


def run(config: Any) -> dict[str, Any]:
    """Train the reward model and write ``rm/`` into the run directory; returns final metrics."""
    with RunDir(config.run_dir).writing(STAGE):  # one writer of the stage's outputs at a time
        return _run(config)


def _run(config: Any) -> dict[str, Any]:
    from ..models import check_context, load_tokenizer

    run_dir = RunDir(config.run_dir)
    model_name = base_model(config, run_dir)  # "run marlhf sft first" before torch is imported
    common.start(config)
    from ..scoring import heads as scoring
    from .freeze import train_top_layers
    check_context(model_name, config.max_prompt_length, config.max_response_length,
                  prompt_flag="--max-prompt-length", response_flag="--max-response-length")  # fmt: skip
    train = common.load_split(config, "rm", config.max_records).require(STAGE, ("preference",))
    held_out = common.load_split(config, "eval", config.eval_records, report=False)
    tokenizer = load_tokenizer(model_name, padding_side="right")
    pairs = plan_pairs(STAGE, config, run_dir, model_name, tokenizer, train, held_out, build_task)
    task, steps, plan = pairs.task, pairs.steps, pairs.plan
    extension = plan.extension  # a finished rm/ made longer: its weights are the start
    model = _load_quietly(extension.exports[0] if extension and not lora.enabled(config) else model_name, config.debug)
    model.config.pad_token_id = tokenizer.pad_token_id
    save = None
    if lora.enabled(config):  # adapters (in the top --trainable-layers blocks) and the whole score head
        model = lora.add_adapters(model, config, task="score", base=model_name, top_layers=config.trainable_layers)
        if extension:
            extending.start_adapters(model, extension.exports[0])
        common.say(lora.trainable_summary(model) + _top_blocks(config.trainable_layers))
        save = lora.merged_saver(lambda: _load_quietly(model_name, config.debug), stage="rm")
    elif config.trainable_layers is not None:
        trainable, total = train_top_layers(model, config.trainable_layers)
        common.say(f"training the top {count(config.trainable_layers, 'block')}, final norm and head: {trainable:,} of {count(total, 'parameter')}")
    engine = eng.build_engine(
        scoring.SequenceScorer(model), config, lr=config.lr, batch_size=config.batch_size, total_steps=steps
    )
    inputs = common.inputs_entry(
        config, model_name, train, held_out, train_pairs=len(task.train), identical_pairs=pairs.identical,
        chat_template=pairs.chat.example(train.records), cut=pairs.cuts.as_dict(),
    )  # fmt: skip
    result, monitor = loop.fit_stage(task, engine, config=config, run_dir=run_dir, stage=STAGE, inputs=inputs, steps=steps, plan=plan)
    stats = result.eval or result.train
    out = checkpoints.export_pretrained(
        engine, run_dir.stage_dir(STAGE), tokenizer=tokenizer, unwrap=lambda module: module.model,
        config_updates={
            scoring.MEAN_KEY: stats.get("score_mean", 0.0),
            scoring.STD_KEY: stats.get("score_std", 1.0) or 1.0,
            scoring.POSITION_KEY: scoring.POSITION,
        },
        save=save,
    )  # fmt: skip
    result.mark_finished()
    monitor.plot("loss", title=f"reward model loss ({model_name})")
    metrics = final_metrics(result)
    common.record(run_dir, STAGE, config, inputs, metrics, status="finished")
    common.say(_summary_line(out, metrics))
    common.push_if_asked(config, out)
    return metrics


def _load_quietly(model_name: str, debug: bool):
    from ..models import load_reward_model

    with _quiet_loading(debug):  # the "score.weight MISSING" report is expected here
        return load_reward_model(model_name, dtype="fp32")


def _top_blocks(layers: int | None) -> str:
    return "" if layers is None else f", adapters in the top {layers} blocks"


@contextlib.contextmanager
def _quiet_loading(debug: bool):
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    if not debug:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def final_metrics(result: loop.FitResult) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "steps": result.steps,
        "train_loss": result.train.get("loss"),
        "train_accuracy": result.train.get("accuracy"),
    }
    for key in ("loss", "accuracy", "margin", "score_mean", "score_std", "pairs"):
        if key in result.eval:
            metrics[f"eval_{key}"] = result.eval[key]
    metrics.update(result.run_metrics())
    return metrics


def _summary_line(out, metrics: dict) -> str:
    parts = [f"rm: wrote {out}", count(metrics["steps"], "step")]
    if "eval_accuracy" in metrics:
        parts.append(
            f"held-out accuracy {metrics['eval_accuracy']:.3f} on {count(int(metrics['eval_pairs']), 'pair')}, "
            f"margin {metrics['eval_margin']:.3f}, score {metrics['eval_score_mean']:.3f} +- {metrics['eval_score_std']:.3f}"
        )
    return ", ".join(parts)
