"""``marlhf sft``: supervised fine-tuning of a causal LM on prompt + chosen response.

The loss is the mean next-token NLL over *response* tokens only (prompt and padding labels
are -100): the policy must learn to answer, not to write Reddit posts or user turns. Each
response ends with EOS, so the model learns to stop, which PPO's rollouts rely on; under a
chat template (``--chat-template``, :mod:`marlhf_cli.chat`) with the template's end-of-turn
token instead, and a TRL ``messages`` row trains every assistant turn of the conversation
(each with its end-of-turn token), as TRL's ``assistant_only_loss`` does.

A file in TRL's plain language-modelling format (``{"text": ...}`` rows) has no prompt: the
loss then covers every token of the text (and the EOS after it), up to ``max_prompt_length +
max_response_length`` tokens, as TRL's SFTTrainer does with such data.

``--packing`` concatenates examples into blocks of ``max_prompt_length +
max_response_length`` tokens (fewer padding tokens, faster on long-tail data). Attention
then crosses example boundaries inside a block, as in the usual "constant length" packing;
the labels still cover responses only.

Held-out loss and perplexity are measured every ``eval_every`` steps on the dataset's
``eval`` split. Outputs: ``sft/`` (a ``save_pretrained`` folder with the tokenizer),
``metrics/sft.jsonl``, ``tb/sft``, ``plots/sft-loss.png`` and the ``sft`` entry of run.json.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .. import checkpoints, engine as eng, lora
from ..artifacts import RunDir
from ..errors import UserError
from ..wording import count
from . import common, extending, loop
from ..chat import ChatFormat, Rendered
from ..encode import IGNORE, Cuts, attention_mask, encode_prompt_labels, encode_response, pad_right, special_prefix

STAGE = "sft"


# ---------------------------------------------------------------------------------------
# examples


def encode_example(tokenizer, prompt: str, response: str, max_prompt: int, max_response: int) -> dict:
    """``input_ids`` = prompt + response (+ EOS); ``labels`` = -100 over the prompt, ids over the response."""
    return encode_rendered(tokenizer, Rendered(((prompt, False),), response, tokenizer.eos_token_id), max_prompt, max_response)


def encode_rendered(tokenizer, rendered: Rendered, max_prompt: int, max_response: int, cuts: Cuts | None = None) -> dict:
    """A record as :mod:`marlhf_cli.chat` renders it: labels on the response and its end token
    (EOS, or the template's end of turn), and on earlier assistant turns it marks (their
    end-of-turn tokens included); -100 everywhere else."""
    prompt_ids, prompt_labels = encode_prompt_labels(tokenizer, rendered.pieces, max_prompt, cuts)
    response_ids = encode_response(tokenizer, rendered.response, max_response, rendered.end_id, cuts)
    return {"input_ids": prompt_ids + response_ids, "labels": prompt_labels + response_ids}


def encode_text(tokenizer, text: str, max_length: int, cuts: Cuts | None = None) -> dict:
    """A text row: ``input_ids`` = special prefix + text (+ EOS), labels on every text token.

    A text longer than ``max_length`` keeps its beginning and gets no EOS (as a cut response).
    """
    prefix = list(special_prefix(tokenizer))
    ids = encode_response(tokenizer, text, max(1, max_length - len(prefix)), cuts=cuts)
    return {"input_ids": prefix + ids, "labels": [IGNORE] * len(prefix) + ids}


def pack(examples: Sequence[dict], block_size: int) -> list[dict]:
    """Concatenate examples and cut the stream into blocks of ``block_size`` tokens (last one shorter)."""
    ids: list[int] = []
    labels: list[int] = []
    for example in examples:
        ids.extend(example["input_ids"])
        labels.extend(example["labels"])
    return [
        {"input_ids": ids[start : start + block_size], "labels": labels[start : start + block_size]}
        for start in range(0, len(ids), block_size)
    ]


def collate(examples: Sequence[dict], pad_id: int) -> dict:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on padding)."""
    ids = [e["input_ids"] for e in examples]
    return {
        "input_ids": pad_right(ids, pad_id),
        "attention_mask": attention_mask(ids),
        "labels": pad_right([e["labels"] for e in examples], IGNORE),
    }


# ---------------------------------------------------------------------------------------
# loss


def target_count(batch: dict) -> int:
    """Tokens the loss is averaged over: response tokens that have a predecessor."""
    return int((batch["labels"][:, 1:] != IGNORE).sum())


def nll_sum(logits, labels):
    """Summed next-token NLL where ``labels`` (shifted by one) are not -100."""
    import torch.nn.functional as F

    targets = labels[:, 1:]
    keep = targets != IGNORE
    predicted = logits[:, :-1][keep].float()
    return F.cross_entropy(predicted, targets[keep], reduction="sum")


def batch_sums(engine, batch: dict) -> dict:
    logits = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    return {"loss": nll_sum(logits, batch["labels"])}


def summarize(sums: dict[str, float], count: float) -> dict[str, float]:
    loss = sums.get("loss", float("nan")) / max(count, 1.0)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}


# ---------------------------------------------------------------------------------------
# the stage


