"""``marlhf dpo``: the paper's DPO baseline (Appendix C.3), on the pairs of the PPO share.

The policy and the reference both start from the run's SFT model (``--policy``,
``--reference``), as in the paper, which trains DPO "with the same data split as we used when
training PPO": the ``ppo`` share's preference pairs, evaluated on the held-out ``eval`` split.
The loss is :mod:`.dpo_loss`'s (``--loss-type sigmoid|ipo``, ``--label-smoothing``,
``--length-penalty``) over summed log-probs of the *response* tokens (the end token included,
as SFT trains it; prompt and padding masked), read at ``logits`` of temperature 1.

The reference never changes, so its log-probs are computed once per pair before the first
step and kept beside the pair, instead of a reference forward at every step. Where the
reference is the policy's own start (the default) they come from the policy's engine before
any update, so no second copy of the weights is ever held; with LoRA from the same engine
with its adapter off, whatever the step; otherwise (``--reference`` another model, or a
finished run extended from its export) from the reference loaded for that pass alone.

Metrics carry TRL's names (``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracies``, ``logps/chosen``, ``logps/rejected``), plus the responses' lengths
(``lengths/chosen``, ``lengths/rejected``), on the training steps and the held-out pairs.
Pairs whose responses are identical after truncation are left out and counted, as ``rm``
does. Outputs: ``dpo/`` (a causal LM ``bon``, ``judge`` and ``passk`` take as ``--policy dpo``),
``metrics/dpo.jsonl``, ``plots/dpo-*.png`` and the ``dpo`` entry of run.json.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from .. import checkpoints, engine as eng, lora
from ..artifacts import RunDir
from ..chat import ChatFormat
from ..encode import Cuts, attention_mask, pad_right
from ..errors import UserError
from ..generation.draw import position_ids_from_mask
from ..wording import count
from . import common, extending, loop
from .dpo_loss import PreferenceLoss, implicit_rewards, pair_losses
from .forward import disable_dropout, logprobs_from_logits
from .rm import encode_pairs, pair_count, plan_pairs
from .sources import dpo_sources

STAGE = "dpo"
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected",
           "lengths/chosen", "lengths/rejected")  # fmt: skip


# ---------------------------------------------------------------------------------------
# log-probs of the responses


def response_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Summed log-probs of each row's response tokens (``response_mask`` 1), [N] float32.

    Column t's logits predict token t + 1; positions follow the attention mask, so a row
    scores the same whichever side it is padded on."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
                use_cache=False)  # fmt: skip
    logp, _ = logprobs_from_logits(out.logits[:, :-1], input_ids[:, 1:])
    return (logp * response_mask[:, 1:].to(logp.dtype)).sum(dim=1)


class ResponseLogps(torch.nn.Module):
    """The policy as DeepSpeed trains it: forward = :func:`response_logps` (ZeRO-3 gathers
    parameters on that path). ``.model`` is the Hugging Face model that gets saved."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask, response_mask):
        return response_logps(self.model, input_ids, attention_mask, response_mask)

    def gradient_checkpointing_enable(self, **kwargs):
        self.model.gradient_checkpointing_enable(**kwargs)


def collate(pairs: Sequence[dict], pad_id: int) -> dict:
    """Chosen rows first, then rejected, right-padded; ``response_mask`` marks each row's
    response (after its prompt), ``lengths`` its tokens, ``reference`` the kept log-probs."""
    rows = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    starts = [p["prompt_length"] for p in pairs] * 2
    input_ids = pad_right(rows, pad_id)
    response = torch.zeros_like(input_ids)
    for index, (row, start) in enumerate(zip(rows, starts)):
        response[index, start : len(row)] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask(rows), "response_mask": response,
             "lengths": torch.tensor([len(row) - start for row, start in zip(rows, starts)], dtype=torch.float32),
             "pairs": len(pairs)}  # fmt: skip
    if all("reference" in p for p in pairs):
        batch["reference"] = torch.tensor([p["reference"][0] for p in pairs] + [p["reference"][1] for p in pairs], dtype=torch.float64)
    return batch


# ---------------------------------------------------------------------------------------
# loss and metrics


def pair_sums(engine, batch: dict, loss: PreferenceLoss) -> dict:
    """The batch's summed loss and the sums of TRL's metrics."""
    n = int(batch["pairs"])
    logps = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], response_mask=batch["response_mask"])
    reference, lengths = batch["reference"].to(logps.device), batch["lengths"].to(logps.device)
    losses = pair_losses(logps[:n], logps[n:], reference[:n], reference[n:], lengths[:n], lengths[n:], loss)
    chosen, rejected = (implicit_rewards(logps[part], reference[part], loss.beta).detach() for part in (slice(0, n), slice(n, None)))
    detached = logps.detach().double()
    return {
        "loss": losses.sum(), "rewards/chosen": chosen.sum(), "rewards/rejected": rejected.sum(),
        "rewards/accuracies": (chosen > rejected).sum(), "logps/chosen": detached[:n].sum(), "logps/rejected": detached[n:].sum(),
        "lengths/chosen": lengths[:n].sum(), "lengths/rejected": lengths[n:].sum(),
    }  # fmt: skip


