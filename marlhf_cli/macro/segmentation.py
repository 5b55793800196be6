"""Dispatch a termination rule over responses and turn segment lengths into segment ids.

The rules (``rules.py``, ``code.py``, and ``parsing.py`` for natural language) each map one
response to a list of segment lengths. This module picks the rule from a
:class:`TerminationRule`, applies the fall-back policy of docs/method.md "Termination rules" (a text rule that
cannot parse falls back to ``fixed`` with the rule's n, and the fallback is counted, never
raised), and lays the lengths out as per-token segment ids aligned with a response mask,
which is what :func:`marlhf_cli.macro.advantages.macro_advantages` consumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tensors' functions import it when called: `marlhf segment` runs without torch
    import torch

from .code import DEFAULT_CODE_CUTOFF, code_lengths
from .rules import check_n, fixed_lengths, ppl_lengths, randomized_lengths

__all__ = [
    "RULE_NAMES",
    "TEXT_RULES",
    "DEFAULT_PARSING_CUTOFF",
    "TerminationRule",
    "SegmentStats",
    "segment_lengths",
    "lengths_to_segment_ids",
    "segment_batch",
    "start_segment_batch",
    "PendingSegments",
    "warm_up",
    "missing_parser",
]

RULE_NAMES = ("fixed", "randomized", "ppl", "parsing", "code", "turn")
TEXT_RULES = ("parsing", "code")
BACKENDS = ("auto", "spacy", "stanza")
# docs/method.md "Termination rules": the parsing rule's C = 5. The code rule's C_code: see code.DEFAULT_CODE_CUTOFF.
DEFAULT_PARSING_CUTOFF = 5
_DEFAULT_CUTOFF = {"parsing": DEFAULT_PARSING_CUTOFF, "code": DEFAULT_CODE_CUTOFF}


@dataclasses.dataclass(frozen=True)
class TerminationRule:
    """Which termination rule forms the macro actions, with its parameters.

    - ``name``: one of ``fixed``, ``randomized``, ``ppl``, ``parsing``, ``code``, ``turn``
      (an assistant turn of an episode is one macro action: :mod:`.turns`; a single
      response, one turn, is then one segment).
    - ``n``: the fixed length (whole number >= 1, or ``math.inf`` for one segment per
      response); also the fallback length of the text rules (docs/method.md "Termination rules").
    - ``cutoff``: C, the most LM tokens a parse node / statement may span before it is
      split. ``None`` (the default) resolves to the rule's default in ``__post_init__``:
      5 for ``parsing`` (the paper's C), 10 for ``code`` (see ``code.DEFAULT_CODE_CUTOFF``),
      5 for the others (unused by them). After construction ``cutoff`` is always an int.
    - ``seed``: mixed with each sample's seed by the ``randomized`` rule.
    - ``backend``: the parser of the ``parsing`` rule (``auto``, ``spacy`` or ``stanza``).
    """

    name: str
    n: float = 5
    cutoff: int | None = None
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.name not in RULE_NAMES:
            raise ValueError(
                f"unknown termination rule {self.name!r}; choose one of {', '.join(RULE_NAMES)}"
            )
        try:
            n = check_n(self.n)
        except ValueError:
            raise ValueError(f"termination n must be a whole number >= 1 or inf, got {self.n!r}") from None
        object.__setattr__(self, "n", n)
        cutoff = _DEFAULT_CUTOFF.get(self.name, DEFAULT_PARSING_CUTOFF) if self.cutoff is None else self.cutoff
        if isinstance(cutoff, bool) or not isinstance(cutoff, int) or cutoff < 1:
            raise ValueError(f"termination cutoff must be an int >= 1, got {self.cutoff!r}")
        object.__setattr__(self, "cutoff", cutoff)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"termination seed must be an int, got {self.seed!r}")
        if self.backend not in BACKENDS:
            raise ValueError(
                f"unknown parsing backend {self.backend!r}; choose one of {', '.join(BACKENDS)}"
            )

    @property
    def needs_text(self) -> bool:
        """Whether the rule reads the response text and token offsets."""
        return self.name in TEXT_RULES


@dataclasses.dataclass(frozen=True)
class SegmentStats:
    """What a batch's segmentation looked like, for the metrics log.

    ``fallbacks`` counts responses whose text rule failed (parse error) and were segmented
    with ``fixed`` instead (docs/method.md "Termination rules": count the fallbacks in the metrics).
    """

    samples: int
    segments: int
    tokens: int
    fallbacks: int

    @property
    def mean_length(self) -> float:
        return self.tokens / self.segments if self.segments else 0.0

    @property
    def fallback_rate(self) -> float:
        return self.fallbacks / self.samples if self.samples else 0.0

    def as_metrics(self, prefix: str = "segment/") -> dict[str, float]:
        return {
            f"{prefix}count": float(self.segments),
            f"{prefix}mean_length": self.mean_length,
            f"{prefix}fallbacks": float(self.fallbacks),
            f"{prefix}fallback_rate": self.fallback_rate,
        }


def _mix_seeds(rule_seed: int, sample_seed: int) -> int:
    """A well-mixed, platform-independent seed from the run seed and the sample seed."""
    digest = hashlib.blake2b(f"{rule_seed}:{sample_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _valid(lengths: object, length: int) -> bool:
    return (
        isinstance(lengths, list)
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in lengths)
        and sum(lengths) == length
    )


def _text_rule_lengths(rule: TerminationRule, text: str, offsets: Sequence[tuple[int, int]]):
    if rule.name == "code":
        return code_lengths(text, list(offsets), rule.cutoff)
    # Imported lazily: the parsing backends pull in spaCy/stanza. An ImportError here is a
    # configuration error (the backend is not installed), not a parse failure: it propagates.
    from .parsing import parsing_lengths

    return parsing_lengths(text, list(offsets), rule.cutoff, backend=rule.backend)


def segment_lengths(
    rule: TerminationRule,
    length: int,
    *,
    text: str | None = None,
    offsets: Sequence[tuple[int, int]] | None = None,
    ref_logprobs: Sequence[float] | None = None,
    sample_seed: int = 0,
) -> tuple[list[int], bool]:
    """Segment lengths of one response of ``length`` real tokens, and whether it fell back.

    ``text``/``offsets`` (the character span of each real token in ``text``) are required by
    ``parsing`` and ``code``; ``ref_logprobs`` (one per real token) by ``ppl``. Missing or
    mis-sized inputs are caller bugs and raise ValueError; a text that does not parse, a
    parser exception or an invalid result fall back to ``fixed_lengths(length, rule.n)``
    with ``fell_back=True``.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"length must be an int >= 0, got {length!r}")
    if rule.name == "fixed":
        return fixed_lengths(length, rule.n), False
    if rule.name == "turn":  # one response is one turn
        return fixed_lengths(length, math.inf), False
    if rule.name == "randomized":
        return randomized_lengths(length, _mix_seeds(rule.seed, sample_seed)), False
    if rule.name == "ppl":
        if ref_logprobs is None:
            raise ValueError("the ppl rule needs ref_logprobs")
        if len(ref_logprobs) != length:
            raise ValueError(f"ppl rule: {len(ref_logprobs)} ref_logprobs for {length} tokens")
        return ppl_lengths(ref_logprobs), False
    # text rules
    if text is None or offsets is None:
        raise ValueError(f"the {rule.name} rule needs text and offsets")
    if len(offsets) != length:
        raise ValueError(f"{rule.name} rule: {len(offsets)} offsets for {length} tokens")
    if length == 0:
        return [], False
    try:
        lengths = _text_rule_lengths(rule, text, offsets)
    except ImportError:
        raise
    except Exception:  # a parser crash on one response must not stop a training step
        lengths = None
    if lengths is None or not _valid(lengths, length):
        return fixed_lengths(length, rule.n), True
    return lengths, False


