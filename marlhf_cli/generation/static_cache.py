"""The tensors the compiled sampler's step reads and writes, which never move: a KV cache,
the attention masks that go with it, and a bucket (:class:`Bucket`: one shape's cache,
buffers and decoding step, recorded on CUDA).

The compiled sampler (:mod:`.compiled`) replays one recorded decoding step per
token. A recording holds tensor addresses, so everything the step reads or writes must live
at the same address from one token to the next and from one call to the next: the keys and
values of every layer, the column the new token is written to, the mask of columns a row may
attend to. Transformers' own ``StaticCache`` keeps its write position inside the cache and
has changed how it is told where to write between releases (``cache_position``, then a
running length); :class:`StaticKVCache` is a plain object with the one method the attention
layers call, ``update(keys, values, layer_idx, ...)`` (checked with transformers 5.17, the
GPU machine's, and 5.24), and it writes where :attr:`StaticKVCache.write_at` says.

Two ways to write:

* **prefill** (:meth:`StaticKVCache.prefilling`): the prompts' forward writes columns
  ``0 .. P-1`` of the first rows and attends over those P columns only;
* **decode**: one token per row, written at column ``write_at`` (a one-element tensor the
  step advances itself); attention reads all L columns, the ones not yet written, or
  belonging to padding, masked out by :func:`decode_mask`.

The masks are additive (0 where a row may attend, the dtype's lowest value elsewhere), the
form both the ``sdpa`` and the ``eager`` attention of transformers add to their scores; a 4-D
mask is used by the model as it is, so no mask-building code of the release runs inside a
recorded step. Every query attends at least to its own column, so no softmax row is all
masked (a fully masked row gives NaN, which the next layer would spread to the real rows'
values through a zero weight times NaN).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from .attention import decoding
from .cache_rows import CacheRows
from .draw import cache_argument, draw, filter_logits, hugging_face_model, position_ids_from_mask

# Architectures whose attention layers call ``cache.update`` and take a 4-D additive mask as
# it is, and whose every layer attends to every earlier token (no sliding window, no
# recurrent state): checked against the eager sampler in tests/test_compiled_sampling.py.
SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "olmo", "olmo2",
    "granite", "gpt2", "gpt_neox", "stablelm", "starcoder2", "cohere", "smollm3", "helium", "glm",
)  # fmt: skip
ATTENTION = ("sdpa", "eager")
RECORD_WARMUP = 2  # eager runs of the step before it is recorded (cuBLAS workspaces, lazy inits)


class StaticCacheMismatch(RuntimeError):
    """The model does something its config did not announce (keys of another shape, a
    position taken from the cache): the sampler falls back to the eager loop."""


def _text_config(config):
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if callable(getter) else config


def unsupported(config, length: int) -> str | None:
    """Why a model with this config cannot sample through a static cache of ``length``
    columns, or None when it can."""
    text = _text_config(config)
    kind = getattr(text, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model type '{kind}' is not one the static cache was checked on ({', '.join(SUPPORTED_MODEL_TYPES)})"
    attention = getattr(text, "_attn_implementation", None) or "eager"
    if attention not in ATTENTION:
        return f"attention '{attention}' does not take a 4-D mask (sdpa and eager do)"
    window = getattr(text, "sliding_window", None)
    windowed = any(layer != "full_attention" for layer in getattr(text, "layer_types", None) or ())
    if (windowed or window) and getattr(text, "use_sliding_window", True) and (window or 0) < length:
        # a window at least as long as the cache never hides a token: full attention
        return f"sliding-window attention over {window} tokens, shorter than the {length} to sample"
    return None


def host_read(net, shape: "Shape") -> str | None:
    """Why ``net``'s decoding step cannot be recorded as a CUDA graph because it reads a value
    back to the host (``.item()``, ``nonzero``, a shape that depends on data), or None.

    Found by running the step, not by a list: a model of ``net``'s own class and config is
    built on the meta device, which holds no values, and one :meth:`Bucket.decode` runs
    there; any read of a value raises. Seen with transformers 5.24: ``rope_type="dynamic"``
    (llama, qwen2: ``.item()`` in the RoPE update), Mixtral's ``eager`` experts (``nonzero``).
    Other errors on the meta device (a kernel's dtype check stricter than the real one's) say
    nothing about host reads and pass: a failure while recording is caught anyway
    (compiled.py)."""
    import copy

    base = hugging_face_model(net)
    try:
        with torch.device("meta"):
            probe = type(base)(copy.deepcopy(base.config)).to(shape.dtype).eval()
        bucket = Bucket(probe, dataclasses.replace(shape, device=torch.device("meta")), cache_argument(probe))
        with torch.no_grad():
            bucket.decode(probe)
    except (NotImplementedError, RuntimeError) as error:
        message = (str(error).strip().splitlines() or [""])[0]
        if isinstance(error, NotImplementedError) or "meta" in message:
            return (f"its decoding step reads a value back to the host ({type(error).__name__}: {message[:120]}), which a "
                    "CUDA graph cannot record")  # fmt: skip
    except Exception:  # noqa: BLE001 - anything else on the meta device is no host read
        pass
    return None


def cache_shape(config) -> tuple[int, int, int]:
    """(layers, key-value heads, head dimension) of a decoder's KV cache."""
    text = _text_config(config)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, kv_heads, head_dim