def summarize(sums: dict[str, float], pairs: float) -> dict[str, float]:
    n = max(pairs, 1.0)
    out = {"loss": sums.get("loss", math.nan) / n, **{key: sums.get(key, 0.0) / n for key in METRICS}}
    out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    return out | {"pairs": pairs}


# ---------------------------------------------------------------------------------------
# the reference's log-probs, once per pair


@torch.no_grad()
def reference_logps(forward: Callable[[dict], torch.Tensor], pairs: Sequence[dict], collate_fn, micro: int) -> torch.Tensor:
    """[len(pairs), 2] (chosen, rejected) summed log-probs of the reference, ``forward``
    (a collated batch -> [2B]) run over this process's shard of the pairs, every process the
    same number of forwards (ZeRO-3 gathers collectively), the shards summed across them."""
    processes, me = eng.world_size(), eng.rank()
    out = torch.zeros(len(pairs), 2, dtype=torch.float64)
    for round_index in range(math.ceil(len(pairs) / (micro * processes))):
        start = (round_index * processes + me) * micro
        chunk = list(range(start, min(start + micro, len(pairs))))
        values = forward(collate_fn([pairs[i] for i in chunk] or [pairs[0]])).double().cpu()
        if chunk:  # (a process with no pairs left ran a stand-in whose result it drops)
            out[chunk, 0], out[chunk, 1] = values[: len(chunk)], values[len(chunk) :]
    return eng.all_reduce_sum(out)


def _engine_forward(engine, device) -> Callable[[dict], torch.Tensor]:
    def forward(batch: dict) -> torch.Tensor:
        return engine(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                      response_mask=batch["response_mask"].to(device))  # fmt: skip

    return forward


def used_pairs(task: loop.Task, config: Any, steps: int) -> list[dict]:
    """The pairs the run will read: every training pair some step of the run's ``steps`` takes
    (data order is a pure function of seed and step: loop.global_batch; a run shorter than an
    epoch reads only part of the data) and every held-out pair."""
    used = sorted({i for step in range(steps) for i in loop.global_batch(len(task.train), config.batch_size, config.seed, step)})
    return [task.train[i] for i in used] + list(task.eval)


def attach_reference(pairs: Sequence[dict], engine, config: Any, reference: str, own_start: bool, pad_id: int) -> float:
    """Each of ``pairs`` gets its reference log-probs ("reference": (chosen, rejected));
    returns the seconds it took. ``own_start``: the engine still holds the reference's
    weights (no update yet, no extension), so it computes them itself; with LoRA the engine
    with its adapter off does, whatever it holds; otherwise ``reference`` is loaded for it."""
    started = time.perf_counter()
    pairs = list(pairs)
    micro = config.batch_size // (config.gradient_accumulation_steps * eng.world_size())
    engine.eval()
    if lora.enabled(config):
        with lora.adapter_off(engine):
            values = reference_logps(_engine_forward(engine, engine.device), pairs, lambda p: collate(p, pad_id), micro)
    elif own_start:
        values = reference_logps(_engine_forward(engine, engine.device), pairs, lambda p: collate(p, pad_id), micro)
    else:
        from ..models import load_causal_lm

        model = load_causal_lm(reference, dtype=config.dtype).to(engine.device).eval()
        disable_dropout(model)
        forward = ResponseLogps(model)
        values = reference_logps(_engine_forward(forward, engine.device), pairs, lambda p: collate(p, pad_id), micro)
        del model, forward
    engine.train()
    for pair, (chosen, rejected) in zip(pairs, values.tolist()):
        pair["reference"] = (chosen, rejected)
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------
# the stage


def build_task(config: Any, tokenizer, train_records, eval_records, chat: ChatFormat, cuts: Cuts | None = None) -> tuple[loop.Task, int]:
    """The pairs task (its pairs still without reference log-probs) and how many pairs were
    identical after truncation."""
    train, dropped = encode_pairs(tokenizer, train_records, config.max_prompt_length, config.max_response_length, chat, cuts)
    held_out, dropped_eval = encode_pairs(tokenizer, eval_records, config.max_prompt_length, config.max_response_length, chat)
    loss = PreferenceLoss(config.beta, config.loss_type, config.label_smoothing, config.length_penalty)
    pad_id = tokenizer.pad_token_id
    task = loop.Task(
        name=STAGE, train=train, eval=held_out, collate=lambda pairs: collate(pairs, pad_id), count=pair_count,
        sums=lambda engine, batch: pair_sums(engine, batch, loss), summarize=summarize,
        live=("loss", "rewards/accuracies", "rewards/margins"), size=lambda pair: max(len(pair["chosen"]), len(pair["rejected"])),
        fingerprint={"train_examples": len(train)},
    )  # fmt: skip
    return task, dropped + dropped_eval


