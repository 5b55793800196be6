"""The training loop SFT and the reward model share: data order, steps, eval, checkpoints.

A stage describes itself as a :class:`Task` (its examples, how to batch them, what a batch
contributes to the loss) and :func:`fit` does the rest. Three choices matter for
reproducibility:

* **Data order is a pure function of (seed, epoch)**: a ``torch.Generator`` seeded from both
  permutes the training examples once per epoch, and optimizer step ``s`` always uses the
  same global batch. A run resumed at step k therefore replays exactly what an
  uninterrupted run would have done; the only "data position" to save is the step.
* **The loss is a sum divided by a global count.** Each batch reports *sums* (of token
  NLLs, of pair losses) and a count (response tokens, pairs); the loop all-reduces the count
  over the step's micro-batches and processes and divides by it. One process with batch 2B,
  two processes with B each, or B with two accumulation steps give the same gradient, which
  a per-micro-batch mean would not (micro-batches hold different numbers of tokens).
* **Every process runs the same number of forward passes**, as ZeRO-3 requires (it gathers
  parameters collectively): training batches are full by construction (the last partial
  batch of an epoch is dropped), and in evaluation a process with no examples left runs a
  stand-in batch whose sums it discards.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import checkpoints, checksums, engine as eng
from . import extending
from ..errors import UserError
from ..wording import count
from .monitor import Monitor


KEEP_CHECKPOINTS = 2  # the newest two: where one is damaged, --resume falls back to the other


@dataclass
class Task:
    """What one stage plugs into :func:`fit`.

    ``sums(engine, batch)`` returns named sums over the batch; ``"loss"`` must carry the
    gradient. ``count(batch)`` is the batch's share of the denominator (tokens, pairs).
    ``summarize(sums, count)`` turns global sums into the reported metrics.
    """

    name: str
    train: Sequence[Any]
    eval: Sequence[Any]
    collate: Callable[[Sequence[Any]], dict]
    count: Callable[[dict], int]
    sums: Callable[[Any, dict], dict]
    summarize: Callable[[dict[str, float], float], dict[str, float]]
    live: tuple[str, ...] = ("loss",)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    size: Callable[[Any], int] | None = None  # an example's length: evaluation batches similar lengths


# ---------------------------------------------------------------------------------------
# data order


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The permutation of ``n`` examples used in ``epoch`` (deterministic, platform-free)."""
    import torch

    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator).tolist()


def steps_per_epoch(n: int, batch_size: int) -> int:
    return n // batch_size


def total_steps(n: int, batch_size: int, epochs: int, max_steps: int | None) -> int:
    """Optimizer steps of the run: ``max_steps`` when given (cycling epochs, as often as a
    batch needs: :func:`global_batch`), else ``epochs`` full passes."""
    if max_steps:
        if n == 0:
            raise UserError("no training examples")
        return int(max_steps)
    per_epoch = steps_per_epoch(n, batch_size)
    if per_epoch == 0:
        raise UserError(
            f"only {count(n, 'training example')} for a batch of {batch_size}: give --max-steps (batches then cycle "
            "through the examples), lower --batch-size or add data"
        )
    return per_epoch * max(1, int(epochs))


