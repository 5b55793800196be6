"""``--generation compiled``: the eager sampler's draws, with each token's step recorded once
and replayed.

Why: the eager sampler (:func:`.eager.sample`) runs the model's forward from Python for
every token, about a thousand small kernel launches each. On an H200 at SmolLM2-135M's shape
that took ~35 ms per token while the GPU's own work was microseconds (the memory floor of a
135M bf16 decode step is ~0.06 ms), so generation was 80% of a PPO step. Here the per-token
step (the forward at fixed shapes, temperature, top-k/top-p, the inverse-CDF draw from given
uniforms, EOS and budgets as a done mask) reads and writes only tensors that never move, so
on CUDA it is recorded once as a CUDA graph and replayed per token: one launch instead of a
thousand.

How one call goes (:meth:`CompiledSampler.sample`):

1. **Bucket.** Rows are rounded up to a power of two and the cache length (prompt plus new
   tokens) up to the run's longest prompt plus response (``SamplingParams.cache_length``;
   :func:`bucket_length`), so that every call of a run (rollouts, evaluation, ``mc``'s
   continuations, ``bon``'s batches) lands in one of a few buckets, each allocated and
   recorded once: its :class:`.static_cache.StaticKVCache`, its input, sampling and
   output buffers, and its recorded step. The rows beyond the call's are padding, finished
   from the start.
2. **Prefill** in one ordinary forward over the prompts (any width: nothing is recorded), each
   distinct prompt once; the cache rows are then copied to the prompt's ``repeats`` samples.
   A call given a ``start`` (:mod:`.cache_rows`: the prompts' keys and values from an earlier
   call, all columns but the last) copies them in instead and feeds only the last column.
3. **Decode**: the recorded step, replayed once per token. The host reads "every row done"
   every :data:`CHECK_EVERY` tokens, not every token (each read waits for the GPU); the rows'
   own finishing steps, kept on the device, decide where the output ends, so it is the
   eager sampler's length exactly.

**CUDA graphs directly, not ``torch.compile(mode="reduce-overhead")``:** no compile time
(transformers reports ~25 s per new shape, and a run has a few shapes); no silent fallback (a
capture records the whole step or raises, while reduce-overhead skips graphs with only a log
line when it meets an input it cannot keep still); the replayed kernels are the eager ones,
so the compiled and eager samplers agree to float rounding and a CPU runs every line of this
module but the capture; and nothing beyond torch is needed (no Triton, no C++ compiler). The
cost: kernels are replayed, not fused, ~1-3 us each.

**Live weights.** A recording reads the parameters at their addresses, so in-place updates
are seen by the next replay: optimizer steps, DeepSpeed's bf16 parameters (views into its
flat buffers under ZeRO 0-2), ZeRO-3's sampling copy (:mod:`.generation`, refreshed with
``copy_``). A parameter *replaced* by another tensor (``param.data = ...``, ``model.to(dtype)``)
would leave the recording reading freed memory: before every call the parameters' and
buffers' addresses are compared with those the buckets were made for, and on any change
every bucket is made and recorded afresh.

**LoRA: the adapter path is recorded,** peft's two small matmuls per adapted layer inside
the graph, instead of merging the adapters into a generation copy before each rollout: no
second copy of the model (LoRA is chosen to save that memory), and the adapters, updated in
place by the optimizer, are read live like any weight.

**Memory given back to training.** A bucket's cache and recording stay allocated between
calls, so a run records each shape once; but through the update they would sit beside the
training's own memory (SmolLM2-1.7B at PPO's default 256 rows x 1,024 columns in bf16: 48
GiB of cache on an 80 GB card). Freeing them before every update and recording again at the
next rollout costs two warm-up steps and a capture per shape and step, which at 135M is of
the order of the whole decode. So the choice is measured, on CUDA: before the first update
the buckets are freed (nothing is known of the update's needs); after each update the
device's peak allocation is read, and the buckets are kept through the next update only
while that peak plus what they hold stays under :data:`HEADROOM` of the device's memory
(:func:`before_training`, :func:`after_training`, :func:`keeps`). A CPU keeps them (nothing is
recorded there; free memory is checked whenever a bucket is made).

**Randomness** is the eager sampler's: one uniform per row and token, inverted through the
cumulative distribution (:func:`.sampling.draw`), taken from the uniforms given (``mc``'s
per-row numbers) or drawn from the global generator before the first token. On a CPU those
are the very numbers the eager loop draws token by token, and the generator is left where
the eager loop leaves it, so the two samplers draw the same tokens; on CUDA the one draw of
[tokens x rows] numbers is not the sequence of per-token draws.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import torch

from .. import console
from .cache_rows import CacheRows
from .draw import cache_argument, unwrap
from .static_cache import Bucket, Shape, StaticCacheMismatch, cache_bytes, host_read, unsupported

MODES = ("auto", "eager", "compiled")
CHECK_EVERY = 8  # tokens between the host's "every row done?" reads: each waits for the GPU
LENGTH_MULTIPLE = 64  # cache lengths are rounded up to this (transformers' advice for static caches)
MAX_BUCKETS = 4  # shapes kept per model; the least recently used one goes first
HEADROOM = 0.9  # buckets stay through an update while the measured peak plus theirs is under this share of the device


def resolve(value: str) -> tuple[str, str | None]:
    """(eager|compiled, why): ``value`` itself unless it is ``auto``, which means compiled on
    CUDA (where the eager loop leaves the GPU idle) and eager on a CPU (where the model's own
    work dominates each token and a static cache gains little)."""
    if value != "auto":
        return value, None
    if torch.cuda.is_available():
        return "compiled", f"CUDA ({torch.cuda.get_device_name()}): one recorded step per token"
    return "eager", "a CPU, where the model's own work, not launching it, is the cost of a token"


def records(device: torch.device) -> bool:
    """Whether the step is recorded as a CUDA graph on ``device`` (on a CPU it is run as it is)."""
    return device.type == "cuda"


def next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def bucket_length(prompt_width: int, new_tokens: int, cache_length: int | None) -> int:
    """Cache columns for a call: prompt + new tokens rounded up to a multiple of the run's
    ``cache_length`` (itself rounded up to 64), so that a run has one length, or two where
    left padding makes a call longer (mc: the longest prefix and the longest budget of a
    batch may come from different rows); without one, to a multiple of 64."""
    unit = round_up(cache_length or LENGTH_MULTIPLE, LENGTH_MULTIPLE)
    return round_up(prompt_width + new_tokens, unit)


def bucket_bytes(config, rows: int, length: int, dtype: torch.dtype, vocab: int) -> int:
    """Memory a bucket takes, estimated: its KV cache, its [rows x length] buffers (uniforms,
    tokens, log-probs, mask) and the step's [rows x vocabulary] float temporaries (logits,
    probabilities, the cumulative sum in float64, the sort of top-p)."""
    return cache_bytes(config, rows, length, dtype) + rows * length * 24 + rows * vocab * 48


def free_bytes(device: torch.device) -> int:
    """Memory a new bucket may take on ``device``: free GPU memory plus what torch's caching
    allocator holds unused; on a CPU, the kernel's MemAvailable."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62  # unknown: assume it fits


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class CompiledSampler:
    """One model's buckets, the addresses they were made for, and what was recorded."""

    def __init__(self):
        self.buckets: OrderedDict[Shape, Bucket] = OrderedDict()
        self.addresses: tuple[int, ...] | None = None
        self.captures = 0  # buckets made: each one a recorded CUDA graph on a GPU
        self.steps = 0  # tokens drawn through the static cache (the recorded step or, on a CPU, the step itself)
        self.replays = 0  # of those, tokens drawn by replaying a recording
        self.said: set[str] = set()
        self.pool = None
        self.unfit: str | None = None  # why the model cannot use a static cache, once found
        self.probed = False  # its step was run on the meta device (static_cache.host_read)
        self.training_peak: int | None = None  # the device's peak allocation after the last update
        self.held_in_training = False  # the buckets were kept through that update (the peak counts them)

    def release(self) -> None:
        """Drop every bucket (caches, buffers, recordings) and the graphs' memory pool."""
        self.buckets.clear()
        self.pool = None

    def _say_once(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            console.say(message)

    def bucket(self, net, shape: Shape) -> Bucket | None:
        """The smallest bucket that covers ``shape``, made (and recorded) if there is none;
        None when it cannot be made (the caller samples eagerly; the reason is said once).
        Serving smaller calls (the last batch of an evaluation or of mc's continuations) from
        a bigger bucket keeps the number of recordings flat after a run's first steps."""
        addresses = tuple(t.data_ptr() for t in itertools.chain(net.parameters(), net.buffers()))
        if addresses != self.addresses:  # a parameter was replaced, not updated: record afresh
            self.buckets.clear()
            self.addresses = addresses
        covering = [have for have in self.buckets if have.covers(shape)]
        if covering:
            best = min(covering, key=lambda have: have.rows * have.length)
            self.buckets.move_to_end(best)
            return self.buckets[best]
        reason = unsupported(net.config, shape.length)
        if reason is None and records(shape.device) and not self.probed:  # once per model, before any recording
            self.probed = True
            reason = self.unfit = host_read(net, shape)
        if reason is not None:
            self._say_once(f"generation: eager, not compiled: {reason}")
            return None
        vocab = net.get_output_embeddings().weight.shape[0]
        need = bucket_bytes(net.config, shape.rows, shape.length, shape.dtype, vocab)
        while len(self.buckets) >= MAX_BUCKETS or (self.buckets and need > free_bytes(shape.device)):
            self.buckets.popitem(last=False)
        available = free_bytes(shape.device)
        if need > available:
            self._say_once(
                f"generation: the static cache for {shape.describe()} needs ~{_size(need)}, {_size(available)} "
                f"is free: eager decoding for this shape"
            )
            return None
        bucket = Bucket(net, shape, cache_argument(net))
        bucket.bytes = need
        if records(shape.device):
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            bucket.record(net, self.pool)
        self.buckets[shape] = bucket
        self.captures += 1
        return bucket

    @torch.no_grad()
    def sample(
        self,
        net,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params,
        *,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        with_logprobs: bool,
        uniforms: torch.Tensor | None,
        budgets: torch.Tensor | None,
        repeats: int,
        start: CacheRows | None = None,
        keep_cache: bool = False,
    ):
        """:func:`.eager.sample`'s result, or None when the static cache cannot serve the
        call (the caller samples eagerly, from the random state it would have had)."""
        if self.unfit is not None:
            return None
        distinct, width = prompt_ids.shape
        rows, steps = distinct * repeats, params.max_new_tokens
        dtype = next(net.parameters()).dtype
        shape = Shape(
            rows=next_power_of_two(rows), length=bucket_length(width, steps, params.cache_length),
            top_k=int(params.top_k or 0), nucleus=params.top_p < 1.0,
            stops=tuple(int(i) for i in torch.as_tensor(eos_token_id).reshape(-1).tolist()), pad=int(pad_token_id),
            dtype=dtype, device=prompt_ids.device,
        )  # fmt: skip
        random_state = _random_state(prompt_ids.device)
        was_training = net.training
        net.eval()
        try:
            bucket = self.bucket(net, shape)
            if bucket is None:
                return None
            bucket.load(prompt_mask, params, rows=rows, steps=steps, repeats=repeats, uniforms=uniforms, budgets=budgets)
            if start is None:
                bucket.prefill(net, prompt_ids, prompt_mask, repeats=repeats)
            else:
                bucket.resume(net, start, prompt_ids, rows=rows, repeats=repeats)
            drawn = 1  # the prefill drew each row's first token
            while drawn < steps:
                if drawn % CHECK_EVERY == 0 and bool(bucket.finished.all()):
                    break
                self.replays += bucket.advance(net)
                self.steps += 1
                drawn += 1
        except Exception as error:  # noqa: BLE001 - whatever fails, the run goes on sampling eagerly
            # StaticCacheMismatch: the model does what its config did not say; anything else
            # failed while making, recording or replaying the step (a CUDA capture error, a
            # kernel that cannot be recorded, memory): never the run's end, one line instead
            self.unfit = str(error) if isinstance(error, StaticCacheMismatch) else _failure(error)
            self.release()
            _restore_random_state(prompt_ids.device, random_state)
            self._say_once(f"generation: eager, not compiled: {self.unfit}")
            return None
        finally:
            net.train(was_training)
        end = int(bucket.finish_step[:rows].max()) + 1  # where the eager loop stops: its last row's end
        if uniforms is None and prompt_ids.device.type == "cpu":  # the generator where the eager loop leaves it
            _restore_random_state(prompt_ids.device, random_state)
            torch.rand((end, rows), dtype=torch.float64)
        ids = bucket.tokens[:rows, :end].clone()
        result = (ids, bucket.logprobs[:rows, :end].clone()) if with_logprobs else ids
        if not keep_cache:
            return result
        written = width + drawn - 1  # the prompts, then every token fed after the first draw
        kept = CacheRows(*([t[:rows, :, :written].clone() for t in side] for side in (bucket.cache.keys, bucket.cache.values)))
        return result, kept


def _failure(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0][:200]
    return f"the static-cache step failed ({type(error).__name__}: {first}); eager for the rest of the run"


def _random_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _restore_random_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


_samplers: "weakref.WeakKeyDictionary[torch.nn.Module, CompiledSampler]" = weakref.WeakKeyDictionary()


def sampler_for(model) -> CompiledSampler:
    """The compiled sampler of ``model`` (a module or a DeepSpeed engine), made on first use."""
    net = unwrap(model)
    if net not in _samplers:
        _samplers[net] = CompiledSampler()
    return _samplers[net]


def captures(model) -> int:
    """Buckets made (CUDA graphs recorded, on a GPU) for ``model`` so far in this process."""
    net = unwrap(model)
    return _samplers[net].captures if net in _samplers else 0


def measures(device: torch.device) -> bool:
    """Whether the buckets' memory is weighed against the update's on ``device`` (CUDA)."""
    return device.type == "cuda"


def peak_bytes(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device)


def total_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def keeps(held: int, peak: int | None, held_in_peak: bool, total: int) -> bool:
    """Whether ``held`` bytes of buckets may stay through the next update: the last update's
    measured ``peak`` (which counted them already where ``held_in_peak``) plus them under
    :data:`HEADROOM` of ``total``; never before the first update is measured."""
    if peak is None:
        return False
    return (peak if held_in_peak else peak + held) <= HEADROOM * total


def before_training(model) -> None:
    """Before an update: free ``model``'s buckets unless they are measured to fit beside it."""
    sampler = _samplers.get(unwrap(model))
    if sampler is None or not sampler.buckets:
        if sampler is not None:
            sampler.held_in_training = False
        return
    device = next(iter(sampler.buckets)).device  # a Shape's
    if not measures(device):
        return
    held = sum(bucket.bytes for bucket in sampler.buckets.values())
    sampler.held_in_training = keeps(held, sampler.training_peak, sampler.held_in_training, total_bytes(device))
    if not sampler.held_in_training:
        sampler._say_once(f"generation: the static caches ({_size(held)}) are freed before each update and made again at the "
                          "next rollout, until an update is measured to leave room for them")  # fmt: skip
        sampler.release()


def after_training(model, device) -> None:
    """After an update: its peak allocation on ``device``, for :func:`before_training`."""
    sampler = _samplers.get(unwrap(model))
    if sampler is not None and measures(torch.device(device)):
        sampler.training_peak = peak_bytes(torch.device(device))


def replays(model) -> int:
    """Tokens ``model`` drew by replaying a recorded step so far in this process (0 on a CPU,
    where the step is run, not recorded: :attr:`CompiledSampler.steps` counts those)."""
    net = unwrap(model)
    return _samplers[net].replays if net in _samplers else 0


def start_line(mode: str, why: str | None, config, *, rows: int, length: int, dtype: torch.dtype, device) -> str | None:
    """What a stage says at its start about how it samples (None: eager by name, nothing to
    say): the mode, why ``auto`` chose it, and the static cache of the stage's main calls
    (``rows`` sequences of up to ``length`` prompt + response tokens)."""
    if mode == "eager":
        return None if why is None else f"generation: eager (--generation auto: {why})"
    rows, length = next_power_of_two(rows), bucket_length(0, length, length)
    reason = unsupported(config, length)
    if reason is not None:
        return f"generation: eager, not compiled: {reason}"
    auto = f" (--generation auto: {why})" if why else ""
    if torch.device(device).type == "cuda":
        how = "each token's step recorded once as a CUDA graph"
    else:
        how = "on a CPU: the static-cache steps without CUDA graphs"
    size = _size(cache_bytes(config, rows, length, dtype))
    return f"generation: compiled{auto}, {how}; static KV cache {size} for {rows} rows x {length} tokens"


def announce(config, why: str | None, model, *, rows: int, device, say) -> None:
    """Say the stage's start-up line (:func:`start_line`) for ``config.generation``, resolved:
    ``rows`` sequences per call, ``model`` the module that samples."""
    line = start_line(
        config.generation, why, model.config, rows=rows, length=config.max_prompt_length + config.max_new_tokens,
        dtype=next(model.parameters()).dtype, device=device,
    )  # fmt: skip
    if line:
        say(line)


def settle(config, model, *, rows: int, device, say) -> None:
    """``config.generation`` resolved for this machine (``auto``: :func:`resolve`), then
    :func:`announce`d (a stage that fingerprints its options resolves before, as ppo does)."""
    config.generation, why = resolve(config.generation)
    announce(config, why, model, rows=rows, device=device, say=say)