def lengths_to_segment_ids(
    lengths_per_sample: Sequence[Sequence[int]], mask: torch.Tensor
) -> torch.Tensor:
    """Per-token segment index within its sample, laid out where ``mask`` is 1.

    Row b gets 0,0,1,1,1,2,... over its real positions (in order; the mask may be right
    padded, left padded or any 0/1 pattern) and 0 at masked positions. Raises ValueError if
    the number of samples or a sample's total length does not match the mask.
    """
    import torch

    if mask.dim() != 2:
        raise ValueError(f"mask must be [batch, time], got shape {tuple(mask.shape)}")
    real = mask.bool()
    counts = real.sum(dim=1).tolist()
    if len(lengths_per_sample) != len(counts):
        raise ValueError(f"{len(lengths_per_sample)} samples of lengths for a mask of {len(counts)} rows")
    flat_lengths: list[int] = []
    flat_ids: list[int] = []
    for b, (lengths, count) in enumerate(zip(lengths_per_sample, counts)):
        lengths = [int(x) for x in lengths]
        if any(x < 1 for x in lengths):
            raise ValueError(f"sample {b}: segment lengths must be >= 1, got {lengths}")
        if sum(lengths) != count:
            raise ValueError(f"sample {b}: segment lengths sum to {sum(lengths)}, mask has {count} real tokens")
        flat_lengths.extend(lengths)
        flat_ids.extend(range(len(lengths)))
    ids = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
    if flat_lengths:
        per_token = torch.repeat_interleave(
            torch.tensor(flat_ids, dtype=torch.long), torch.tensor(flat_lengths, dtype=torch.long)
        )
        # Boolean indexing walks row-major, i.e. sample by sample, each in time order.
        ids[real] = per_token.to(mask.device)
    return ids