def global_batch(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Indices of the examples of optimizer step ``step`` (0-based): consecutive slices of
    one permutation per epoch (an epoch's last examples that fill no whole batch sit out).
    With fewer examples than a batch, the batches are consecutive slices of the epochs'
    permutations joined end to end, so every example comes once per epoch and a batch holds
    some more than once (``--max-steps`` cycles through the data, as its help says)."""
    per_epoch = steps_per_epoch(n, batch_size)
    if per_epoch == 0:
        first, last = step * batch_size, (step + 1) * batch_size
        stream = [i for epoch in range(first // n, -(-last // n)) for i in epoch_order(n, seed, epoch)]
        offset = (first // n) * n
        return stream[first - offset : last - offset]
    epoch, position = divmod(step, per_epoch)
    order = epoch_order(n, seed, epoch)
    return order[position * batch_size : (position + 1) * batch_size]


def micro_batches(indices: Sequence[int], micro: int, processes: int, rank: int) -> list[list[int]]:
    """This process's micro-batches of one global batch: micro-batch i, process r gets slot i*W + r."""
    slots = [list(indices[start : start + micro]) for start in range(0, len(indices), micro)]
    return [slot for index, slot in enumerate(slots) if index % processes == rank]


# ---------------------------------------------------------------------------------------
# one step, one evaluation


def _to_device(batch: dict, device) -> dict:
    return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}


def _reduce(sums: dict, count: float) -> tuple[dict[str, float], float]:
    """All-reduce a dict of scalar sums and a count in one collective."""
    import torch

    keys = sorted(sums)
    values = torch.tensor([float(sums[k]) for k in keys] + [float(count)], dtype=torch.float64)
    values = eng.all_reduce_sum(values).tolist()
    return dict(zip(keys, values[:-1])), values[-1]


def train_step(engine, task: Task, batches: list[dict]) -> dict[str, float]:
    """One optimizer step over this process's micro-batches; returns the step's metrics."""
    import torch

    local_count = sum(task.count(b) for b in batches)
    _, global_count = _reduce({}, local_count)
    # DeepSpeed divides by the accumulation steps and averages over processes; undo both so
    # the gradient is that of (sum of losses) / (global count).
    scale = eng.world_size() * len(batches) / max(global_count, 1.0)
    totals: dict[str, float] = {}
    measured = None
    for index, batch in enumerate(batches):
        sums = task.sums(engine, _to_device(batch, engine.device))
        engine.backward(sums["loss"] * scale)
        if index == len(batches) - 1 and eng.zero_stage(engine) == 0:
            measured = eng.local_grad_norm(engine.module)
        engine.step()
        for key, value in sums.items():
            value = float(value.detach()) if torch.is_tensor(value) else float(value)
            totals[key] = totals.get(key, 0.0) + value
    totals, global_count = _reduce(totals, local_count)
    metrics = task.summarize(totals, global_count)
    norm = measured if measured is not None else eng.grad_norm(engine)
    if norm is not None:
        metrics["grad_norm"] = norm
    return metrics


def evaluate(engine, task: Task, micro: int) -> dict[str, float]:
    """Metrics over the held-out examples, sharded over processes."""
    import torch

    examples = task.eval
    if not examples:
        return {}
    if task.size is not None:  # sums do not depend on order; similar lengths waste less padding
        examples = sorted(examples, key=task.size, reverse=True)
    processes, me = eng.world_size(), eng.rank()
    rounds = math.ceil(len(examples) / (micro * processes))
    totals: dict[str, float] = {}
    local_count = 0.0
    was_training = engine.module.training
    engine.eval()
    with torch.no_grad():
        for round_index in range(rounds):
            start = (round_index * processes + me) * micro
            chunk = list(examples[start : start + micro])
            stand_in = not chunk
            batch = task.collate(chunk or list(examples[:1]))
            sums = task.sums(engine, _to_device(batch, engine.device))
            if stand_in:
                continue
            local_count += task.count(batch)
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
    if was_training:
        engine.train()
    keys = _reduce_keys(totals)
    totals, global_count = _reduce({k: totals.get(k, 0.0) for k in keys}, local_count)
    return task.summarize(totals, global_count)


def _reduce_keys(totals: dict) -> list[str]:
    """The same key list on every process (a process may have seen no eval batch)."""
    return sorted(eng.broadcast_object(sorted(totals)) or [])


# ---------------------------------------------------------------------------------------
# the loop


@dataclass
class FitResult:
    steps: int
    train: dict[str, float]
    eval: dict[str, float]
    seconds_per_step: float | None
    resumed_from: int | None
    extended_from: int | None = None
    checkpoint_dir: Path | None = None
    state: dict[str, Any] = field(default_factory=dict)  # the trainer state its checkpoints hold

    def run_metrics(self) -> dict[str, Any]:
        """The final metrics every stage reports about the run itself (when known)."""
        out: dict[str, Any] = {}
        if self.seconds_per_step is not None:
            out["seconds_per_step"] = round(self.seconds_per_step, 4)
        if self.resumed_from is not None:
            out["resumed_from_step"] = self.resumed_from
        if self.extended_from is not None:
            out["extended_from_step"] = self.extended_from
        return out

    def mark_finished(self) -> None:
        """Once the stage's export is complete: the finished run's state at its last step,
        which a longer ``--max-steps`` extends (train/extending.py)."""
        checkpoints.mark_finished(self.checkpoint_dir, self.steps, self.state)


def run_fingerprint(task: Task, config: Any, batch_size: int, steps: int) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it (data order, schedule)."""
    return {**task.fingerprint, "batch_size": batch_size, "seed": config.seed, "steps": steps}


@dataclass(frozen=True)
class ResumePlan:
    """Where a run starts: afresh (neither), at an unfinished run's ``checkpoint``, or by
    extending a finished run from its export (``extension``, train/extending.py). ``notes``:
    the options ``--resume`` applies or notices (checkpoints.check_fingerprint)."""

    checkpoint: Path | None = None
    extension: extending.Extension | None = None
    notes: tuple[str, ...] = ()


def plan_resume(config: Any, run_dir, stage: str, task: Task, steps: int) -> ResumePlan:
    """``--resume``'s checks, before any model loads: nothing to resume, changed options or a
    finished run not made longer are one-line errors."""
    if not getattr(config, "resume", False):
        return ResumePlan()
    checkpoint_dir = run_dir.stage_dir(stage) / "checkpoints"
    found, skipped = eng.broadcast_object(checkpoints.resumable(checkpoint_dir) if eng.is_main() else None)
    if found is None:
        if skipped:
            raise UserError(checkpoints.skipped_line(skipped, None) + f" (in {checkpoint_dir}); run without --resume to start again")
        raise checkpoints.nothing_to_resume(checkpoint_dir)
    if skipped and eng.is_main():  # out of the way of what is kept, pruned and resumed next (still there to look at)
        checksums.set_aside(checkpoint_dir, found.name, checkpoints.PREFIX)
    extension = extending.find(found, steps, [run_dir.stage_dir(stage)])
    expected = run_fingerprint(task, config, config.batch_size, steps)
    notes = ([checkpoints.skipped_line(skipped, found)] if skipped else []) + checkpoints.check_fingerprint(
        found, expected, config, lengthen=extension is not None
    )  # fmt: skip
    if extension is not None:
        return ResumePlan(extension=extension, notes=tuple(notes))
    checkpoints.check_unfinished(found)
    return ResumePlan(checkpoint=found, notes=tuple(notes))


def fit(
    task: Task,
    engine,
    *,
    config: Any,
    monitor: Monitor,
    batch_size: int,
    steps: int,
    checkpoint_dir: Path,
    plan: ResumePlan = ResumePlan(),
) -> FitResult:
    """Train ``engine`` on ``task`` for ``steps`` optimizer steps, with eval and checkpoints.

    ``plan`` (:func:`plan_resume`, whose options are checked) may continue an unfinished run
    (model, optimizer, scheduler and random states restored) at its checkpoint's step, or a
    finished one (its engine built on the export's weights) at the step where it ended.
    """
    micro = batch_size // (config.gradient_accumulation_steps * eng.world_size())
    expected = run_fingerprint(task, config, batch_size, steps)
    state = {"fingerprint": expected, "config": checkpoints.config_state(config), "stage": task.name}
    start = 0
    if plan.checkpoint is not None:
        start = int(checkpoints.load_checkpoint(engine, plan.checkpoint)["step"])
        monitor.print(f"resuming from {plan.checkpoint} (step {start} of {steps})")
    elif plan.extension is not None:
        start = plan.extension.finished
        rate = extending.continue_schedule(engine, start)
        extending.reseed(config.seed, start)
        monitor.print(extending.line(task.name, plan.extension, config, rate=rate, lr=config.lr))
    last_train: dict[str, float] = {}
    last_eval: dict[str, float] = {}
    durations: list[float] = []
    saved = start  # the newest complete checkpoint's step (0: none)
    engine.train()
    for step in range(start, steps):
        began = time.perf_counter()
        lr = eng.current_lr(engine)  # the rate this step uses (the scheduler moves it after)
        indices = global_batch(len(task.train), batch_size, config.seed, step)
        mine = micro_batches(indices, micro, eng.world_size(), eng.rank())
        batches = [task.collate([task.train[i] for i in slot]) for slot in mine]
        metrics = train_step(engine, task, batches)
        done = step + 1
        if not math.isfinite(metrics["loss"]):  # every process has the same reduced loss: all stop here
            raise diverged(task.name, done, metrics["loss"], saved)
        durations.append(time.perf_counter() - began)
        metrics.update(lr=lr, step_time=durations[-1])
        last_train = metrics
        monitor.log(done, metrics, "train")
        monitor.advance(done, {k: metrics[k] for k in task.live if k in metrics})
        final = done == steps
        if config.eval_every and done % config.eval_every == 0 and not final:
            last_eval = evaluate(engine, task, micro)
            if last_eval:
                monitor.log(done, last_eval, "eval")
        if config.save_every and done % config.save_every == 0 and not final:
            checkpoints.save_checkpoint(engine, checkpoint_dir, done, state, keep=KEEP_CHECKPOINTS)
            saved = done
    if task.eval:
        last_eval = evaluate(engine, task, micro)
        monitor.log(steps, last_eval, "eval")
    timed = durations[1:] or durations  # the first step includes one-off warm-up
    return FitResult(
        steps=steps,
        train=last_train,
        eval=last_eval,
        seconds_per_step=(sum(timed) / len(timed)) if timed else None,
        resumed_from=start if plan.checkpoint is not None else None,
        extended_from=start if plan.extension is not None else None,
        checkpoint_dir=checkpoint_dir,
        state=state,
    )


def diverged(stage: str, step: int, loss: float, saved: int) -> UserError:
    """The error of a step whose loss is not finite: its update has already moved the weights
    (nothing of the present state is saved); the newest checkpoint, if any, stands."""
    # a --resume takes the same options and would repeat the same steps: a lower rate is a new run. A
    # checkpoint written right after the update before this loss may hold the weights that diverged
    kept = ("no checkpoint was written" if not saved else
            f"the checkpoint of step {saved} was written after the update before this loss and may hold diverged weights"
            if saved == step - 1 else f"the checkpoint of step {saved} stands, but a --resume would repeat these steps")  # fmt: skip
    return UserError(f"{stage}: the loss of step {step} is {loss} (not finite), so training stopped: a learning rate too "
                     f"high, or weights that were not finite from the start; {kept}: start again with a lower --lr")  # fmt: skip


def fit_stage(task: Task, engine, *, config: Any, run_dir, stage: str, inputs: dict, steps: int, plan: ResumePlan) -> tuple[FitResult, Monitor]:
    """What ``sft`` and ``rm`` do around :func:`fit`: a fresh run removes the stage's old
    checkpoints and outputs, run.json marks the stage running, and the training runs with a
    progress monitor (closed even on a crash). Returns the result and the closed monitor (its
    loss plot is still to draw). ``plan``: :func:`plan_resume`'s, made before the model loaded."""
    from . import common

    checkpoint_dir = run_dir.stage_dir(stage) / "checkpoints"
    for note in plan.notes:
        common.say(note)
    if plan.checkpoint is None and plan.extension is None:  # data, model and options were all accepted by now
        if eng.is_main() and checkpoints.list_checkpoints(checkpoint_dir):
            common.say(f"fresh run: removing old checkpoints in {checkpoint_dir} (pass --resume to continue them)")
        checkpoints.clear_checkpoints(checkpoint_dir)
        common.clear_previous_outputs(run_dir, stage)
    common.record(run_dir, stage, config, inputs, None, status="running")
    start = checkpoints.read_state(plan.checkpoint)["step"] if plan.checkpoint else plan.extension.finished if plan.extension else 0
    monitor = Monitor(run_dir, stage, total_steps=steps, start_step=int(start), enabled=eng.is_main(), config=config)
    try:
        result = fit(
            task, engine, config=config, monitor=monitor, batch_size=config.batch_size, steps=steps,
            checkpoint_dir=checkpoint_dir, plan=plan,
        )  # fmt: skip
    finally:
        monitor.close()
    return result, monitor