def build_task(config: Any, tokenizer, train_records: list[dict], eval_records: list[dict], chat: ChatFormat | None = None,
               cuts: Cuts | None = None) -> loop.Task:
    """The SFT task; ``cuts`` counts what the length limits cut of the training records."""
    chat = chat or ChatFormat(tokenizer, config.chat_template)

    def encode(records, cuts=None):
        return [encode_record(tokenizer, r, config.max_prompt_length, config.max_response_length, chat, cuts) for r in records]

    train = encode(train_records, cuts)
    held_out = encode(eval_records)
    if config.packing:
        block = config.max_prompt_length + config.max_response_length
        train, held_out = pack(train, block), pack(held_out, block)
    pad_id = tokenizer.pad_token_id
    return loop.Task(
        name=STAGE,
        train=train,
        eval=held_out,
        collate=lambda examples: collate(examples, pad_id),
        count=target_count,
        sums=batch_sums,
        summarize=summarize,
        live=("loss", "lr"),
        size=lambda example: len(example["input_ids"]),
        fingerprint={"train_examples": len(train), "model": str(config.model), "packing": bool(config.packing)},
    )


def encode_record(tokenizer, record: dict, max_prompt: int, max_response: int, chat: ChatFormat | None = None,
                  cuts: Cuts | None = None) -> dict:
    """A demonstration (loss on its response, as ``chat`` renders it; default: the
    tokenizer's template, ``auto``) or a text record (loss on all of it; a cut text counts
    as a cut response)."""
    if "prompt" not in record:
        return encode_text(tokenizer, record["text"], max_prompt + max_response, cuts)
    chat = chat or ChatFormat(tokenizer)
    return encode_rendered(tokenizer, chat.render(record, _response_key(record)), max_prompt, max_response, cuts)


# what sft trains on (data.records.record_kind); prompts alone have nothing to imitate
KINDS = ("preference", "demonstration", "text", "problem")


def _response_key(record: dict) -> str:
    """Where the demonstration is: ``chosen`` of a preference record, or a record's ``completion``."""
    for key in ("chosen", "completion", "response"):
        value = record.get(key)
        if isinstance(value, str) and value:
            return key
    raise UserError(f"a record has no response to imitate (expected 'chosen' or 'completion'): keys {sorted(record)}")


def run(config: Any) -> dict[str, Any]:
    """Fine-tune ``config.model`` and write ``sft/`` into the run directory; returns final metrics."""
    with RunDir(config.run_dir).writing(STAGE):  # one writer of the stage's outputs at a time
        return _run(config)


def _run(config: Any) -> dict[str, Any]:
    from ..models import check_context, load_causal_lm, load_tokenizer

    common.start(config)
    run_dir = RunDir(config.run_dir)
    check_context(config.model, config.max_prompt_length, config.max_response_length,
                  prompt_flag="--max-prompt-length", response_flag="--max-response-length")  # fmt: skip
    train = common.load_split(config, "sft", config.max_records).require(STAGE, KINDS)
    held_out = common.load_split(config, "eval", config.eval_records, report=False)
    tokenizer = load_tokenizer(config.model, padding_side="right")
    chat = ChatFormat(tokenizer, config.chat_template)
    common.say(common.describe_records(STAGE, train, f"{len(held_out.records)} held out for evaluation", bool(config.split_shares)))
    if note := chat.note(train.records):  # plain-text data needs no word
        common.say(note)
    cuts = Cuts()
    task = build_task(config, tokenizer, train.records, held_out.records, chat, cuts)
    if cut := cuts.describe(config.max_prompt_length, config.max_response_length):
        common.say(f"{STAGE}: {cut}")
    steps = loop.total_steps(len(task.train), config.batch_size, config.epochs, config.max_steps)
    if lora.enabled(config):
        task.fingerprint.update(lora.base_identity(config, model=str(config.model)))
    plan = loop.plan_resume(config, run_dir, STAGE, task, steps)
    extension = plan.extension  # a finished sft/ made longer: its weights are the start
    model = load_causal_lm(extension.exports[0] if extension and not lora.enabled(config) else config.model, dtype="fp32")
    save = None
    if lora.enabled(config):  # adapters on the base; the export merges them (sft/ is a plain model)
        model = lora.add_adapters(model, config, task="causal", base=str(config.model))
        if extension:
            extending.start_adapters(model, extension.exports[0])
        common.say(lora.trainable_summary(model))
        save = lora.merged_saver(lambda: load_causal_lm(config.model, dtype="fp32"), stage="sft")
    engine = eng.build_engine(model, config, lr=config.lr, batch_size=config.batch_size, total_steps=steps)
    inputs = common.inputs_entry(
        config, str(config.model), train, held_out, train_examples=len(task.train), chat_template=chat.example(train.records),
        cut=cuts.as_dict(),
    )  # fmt: skip
    result, monitor = loop.fit_stage(task, engine, config=config, run_dir=run_dir, stage=STAGE, inputs=inputs, steps=steps, plan=plan)
    out = checkpoints.export_pretrained(engine, run_dir.stage_dir(STAGE), tokenizer=tokenizer, save=save)
    result.mark_finished()
    monitor.plot("loss", title=f"SFT loss ({config.model})")
    metrics = final_metrics(result)
    common.record(run_dir, STAGE, config, inputs, metrics, status="finished")
    common.say(_summary_line(out, metrics))
    common.push_if_asked(config, out)
    return metrics


def final_metrics(result: loop.FitResult) -> dict[str, Any]:
    metrics: dict[str, Any] = {"steps": result.steps, "train_loss": result.train.get("loss")}
    if result.eval:
        metrics.update(eval_loss=result.eval["loss"], eval_ppl=result.eval["ppl"])
    metrics.update(result.run_metrics())
    return metrics


def _summary_line(out, metrics: dict) -> str:
    parts = [f"sft: wrote {out}", count(metrics["steps"], "step")]
    if metrics.get("train_loss") is not None:
        parts.append(f"train loss {metrics['train_loss']:.4f}")
    if "eval_loss" in metrics:
        parts.append(f"eval loss {metrics['eval_loss']:.4f} (ppl {metrics['eval_ppl']:.2f})")
    return ", ".join(parts)