def _fixed_segment_ids(mask: torch.Tensor, n: int | float) -> torch.Tensor:
    """Vectorised ``fixed`` rule: the k-th real token of a sample is in segment k // n."""
    import torch

    real = mask.bool()
    index_among_real = real.long().cumsum(dim=1) - 1
    if math.isinf(n):
        ids = torch.zeros_like(index_among_real)
    else:
        ids = torch.div(index_among_real, int(n), rounding_mode="floor")
    return torch.where(real, ids, torch.zeros_like(ids))


def _segment_one(job: tuple) -> tuple[list[int], bool]:
    rule, length, text, offsets, ref, seed = job
    return segment_lengths(rule, length, text=text, offsets=offsets, ref_logprobs=ref, sample_seed=seed)


def _segment_chunk(jobs: list[tuple]) -> list[tuple[list[int], bool]]:
    """Segment several responses (one worker's share). The parsing rule parses them in one
    batched call of its backend when it offers one (spaCy ``nlp.pipe``); each response is
    still segmented on its own, and any failure there is retried response by response."""
    if jobs and jobs[0][0].name == "parsing":
        from .parsing import parsing_lengths_batch  # lazy: pulls in spaCy/stanza

        rule = jobs[0][0]
        try:
            batched = parsing_lengths_batch(
                [job[2] for job in jobs], [list(job[3]) for job in jobs], rule.cutoff, backend=rule.backend
            )
        except ImportError:
            raise
        except Exception:
            batched = None
        if batched is not None and len(batched) == len(jobs):
            results = []
            for job, lengths in zip(jobs, batched):
                length = job[1]
                if length == 0:
                    results.append(([], False))
                elif lengths is None or not _valid(lengths, length):
                    results.append((fixed_lengths(length, rule.n), True))
                else:
                    results.append((list(lengths), False))
            return results
    return [_segment_one(job) for job in jobs]