def cache_bytes(config, rows: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values for ``rows`` sequences of ``length`` tokens."""
    layers, kv_heads, head_dim = cache_shape(config)
    return 2 * layers * rows * kv_heads * length * head_dim * torch.empty((), dtype=dtype).element_size()


class StaticKVCache:
    """Keys and values of every layer, ``[rows, kv_heads, length, head_dim]`` each, allocated
    once; the model writes into them (``update``) and attention reads them back."""

    is_compileable = True  # transformers asks this of a cache before it compiles around it

    def __init__(self, config, rows: int, length: int, *, dtype: torch.dtype, device):
        layers, kv_heads, head_dim = cache_shape(config)
        self.keys = [torch.zeros((rows, kv_heads, length, head_dim), dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros_like(keys) for keys in self.keys]
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)  # decode: the column the fed token goes to
        self._prefill_width: int | None = None

    @contextlib.contextmanager
    def prefilling(self, width: int):
        """Within the block, a forward of ``width`` tokens writes columns 0 .. width-1 of the
        first rows (as many as the forward has) and attends over those columns only."""
        self._prefill_width = width
        try:
            yield self
        finally:
            self._prefill_width = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if key_states.shape[1] != keys.shape[1] or key_states.shape[-1] != keys.shape[-1] or key_states.dtype != keys.dtype:
            raise StaticCacheMismatch(
                f"layer {layer_idx} gives keys of {key_states.shape[1]} heads x {key_states.shape[-1]} in {key_states.dtype}, "
                f"the static cache was made for {keys.shape[1]} x {keys.shape[-1]} in {keys.dtype} (from the model's config)"
            )
        if self._prefill_width is not None:
            rows, width = key_states.shape[0], key_states.shape[2]
            keys[:rows, :, :width].copy_(key_states)
            values[:rows, :, :width].copy_(value_states)
            return keys[:rows, :, :width], values[:rows, :, :width]
        keys.index_copy_(2, self.write_at, key_states)
        values.index_copy_(2, self.write_at, value_states)
        return keys, values

    def repeat_rows(self, rows: int, repeats: int) -> None:
        """Rows 0 .. rows-1 become rows 0 .. rows*repeats-1, each copied ``repeats`` times in
        place (row b to b*repeats .. b*repeats + repeats-1): the prompts were read once."""
        if repeats == 1:
            return
        for tensor in (*self.keys, *self.values):
            tensor[: rows * repeats].copy_(tensor[:rows].repeat_interleave(repeats, dim=0))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # The sampler always passes position ids, so a model never needs this to place tokens;
        # a model that still asks would place them wrong, which must not pass silently.
        raise StaticCacheMismatch("the model reads positions from its cache; the static cache is used with explicit position ids")


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)


def prefill_mask(prompt_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, P, P]: column j is visible from position i when j <= i and j is a real token;
    every position sees itself (a padding column, whose output is never used, sees only itself)."""
    width = prompt_mask.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=prompt_mask.device).tril()
    itself = torch.eye(width, dtype=torch.bool, device=prompt_mask.device)
    allowed = (causal[None] & prompt_mask.bool()[:, None, :]) | itself[None]
    return _additive(allowed, dtype)[:, None]


