"""Keys and values carried from one sampler call to the next, so that a sequence that goes on
from where an earlier call left it is not read again (``--advantage tree``: a node's children
start from their parent's cache rows).

A :class:`CacheRows` holds, for every layer, ``[rows, kv_heads, columns, head_dim]`` keys and
values of left-padded token rows: column j holds what the model's forward gives at column j
(keys after the position embedding, which is why columns may move: a token's position comes
from the attention mask, not from its column). A sampler call asked to ``keep`` its cache
returns the columns it wrote, prompt then fed tokens; a call given a ``start`` reads the keys
and values of every column of its prompts but the last and runs its first forward over that
last column alone (the draw of the first token needs its logits).

:func:`realigned` cuts rows out of the caches of several calls and lays them out as one
left-padded batch, which is the only reshaping a tree needs: the real columns of a row are
contiguous in every call's layout (left padding, prompt, generated tokens), and a slice of them
moved to the right end of a new row, with padding before it, is what the forward over the same
tokens left-padded to that width would have given, up to float rounding.

:func:`extended` reads several new columns onto kept rows, a different number per row (an
episode's next turn starts after the environment's message: ``marlhf_cli.episodes.rollout``):
one forward over the new columns, laid out after the kept ones with padding between them (the
mask hides it; positions come from the mask), then :func:`compacted` moves each row's real
columns together again, the layout a sampler call's ``start`` reads.

Only plain full-attention caches travel (transformers' ``DynamicLayer``, and the compiled
sampler's static cache): a sliding-window or recurrent layer keeps a state that is not one
column per token, and a call whose cache is of another kind returns none; the caller then reads
its prefixes again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .draw import cache_argument, position_ids_from_mask, unwrap


@dataclass
class CacheRows:
    keys: list[torch.Tensor]  # per layer [rows, kv_heads, columns, head_dim]
    values: list[torch.Tensor]

    @property
    def columns(self) -> int:
        return self.keys[0].shape[2]

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]


@dataclass(frozen=True)
class Slice:
    """Columns ``end - length .. end - 1`` of row ``row`` of ``source``."""

    source: CacheRows
    row: int
    end: int
    length: int


def realigned(slices: Sequence[Slice], width: int) -> CacheRows:
    """One batch of ``width`` columns, row i holding ``slices[i]`` at its right end and zeros
    before it (columns the attention mask hides). Rows are copied, never shared: the sampler
    writes into its cache. A few gathers per source and layer, not one copy per row."""
    if any(s.length > width or s.length > s.end or s.end > s.source.columns for s in slices):
        raise ValueError("a slice does not fit its source or the new width")
    sources: dict[int, list[int]] = {}  # the slices of each source, by id (CacheRows holds tensors: no hashing)
    for index, piece in enumerate(slices):
        sources.setdefault(id(piece.source), []).append(index)
    like = slices[0].source.keys
    device = like[0].device
    out = CacheRows(
        [torch.zeros((len(slices), k.shape[1], width, k.shape[3]), dtype=k.dtype, device=device) for k in like],
        [torch.zeros((len(slices), k.shape[1], width, k.shape[3]), dtype=k.dtype, device=device) for k in like],
    )
    for members in sources.values():
        source = slices[members[0]].source
        rows = torch.tensor([slices[i].row for i in members], device=device)
        ends = torch.tensor([slices[i].end for i in members], device=device)
        lengths = torch.tensor([slices[i].length for i in members], device=device)
        # column j of a new row reads column end - width + j of its source row; the ones before
        # the slice read column 0 and are zeroed
        columns = ends[:, None] - width + torch.arange(width, device=device)[None, :]
        inside = columns >= (ends - lengths)[:, None]
        columns = torch.where(inside, columns, 0)
        targets = torch.tensor(members, device=device)
        for have, put in ((source.keys, out.keys), (source.values, out.values)):
            for layer, tensor in enumerate(have):
                picked = tensor.index_select(0, rows)
                index = columns[:, None, :, None].expand(-1, picked.shape[1], -1, picked.shape[3])
                gathered = torch.where(inside[:, None, :, None], picked.gather(2, index), 0)
                put[layer].index_copy_(0, targets, gathered)
    return out


def from_dynamic(cache) -> CacheRows | None:
    """The keys and values of transformers' dynamic cache, or None when one of its layers is
    not a plain full-attention layer (or the release names them otherwise)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or getattr(layer, "keys", None) is None for layer in layers):
        return None
    return CacheRows([layer.keys for layer in layers], [layer.values for layer in layers])


def to_dynamic(rows: CacheRows):
    """A dynamic cache holding ``rows`` (its own copies: the forward appends to it)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    for layer, (keys, values) in enumerate(zip(rows.keys, rows.values)):
        cache.update(keys.clone(), values.clone(), layer)
    return cache


def compacted(rows: CacheRows, mask: torch.Tensor) -> CacheRows:
    """Each row's columns where ``mask`` [rows, columns] is 1, in their order, moved to the right
    end of a row as wide as the most of them, zeros before: a left-padded layout again."""
    real = mask.bool().to(rows.keys[0].device)
    width = int(real.sum(dim=1).max())
    # a stable sort of "is real" puts a row's padding first and its real columns after, in order
    columns = torch.argsort(real.to(torch.int8), dim=1, stable=True)[:, real.shape[1] - width :]
    inside = real.gather(1, columns)
    out = CacheRows([], [])
    for have, put in ((rows.keys, out.keys), (rows.values, out.values)):
        for tensor in have:
            index = columns[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
            put.append(torch.where(inside[:, None, :, None], tensor.gather(2, index), 0))
    return out


@torch.no_grad()
def extended(model, kept: CacheRows, kept_mask: torch.Tensor, new_ids: torch.Tensor, new_mask: torch.Tensor) -> CacheRows | None:
    """The keys and values of ``kept`` (its rows' columns, ``kept_mask``) followed by those of
    ``new_ids`` [rows, M] (left-padded, ``new_mask``) but the last column, compacted: row i's
    real columns, right-aligned, all but the last token of its whole sequence, the ``start``
    a sampler call over the whole sequences (left-padded) reads. None when the model's cache is
    not one that travels (:func:`from_dynamic`)."""
    if new_ids.shape[1] > 1:
        net = unwrap(model)
        was_training = net.training
        net.eval()
        mask = torch.cat([kept_mask, new_mask[:, :-1]], dim=1).long()
        try:
            out = net(
                input_ids=new_ids[:, :-1], attention_mask=mask, position_ids=position_ids_from_mask(mask)[:, kept.columns :],
                use_cache=True, logits_to_keep=1, **{cache_argument(net): to_dynamic(kept)},
            )  # fmt: skip
        finally:
            net.train(was_training)
        cache = out.cache if "cache" in getattr(out, "__dataclass_fields__", {}) else out.past_key_values
        kept = from_dynamic(cache)
        if kept is None:
            return None
    else:
        mask = kept_mask
    return compacted(kept, mask)