def segment_batch(
    rule: TerminationRule,
    mask: torch.Tensor,
    *,
    texts: Sequence[str] | None = None,
    offsets: Sequence[Sequence[tuple[int, int]]] | None = None,
    ref_logprobs: torch.Tensor | Sequence[Sequence[float]] | None = None,
    sample_seeds: Sequence[int] | None = None,
    workers: int = 0,
    executor: Executor | None = None,
) -> tuple[torch.Tensor, SegmentStats]:
    """Segment every response of a batch; return segment ids [B, T] and stats.

    - ``mask``: [B, T] response mask (1 = real token).
    - ``texts``/``offsets``: per sample, the response text and the character spans of its
      real tokens (text rules only).
    - ``ref_logprobs``: [B, T] aligned with ``mask``, or per-sample sequences of the real
      tokens' values (``ppl`` only).
    - ``sample_seeds``: per-sample seeds of the ``randomized`` rule. Default: the row index,
      which is reproducible for a fixed batch order; pass a global sample index (e.g.
      step * batch + row) to make a sample's segmentation independent of its position.
    - ``workers``/``executor``: text rules run on ``executor`` when given (the caller owns
      and reuses it: a process pool keeps one loaded parser per worker), split into
      ``workers`` shares (default: one per CPU); else on a ``ProcessPoolExecutor(workers)``
      made for this call when ``workers > 0``; else inline. Results do not depend on this.
    """
    kwargs = dict(texts=texts, offsets=offsets, ref_logprobs=ref_logprobs, sample_seeds=sample_seeds, workers=workers)
    if rule.needs_text and executor is None and workers > 0 and mask.shape[0] > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return start_segment_batch(rule, mask, executor=pool, **kwargs).result()
    return start_segment_batch(rule, mask, executor=executor, **kwargs).result()


def missing_parser(rule: TerminationRule) -> str | None:
    """What to install before ``rule`` can run, in one line, or None when nothing is missing.

    Only ``parsing`` needs a package beyond torch. The commands call this at start-up, before
    loading any model: a run labelled "parsing" must never be ``fixed`` in disguise
    (docs/method.md "Termination rules"). It imports the parser package but loads no parser model.
    """
    if rule.name != "parsing":
        return None
    from .parsing import missing_parser as parser_missing  # lazy: the check imports spaCy

    return parser_missing(rule.backend)


def warm_up(rule: TerminationRule) -> None:
    """Segment one short sentence with ``rule``: this loads its parser (spaCy or stanza for
    ``parsing``) in the calling process. PPO submits it to each parse worker at start-up so
    that the first batch does not wait for the model to load."""
    text = "The cat sat. It was warm."
    spans = [(0, 3), (3, 7), (7, 11), (11, 12), (12, 15), (15, 19), (19, 24), (24, 25)]
    segment_lengths(rule, len(spans), text=text, offsets=spans)


class PendingSegments:
    """Segment ids of a batch that may still be computing on an executor: ``result()``
    waits for them and returns ``(segment_ids, stats)`` exactly as :func:`segment_batch`."""

    def __init__(self, mask: torch.Tensor, counts: list[int], chunks: list, n_chunks: int, ready=None):
        self._mask, self._counts, self._chunks, self._n_chunks = mask, counts, chunks, n_chunks
        self._ready: tuple[torch.Tensor, SegmentStats] | None = ready

    def done(self) -> bool:
        return all(not isinstance(c, Future) or c.done() for c in self._chunks)

    def result(self) -> tuple[torch.Tensor, SegmentStats]:
        if self._ready is not None:
            return self._ready
        batch = self._mask.shape[0]
        results: list[tuple[list[int], bool]] = [([], False)] * batch
        for i, chunk in enumerate(self._chunks):  # chunk i holds samples i, i + n_chunks, ...
            for offset, one in enumerate(chunk.result() if isinstance(chunk, Future) else chunk):
                results[i + offset * self._n_chunks] = one
        lengths = [r[0] for r in results]
        ids = lengths_to_segment_ids(lengths, self._mask)
        stats = SegmentStats(
            samples=batch,
            segments=sum(len(x) for x in lengths),
            tokens=sum(self._counts),
            fallbacks=sum(1 for r in results if r[1]),
        )
        self._ready = (ids, stats)
        return ids, stats