def check_sources(config: Any, policy: str, reference: str, tokenizer) -> None:
    """A LoRA reference is the policy's base (its adapter off); a separate reference must
    read the policy's token ids."""
    if reference == policy:
        return
    if lora.enabled(config):
        raise UserError(f"--lora-rank: the reference is the policy with its adapter off; --reference '{reference}' "
                        f"is another model than --policy '{policy}' (drop --reference, or train without LoRA)")  # fmt: skip
    from ..models import load_tokenizer

    theirs = load_tokenizer(reference)
    if theirs.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"--reference '{reference}' has another tokenizer than --policy '{policy}': their log-probs of "
                        "the same responses cannot be compared")  # fmt: skip


def run(config: Any) -> dict[str, Any]:
    """Train the policy with DPO and write ``dpo/`` into the run directory; returns final metrics."""
    with RunDir(config.run_dir).writing(STAGE):  # one writer of the stage's outputs at a time
        return _run(config)


def _run(config: Any) -> dict[str, Any]:
    from ..models import check_context, check_heads, load_causal_lm, load_tokenizer

    run_dir = RunDir(config.run_dir)
    policy, reference = dpo_sources(config, run_dir)
    config.policy, config.reference = policy, reference  # what a --resume is compared with
    head_notes = check_heads(policy=policy, allow=config.allow_new_head)
    common.start(config)
    for note in head_notes:
        common.say(note)
    check_context(policy, config.max_prompt_length, config.max_response_length,
                  prompt_flag="--max-prompt-length", response_flag="--max-response-length")  # fmt: skip
    train = common.load_split(config, "ppo", config.max_records).require(STAGE, ("preference",))
    held_out = common.load_split(config, "eval", config.eval_records, report=False)
    tokenizer = load_tokenizer(policy, padding_side="right")
    check_sources(config, policy, reference, tokenizer)
    pairs = plan_pairs(STAGE, config, run_dir, policy, tokenizer, train, held_out, build_task)
    task, steps, plan = pairs.task, pairs.steps, pairs.plan
    extension = plan.extension  # a finished dpo/ made longer: its weights are the start
    model = load_causal_lm(extension.exports[0] if extension and not lora.enabled(config) else policy, dtype="fp32")
    disable_dropout(model)  # the first step's policy log-probs are the reference's exactly
    save = None
    if lora.enabled(config):
        model = lora.add_adapters(model, config, task="causal", base=policy)
        if extension:
            extending.start_adapters(model, extension.exports[0])
        common.say(lora.trainable_summary(model))
        save = lora.merged_saver(lambda: load_causal_lm(policy, dtype="fp32"), stage="dpo")
    engine = eng.build_engine(ResponseLogps(model), config, lr=config.lr, batch_size=config.batch_size, total_steps=steps)
    own_start = reference == policy and extension is None  # a checkpoint is loaded only in fit(), after this
    needed = used_pairs(task, config, steps)
    seconds = attach_reference(needed, engine, config, reference, own_start, tokenizer.pad_token_id)
    common.say(f"reference log-probs of the {count(len(needed), 'pair')} the run reads computed once ({seconds:.1f} s), "
               "not at every step")  # fmt: skip
    inputs = common.inputs_entry(
        config, policy, train, held_out, reference=reference, train_pairs=len(task.train), identical_pairs=pairs.identical,
        chat_template=pairs.chat.example(train.records), cut=pairs.cuts.as_dict(), reference_seconds=round(seconds, 2),
        reference_pairs=len(needed),
    )  # fmt: skip
    result, monitor = loop.fit_stage(task, engine, config=config, run_dir=run_dir, stage=STAGE, inputs=inputs, steps=steps, plan=plan)
    out = checkpoints.export_pretrained(engine, run_dir.stage_dir(STAGE), tokenizer=tokenizer, unwrap=lambda module: module.model,
                                        save=save)  # fmt: skip
    result.mark_finished()
    for metric in ("loss", "rewards/margins", "rewards/accuracies"):
        monitor.plot(metric, title=f"DPO {metric} ({policy})")
    metrics = final_metrics(result)
    common.record(run_dir, STAGE, config, inputs, metrics, status="finished")
    if eng.is_main():
        print_final_table(result, out)
    common.push_if_asked(config, out)
    return metrics


def final_metrics(result: loop.FitResult) -> dict[str, Any]:
    metrics: dict[str, Any] = {"steps": result.steps, "train_loss": result.train.get("loss")}
    metrics |= {f"train_{key}": result.train[key] for key in (*METRICS, "rewards/margins") if key in result.train}
    metrics |= {f"eval_{key}": value for key, value in result.eval.items()}
    return metrics | result.run_metrics()


def print_final_table(result: loop.FitResult, out) -> None:
    """The last training step's figures beside the held-out pairs', TRL's names (stdout)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"dpo: wrote {out} after {count(result.steps, 'step')}", title_justify="left")
    table.add_column("metric")
    table.add_column("last step", justify="right")
    table.add_column("held-out pairs", justify="right")
    for key in ("loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected", "logps/chosen",
                "logps/rejected", "lengths/chosen", "lengths/rejected"):  # fmt: skip
        cells = [f"{part[key]:.4g}" if key in part else "-" for part in (result.train, result.eval)]
        table.add_row(key, *cells)
    Console(highlight=False).print(table)