def decode_mask(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, 1, L] from ``valid`` [B, L]: the columns written so far that are not padding
    (the column of the token being fed is among them)."""
    return _additive(valid, dtype)[:, None, None, :]


# ---------------------------------------------------------------------------------------
# a bucket: the tensors of one shape and the decoding step that reads and writes only them
# (the eager sampler's step, marlhf_cli/generation/eager.py, on tensors that never move)


@dataclass(frozen=True)
class Shape:
    """What one recorded step is made for."""

    rows: int
    length: int  # cache columns: prompt + new tokens, rounded up
    top_k: int
    nucleus: bool  # top_p < 1: the sorted-mass filter is part of the step
    stops: tuple[int, ...]
    pad: int
    dtype: torch.dtype
    device: torch.device

    def describe(self) -> str:
        return f"{self.rows} rows x {self.length} tokens"

    def covers(self, other: "Shape") -> bool:
        """This bucket can serve a call of shape ``other``: at least its rows and columns
        (the extra rows are padding, the extra columns masked), the same step otherwise."""
        return (
            self.rows >= other.rows and self.length >= other.length
            and dataclasses.replace(self, rows=other.rows, length=other.length) == other
        )  # fmt: skip


class Bucket:
    """The static tensors of one shape and its decoding step (recorded on CUDA)."""

    def __init__(self, net, shape: Shape, cache_name: str):
        rows, length, device = shape.rows, shape.length, shape.device
        self.shape, self.cache_name = shape, cache_name
        self.cache = StaticKVCache(net.config, rows, length, dtype=shape.dtype, device=device)
        self.stop_ids = torch.tensor(shape.stops, dtype=torch.long, device=device)
        self.next_input = torch.full((rows, 1), shape.pad, dtype=torch.long, device=device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.valid = torch.zeros((rows, length), dtype=torch.bool, device=device)  # columns a row attends to
        # the same as the step's additive mask, kept up to date by the step itself (one
        # index_fill_ per token) rather than rebuilt from ``valid`` at every token
        self.mask = torch.full((rows, 1, 1, length), torch.finfo(shape.dtype).min, dtype=shape.dtype, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # the output column being drawn
        self.temperature = torch.ones(1, dtype=torch.float32, device=device)
        self.top_p = torch.ones(1, dtype=torch.float32, device=device)
        self.uniforms = torch.zeros((rows, length), dtype=torch.float64, device=device)
        self.budgets = torch.full((rows,), length, dtype=torch.long, device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.finish_step = torch.zeros(rows, dtype=torch.long, device=device)
        self.tokens = torch.full((rows, length), shape.pad, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, length), dtype=torch.float32, device=device)
        self.graph = None
        self.bytes = 0  # its estimated memory, set by the sampler that made it (compiled.bucket_bytes)
        self.replays = 0  # tokens drawn by replaying the recording (tests/test_gpu.py counts them)

    def load(self, prompt_mask, params, *, rows: int, steps: int, repeats: int, uniforms, budgets) -> None:
        """Set every buffer the step reads for one call (rows beyond ``rows`` are padding, done
        from the start)."""
        distinct, width = prompt_mask.shape
        self.valid.zero_()
        self.valid[:distinct, :width] = prompt_mask.bool()
        self.valid[:rows] = self.valid[:distinct].repeat_interleave(repeats, dim=0)
        self.positions.zero_()
        self.positions[:rows, 0] = prompt_mask.long().sum(dim=1).repeat_interleave(repeats)  # the next token's position
        self.temperature.fill_(params.temperature)
        self.top_p.fill_(params.top_p)
        self.uniforms.zero_()
        if uniforms is not None:
            self.uniforms[:rows, :steps] = uniforms[:, :steps].to(self.uniforms.device, torch.float64)
        else:  # the numbers the eager loop draws, one row of them per token
            self.uniforms[:rows, :steps] = torch.rand((steps, rows), dtype=torch.float64, device=self.uniforms.device).T
        self.budgets.fill_(steps)
        if budgets is not None:
            self.budgets[:rows] = budgets.to(self.budgets.device)
        self.finished.zero_()
        self.finished[rows:] = True
        self.finish_step.fill_(steps - 1)  # a row that never finishes runs to the last column
        self.finish_step[rows:] = -1
        self.step.zero_()

    def prefill(self, net, prompt_ids, prompt_mask, *, repeats: int) -> None:
        """The prompts' forward (each distinct prompt once) into the cache, and every row's first
        token; then the step's inputs point at the column after the prompts."""
        distinct, width = prompt_ids.shape
        with self.cache.prefilling(width):
            out = net(
                input_ids=prompt_ids, attention_mask=prefill_mask(prompt_mask, self.shape.dtype),
                position_ids=position_ids_from_mask(prompt_mask), use_cache=True, logits_to_keep=1,
                **{self.cache_name: self.cache},
            )  # fmt: skip
        self.cache.repeat_rows(distinct, repeats)
        last = out.logits[:, -1].float().repeat_interleave(repeats, dim=0)
        logits = torch.zeros((self.shape.rows, last.shape[-1]), dtype=torch.float32, device=last.device)
        logits[: last.shape[0]] = last
        self.choose(logits)
        self._decode_from(width)

    def resume(self, net, start: CacheRows, prompt_ids, *, rows: int, repeats: int) -> None:
        """:meth:`prefill` for prompts whose columns but the last are in ``start``: those keys and
        values are copied in and every row's last prompt column is fed as a decoding step would
        feed it (not recorded: its write column differs from the recorded step's), which draws the
        first token."""
        distinct, width = prompt_ids.shape  # start holds width - 1 columns of each (checked by the caller)
        for have, put in ((start.keys, self.cache.keys), (start.values, self.cache.values)):
            for layer, tensor in enumerate(have):
                put[layer][:distinct, :, : width - 1].copy_(tensor)
        self.cache.repeat_rows(distinct, repeats)
        self.next_input[:rows] = prompt_ids[:, -1:].repeat_interleave(repeats, dim=0)
        self.positions[:rows] -= 1  # load set the next token's; the fed one is the prompt's last
        self.cache.write_at.fill_(width - 1)
        self.valid[:, width - 1] = True  # real in every call's row (left padding); the padding rows' own column
        self.mask.copy_(decode_mask(self.valid, self.shape.dtype))  # the prompts' columns, the fed one among them
        with decoding(net.config):
            out = net(
                input_ids=self.next_input, attention_mask=self.mask, position_ids=self.positions, use_cache=True,
                logits_to_keep=1, **{self.cache_name: self.cache},
            )  # fmt: skip
        self.choose(out.logits[:, -1])
        self.positions.add_(1)
        self._decode_from(width)

    def _decode_from(self, width: int) -> None:
        """After the first token's draw: the step's inputs point at column ``width``, the first
        token's, which every row attends to from now on."""
        self.cache.write_at.fill_(width)
        self.valid[:, width] = True
        self.mask.copy_(decode_mask(self.valid, self.shape.dtype))  # what the step reads from now on

    def choose(self, logits: torch.Tensor) -> None:
        """Draw this step's token of every row from ``logits`` [rows, vocab] and record it: the
        eager sampler's step (:func:`.eager.sample`) on tensors that never move."""
        logits = logits.float() / self.temperature
        filtered = filter_logits(logits, self.shape.top_k, self.top_p, nucleus=self.shape.nucleus)
        drawn = draw(torch.softmax(filtered, dim=-1), self.uniforms.index_select(1, self.step).squeeze(1))
        logprob = torch.log_softmax(logits, dim=-1).gather(-1, drawn[:, None])  # of the unfiltered distribution
        token = torch.where(self.finished, self.shape.pad, drawn)
        self.tokens.index_copy_(1, self.step, token[:, None])
        self.logprobs.index_copy_(1, self.step, logprob)
        was_finished = self.finished.clone()
        self.finished |= (token[:, None] == self.stop_ids[None, :]).any(dim=1) | (self.budgets <= self.step + 1)
        self.finish_step.copy_(torch.where(self.finished & ~was_finished, self.step, self.finish_step))
        self.next_input.copy_(token[:, None])
        self.step.add_(1)

    def decode(self, net) -> None:
        """One token: feed the last one at column ``write_at``, draw the next, move on. The
        attention reads the cache without copying it per query head (:mod:`.attention`)."""
        with decoding(net.config):
            out = net(
                input_ids=self.next_input,
                attention_mask=self.mask,
                position_ids=self.positions,
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_name: self.cache},
            )
        self.choose(out.logits[:, -1])
        self.cache.write_at.add_(1)
        self.mask.index_fill_(3, self.cache.write_at, 0.0)
        self.positions.add_(1)

    def record(self, net, pool) -> None:
        """Record :meth:`decode` as a CUDA graph (after warm-up runs on a side stream, as
        CUDA graphs need). The warm-up moves the buffers; every call resets them."""
        stream = torch.cuda.Stream(device=self.shape.device)
        stream.wait_stream(torch.cuda.current_stream(self.shape.device))
        with torch.cuda.stream(stream):
            for _ in range(RECORD_WARMUP):
                self.decode(net)
        torch.cuda.current_stream(self.shape.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            self.decode(net)
        self.graph = graph

    def advance(self, net) -> bool:
        """The next token of every row: the recording replayed on CUDA (True), the step run
        on a CPU (False)."""
        if self.graph is not None:
            self.graph.replay()
            self.replays += 1
            return True
        self.decode(net)
        return False


def attention_bytes_per_token(config, rows: int, length: int, dtype: torch.dtype, *, grouped: bool) -> int:
    """Bytes of cache traffic one decoding step's attention moves over all layers, at ``rows``
    x ``length`` cache columns: ``grouped`` (:func:`.attention.attention`) reads the keys and values once;
    otherwise ``repeat_kv`` reads them, writes a copy per query head, and attention reads the
    copies. (The new column's write, the same for both, is left out.)"""
    layers, kv_heads, head_dim = cache_shape(config)
    heads = _text_config(config).num_attention_heads
    size = torch.empty((), dtype=dtype).element_size()
    per_head = rows * length * head_dim * size * 2  # keys and values of one head
    if grouped or heads == kv_heads:
        return layers * kv_heads * per_head
    return layers * (kv_heads + 2 * heads) * per_head
