"""The rule dispatcher, segment ids and batch segmentation (docs/method.md "Termination rules", invariants 4-5)."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import (
    SegmentStats,
    TerminationRule,
    fixed_lengths,
    lengths_to_segment_ids,
    ppl_lengths,
    segment_batch,
    start_segment_batch,
    segment_lengths,
)

FAST = settings(max_examples=100, deadline=None)


def spans(text):
    return [m.span() for m in re.finditer(r"\s*(\w+|[^\w\s])|\s+", text)]


def ids_to_lengths(ids_row: torch.Tensor, mask_row: torch.Tensor) -> list[int]:
    real = ids_row[mask_row.bool()].tolist()
    lengths: list[int] = []
    for i, value in enumerate(real):
        if i and value == real[i - 1]:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return lengths


@st.composite
def masks(draw, max_batch=5, max_time=14):
    batch = draw(st.integers(1, max_batch))
    time = draw(st.integers(1, max_time))
    rows = []
    for _ in range(batch):
        kind = draw(st.sampled_from(["right", "left", "any"]))
        if kind == "any":
            rows.append(draw(st.lists(st.integers(0, 1), min_size=time, max_size=time)))
        else:
            n = draw(st.integers(0, time))
            rows.append([1] * n + [0] * (time - n) if kind == "right" else [0] * (time - n) + [1] * n)
    return torch.tensor(rows)


# ---------------------------------------------------------------------------------------
# TerminationRule


def test_rule_defaults_and_normalisation():
    assert TerminationRule("fixed").n == 5
    assert TerminationRule("fixed", n=5.0).n == 5 and isinstance(TerminationRule("fixed", n=5.0).n, int)
    assert TerminationRule("fixed", n=math.inf).n == math.inf
    assert TerminationRule("parsing").cutoff == 5
    assert TerminationRule("code").cutoff == 10
    assert TerminationRule("code", cutoff=7).cutoff == 7
    assert TerminationRule("parsing").needs_text and not TerminationRule("ppl").needs_text
    with pytest.raises(dataclasses.FrozenInstanceError):
        TerminationRule("fixed").n = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "parse"}, "unknown termination rule 'parse'"),
        ({"name": "fixed", "n": 0}, "n must be"),
        ({"name": "fixed", "n": 2.5}, "n must be"),
        ({"name": "fixed", "n": float("nan")}, "n must be"),
        ({"name": "code", "cutoff": 0}, "cutoff"),
        ({"name": "parsing", "cutoff": 2.0}, "cutoff"),
        ({"name": "randomized", "seed": "x"}, "seed"),
        ({"name": "parsing", "backend": "benepar"}, "backend"),
    ],
)
def test_rule_validation_is_one_clear_line(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        TerminationRule(**kwargs)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------
# segment_lengths


def test_segment_lengths_per_rule():
    assert segment_lengths(TerminationRule("fixed", n=2), 5) == ([2, 2, 1], False)
    lengths, fell_back = segment_lengths(TerminationRule("randomized", seed=1), 40, sample_seed=3)
    assert sum(lengths) == 40 and not fell_back
    assert lengths == segment_lengths(TerminationRule("randomized", seed=1), 40, sample_seed=3)[0]
    others = {tuple(segment_lengths(TerminationRule("randomized", seed=s), 40, sample_seed=3)[0]) for s in range(10)}
    assert len(others) > 1  # the run seed matters
    ref = [-1.0, -0.5, -0.8, -0.8, -0.1]
    assert segment_lengths(TerminationRule("ppl"), 5, ref_logprobs=ref) == (ppl_lengths(ref), False)
    code = "x = 1\ny = 2\n"
    assert segment_lengths(TerminationRule("code"), len(spans(code)), text=code, offsets=spans(code)) == ([3, 4], False)


def test_segment_lengths_missing_inputs_are_caller_errors():
    with pytest.raises(ValueError, match="ref_logprobs"):
        segment_lengths(TerminationRule("ppl"), 3)
    with pytest.raises(ValueError, match="ref_logprobs"):
        segment_lengths(TerminationRule("ppl"), 3, ref_logprobs=[-1.0])
    with pytest.raises(ValueError, match="text and offsets"):
        segment_lengths(TerminationRule("code"), 3)
    with pytest.raises(ValueError, match="offsets"):
        segment_lengths(TerminationRule("code"), 3, text="x = 1", offsets=[(0, 5)])
    with pytest.raises(ValueError, match="length"):
        segment_lengths(TerminationRule("fixed"), -1)


def test_code_rule_falls_back_to_fixed_with_the_rules_n():
    text = "def f(:\n  return"
    offsets = spans(text)
    lengths, fell_back = segment_lengths(TerminationRule("code", n=2), len(offsets), text=text, offsets=offsets)
    assert fell_back and lengths == fixed_lengths(len(offsets), 2)


# --- parsing dispatch, with a stand-in parsing module ------------------------------------


@pytest.fixture
def fake_parsing(monkeypatch):
    """Replace marlhf_cli.macro.parsing by a stand-in whose behaviour a test sets."""
    module = types.ModuleType("marlhf_cli.macro.parsing")
    module.calls = []
    module.behaviour = lambda text, offsets, cutoff, backend: [len(offsets)]

    def parsing_lengths(text, offsets, cutoff=5, backend="auto"):
        module.calls.append((text, cutoff, backend))
        return module.behaviour(text, offsets, cutoff, backend)

    def parsing_lengths_batch(texts, offsets_list, cutoff=5, backend="auto"):
        return [parsing_lengths(t, o, cutoff, backend) for t, o in zip(texts, offsets_list)]

    module.parsing_lengths = parsing_lengths
    module.parsing_lengths_batch = parsing_lengths_batch
    monkeypatch.setitem(sys.modules, "marlhf_cli.macro.parsing", module)
    return module


def test_parsing_dispatch_passes_cutoff_and_backend(fake_parsing):
    rule = TerminationRule("parsing", cutoff=4, backend="spacy")
    fake_parsing.behaviour = lambda text, offsets, cutoff, backend: [2, len(offsets) - 2]
    assert segment_lengths(rule, 6, text="a b c d e f", offsets=spans("a b c d e f")) == ([2, 4], False)
    assert fake_parsing.calls == [("a b c d e f", 4, "spacy")]


@pytest.mark.parametrize(
    "behaviour",
    [
        lambda text, offsets, cutoff, backend: None,  # cannot parse
        lambda text, offsets, cutoff, backend: [1, 1],  # wrong sum
        lambda text, offsets, cutoff, backend: [0, len(offsets)],  # empty segment
        lambda text, offsets, cutoff, backend: 1 / 0,  # parser crash
    ],
)
def test_parsing_failures_fall_back_and_never_raise(fake_parsing, behaviour):
    fake_parsing.behaviour = behaviour
    rule = TerminationRule("parsing", n=4)
    text = "one two three four five six seven"
    assert segment_lengths(rule, 7, text=text, offsets=spans(text)) == ([4, 3], True)


def test_missing_parser_backend_is_not_a_silent_fallback(fake_parsing):
    def missing(*args):
        raise ImportError("spacy is not installed")

    fake_parsing.behaviour = missing
    with pytest.raises(ImportError):
        segment_lengths(TerminationRule("parsing"), 2, text="a b", offsets=spans("a b"))


def test_parsing_batch_counts_fallbacks(fake_parsing):
    texts = ["good text here", "bad text", ""]
    fake_parsing.behaviour = lambda text, offsets, cutoff, backend: None if text.startswith("bad") else [1, 2]
    offsets = [spans(t) for t in texts]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    ids, stats = segment_batch(TerminationRule("parsing", n=1), mask, texts=texts, offsets=offsets)
    assert ids.tolist() == [[0, 1, 1], [0, 1, 0], [0, 0, 0]]
    assert stats == SegmentStats(samples=3, segments=4, tokens=5, fallbacks=1)
    assert stats.mean_length == 5 / 4


# ---------------------------------------------------------------------------------------
# lengths_to_segment_ids


def test_lengths_to_segment_ids_layouts():
    right = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    assert lengths_to_segment_ids([[2, 3]], right).tolist() == [[0, 0, 1, 1, 1, 0, 0]]
    left = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    assert lengths_to_segment_ids([[2, 3]], left).tolist() == [[0, 0, 0, 0, 1, 1, 1]]
    holes = torch.tensor([[1, 0, 1, 1, 0, 1, 1]])
    assert lengths_to_segment_ids([[2, 1, 2]], holes).tolist() == [[0, 0, 0, 1, 0, 2, 2]]
    assert lengths_to_segment_ids([[], [1]], torch.tensor([[0, 0], [0, 1]])).tolist() == [[0, 0], [0, 0]]


def test_lengths_to_segment_ids_rejects_mismatches():
    mask = torch.tensor([[1, 1, 1, 0]])
    with pytest.raises(ValueError, match="sum to 2"):
        lengths_to_segment_ids([[1, 1]], mask)
    with pytest.raises(ValueError, match=">= 1"):
        lengths_to_segment_ids([[0, 3]], mask)
    with pytest.raises(ValueError, match="rows"):
        lengths_to_segment_ids([[3], [1]], mask)
    with pytest.raises(ValueError, match="batch, time"):
        lengths_to_segment_ids([[3]], torch.ones(3))


@FAST
@given(mask=masks(), seed=st.integers(0, 10**6))
def test_lengths_to_segment_ids_round_trip(mask, seed):
    import random

    rng = random.Random(seed)
    lengths = []
    for row in mask:
        count, sample = int(row.sum()), []
        while count:
            sample.append(rng.randint(1, count))
            count -= sample[-1]
        lengths.append(sample)
    ids = lengths_to_segment_ids(lengths, mask)
    assert not ids[~mask.bool()].any()
    for b in range(mask.shape[0]):
        assert ids_to_lengths(ids[b], mask[b]) == lengths[b]
        real = ids[b][mask[b].bool()].tolist()
        assert real == sorted(real) and (not real or real[0] == 0)


# ---------------------------------------------------------------------------------------
# segment_batch


@FAST
@given(mask=masks(), n=st.one_of(st.integers(1, 6), st.just(math.inf)))
def test_fixed_fast_path_equals_per_sample_rule(mask, n):
    ids, stats = segment_batch(TerminationRule("fixed", n=n), mask)
    lengths = [fixed_lengths(int(row.sum()), n) for row in mask]
    assert torch.equal(ids, lengths_to_segment_ids(lengths, mask))
    assert stats.segments == sum(len(x) for x in lengths)
    assert stats.tokens == int(mask.sum()) and stats.fallbacks == 0


@FAST
@given(
    mask=masks(),
    name=st.sampled_from(["fixed", "randomized", "ppl", "code"]),
    seed=st.integers(0, 10**6),
    extra=st.integers(0, 6),
    data=st.data(),
)
def test_sample_segmentation_is_independent_of_batch_and_padding(mask, name, seed, extra, data):
    """Invariant 5: a row's segment lengths are the same alone (with any padding) as in
    the batch, for every rule."""
    batch, time = mask.shape
    generator = torch.Generator().manual_seed(seed)
    ref = -torch.rand(batch, time, generator=generator, dtype=torch.float64) * 3
    words = ["x = 1\n", "y(", "def f(a, /, b):\n  return a\n", "z", " ", "if q:\n  pass\n"]
    texts, offsets = [], []
    for row in mask:
        count = int(row.sum())
        # a text with exactly `count` tokens: a word tokenization of a random snippet,
        # trimmed or padded with extra names
        text = "".join(data.draw(st.lists(st.sampled_from(words), max_size=4)))
        spans_ = spans(text)[:count]
        text = text[: spans_[-1][1]] if spans_ else ""
        while len(spans_) < count:
            spans_.append((len(text), len(text) + 2))
            text += " a"
        texts.append(text)
        offsets.append(spans_)
    seeds = [seed + b for b in range(batch)]
    rule = TerminationRule(name, n=3, seed=5)
    ids, stats = segment_batch(rule, mask, texts=texts, offsets=offsets, ref_logprobs=ref, sample_seeds=seeds)
    assert stats.samples == batch and stats.tokens == int(mask.sum())

    for b in range(batch):
        count = int(mask[b].sum())
        alone = torch.tensor([[0] * extra + [1] * count + [0] * extra])
        alone_ref = torch.zeros(alone.shape, dtype=torch.float64)
        alone_ref[0, extra : extra + count] = ref[b][mask[b].bool()]
        alone_ids, _ = segment_batch(
            rule, alone, texts=[texts[b]], offsets=[offsets[b]], ref_logprobs=alone_ref, sample_seeds=[seeds[b]]
        )
        assert ids_to_lengths(alone_ids[0], alone[0]) == ids_to_lengths(ids[b], mask[b])
        lengths = ids_to_lengths(ids[b], mask[b])
        assert sum(lengths) == count and all(x >= 1 for x in lengths)


def test_ppl_accepts_tensor_or_per_sample_lists():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])
    ref = torch.tensor([[-1.0, -0.5, -2.0, 9.9], [9.9, -3.0, -1.0, -0.2]])
    ids_tensor, _ = segment_batch(TerminationRule("ppl"), mask, ref_logprobs=ref)
    ids_lists, _ = segment_batch(
        TerminationRule("ppl"), mask, ref_logprobs=[[-1.0, -0.5, -2.0], [-3.0, -1.0, -0.2]]
    )
    assert torch.equal(ids_tensor, ids_lists)
    assert ids_tensor.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="shape"):
        segment_batch(TerminationRule("ppl"), mask, ref_logprobs=ref[:, :3])


def test_randomized_default_seeds_are_row_indices():
    mask = torch.ones(3, 30, dtype=torch.long)
    ids, _ = segment_batch(TerminationRule("randomized"), mask)
    explicit, _ = segment_batch(TerminationRule("randomized"), mask, sample_seeds=[0, 1, 2])
    assert torch.equal(ids, explicit)


CODES = ["x = 1\ny = 2\n", "def f(:\n", "for i in range(3):\n    print(i, i * i)\n", "", "a = [1,\n"]


def _code_batch():
    offsets = [spans(c) for c in CODES]
    time = max(len(o) for o in offsets) + 1
    mask = torch.tensor([[1] * len(o) + [0] * (time - len(o)) for o in offsets])
    return mask, offsets


def test_code_batch_stats_and_fallbacks():
    mask, offsets = _code_batch()
    ids, stats = segment_batch(TerminationRule("code", n=2), mask, texts=CODES, offsets=offsets)
    assert stats.fallbacks == 2  # "def f(:" and the truncated list
    assert stats.samples == 5 and stats.tokens == int(mask.sum())
    assert ids_to_lengths(ids[0], mask[0]) == [3, 4]
    assert ids_to_lengths(ids[1], mask[1]) == fixed_lengths(len(offsets[1]), 2)
    assert stats.as_metrics()["segment/fallbacks"] == 2.0
    with pytest.raises(ValueError, match="offsets"):
        segment_batch(TerminationRule("code"), mask, texts=CODES, offsets=offsets[:-1] + [[(0, 1)]])
    with pytest.raises(ValueError, match="texts and offsets"):
        segment_batch(TerminationRule("code"), mask)


def test_start_segment_batch_returns_before_the_parse_runs_and_agrees_with_segment_batch():
    """PPO starts the parse, runs its scoring forwards, then waits: starting must not block."""
    import threading

    mask, offsets = _code_batch()
    rule = TerminationRule("code", n=2, cutoff=3)
    inline = segment_batch(rule, mask, texts=CODES, offsets=offsets)
    gate = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(gate.wait)  # the one worker is busy until the gate opens
        pending = start_segment_batch(rule, mask, texts=CODES, offsets=offsets, executor=pool, workers=2)
        assert not pending.done()  # returned while nothing has been parsed yet
        gate.set()
        ids, stats = pending.result()
    assert torch.equal(ids, inline[0]) and stats == inline[1]
    assert pending.done() and pending.result()[1] == stats  # a second result() is the same


def test_worker_pools_give_the_same_result():
    mask, offsets = _code_batch()
    rule = TerminationRule("code", n=2, cutoff=3)
    inline = segment_batch(rule, mask, texts=CODES, offsets=offsets)
    with ThreadPoolExecutor(2) as pool:
        threaded = segment_batch(rule, mask, texts=CODES, offsets=offsets, executor=pool, workers=2)
    processes = segment_batch(rule, mask, texts=CODES, offsets=offsets, workers=2)
    for other in (threaded, processes):
        assert torch.equal(inline[0], other[0])
        assert inline[1] == other[1]