def start_segment_batch(
    rule: TerminationRule,
    mask: torch.Tensor,
    *,
    texts: Sequence[str] | None = None,
    offsets: Sequence[Sequence[tuple[int, int]]] | None = None,
    ref_logprobs: torch.Tensor | Sequence[Sequence[float]] | None = None,
    sample_seeds: Sequence[int] | None = None,
    workers: int = 0,
    executor: Executor | None = None,
) -> PendingSegments:
    """:func:`segment_batch` without waiting: a text rule given an ``executor`` is submitted
    to it in ``workers`` shares (default: one per CPU) and this returns at once, so the
    caller can run model work while the parser runs (PPO scores the responses meanwhile).
    Every other case is computed here. Inputs are checked here, whatever the case."""
    import torch

    if mask.dim() != 2:
        raise ValueError(f"mask must be [batch, time], got shape {tuple(mask.shape)}")
    batch = mask.shape[0]
    counts = mask.bool().sum(dim=1).tolist()
    if rule.name in ("fixed", "turn"):  # vectorised: no per-sample lengths (a response is one turn)
        n = math.inf if rule.name == "turn" else rule.n
        ids = _fixed_segment_ids(mask, n)
        segments = sum(len(fixed_lengths(c, n)) if c else 0 for c in counts)
        return PendingSegments(mask, counts, [], 1, ready=(ids, SegmentStats(batch, segments, sum(counts), 0)))

    seeds = list(range(batch)) if sample_seeds is None else [int(s) for s in sample_seeds]
    if len(seeds) != batch:
        raise ValueError(f"{len(seeds)} sample_seeds for {batch} samples")
    refs: list[list[float] | None] = [None] * batch
    if rule.name == "ppl":
        if ref_logprobs is None:
            raise ValueError("the ppl rule needs ref_logprobs")
        if isinstance(ref_logprobs, torch.Tensor):
            if ref_logprobs.shape != mask.shape:
                raise ValueError(
                    f"ref_logprobs shape {tuple(ref_logprobs.shape)} differs from mask shape {tuple(mask.shape)}"
                )
            real = mask.bool()
            rows = ref_logprobs.detach().float().cpu()
            refs = [rows[b][real[b].cpu()].tolist() for b in range(batch)]
        else:
            refs = [list(map(float, r)) for r in ref_logprobs]
    text_list: list[str | None] = [None] * batch
    offset_list: list[Sequence[tuple[int, int]] | None] = [None] * batch
    if rule.needs_text:
        if texts is None or offsets is None:
            raise ValueError(f"the {rule.name} rule needs texts and offsets")
        text_list, offset_list = list(texts), list(offsets)
        if len(text_list) != batch or len(offset_list) != batch:
            raise ValueError(f"{len(text_list)} texts / {len(offset_list)} offsets for {batch} samples")
        for b, spans in enumerate(offset_list):
            if len(spans) != counts[b]:
                raise ValueError(f"sample {b}: {len(spans)} offsets for {counts[b]} real tokens")

    jobs = [(rule, counts[b], text_list[b], offset_list[b], refs[b], seeds[b]) for b in range(batch)]
    if rule.needs_text and executor is not None and batch > 1:
        # One share per worker; strided so that long and short responses mix.
        n_chunks = min(batch, workers if workers > 0 else (os.cpu_count() or 1))
        futures = [executor.submit(_segment_chunk, jobs[i::n_chunks]) for i in range(n_chunks)]
        return PendingSegments(mask, counts, futures, n_chunks)
    return PendingSegments(mask, counts, [_segment_chunk(jobs)], 1)
