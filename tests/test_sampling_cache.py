"""The sampler's KV cache goes through the forward's supported argument: no deprecation
warning (transformers 5.2x renamed ``past_key_values`` to ``cache`` and removes the old name
in 5.40), and the cached steps still give the full forward's log-probs.

pyproject.toml also turns the deprecation into an error for the whole suite, so no other
forward can bring it back.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from marlhf_cli.train.forward import policy_forward
from marlhf_cli.generation import SamplingParams, cache_argument, response_mask, sample

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config).eval()


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_sampling_uses_the_supported_cache_argument(llama):
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers").warning_once.cache_clear()  # said once per process otherwise
    said = _Records()
    root = logging.getLogger("transformers")
    root.addHandler(said)
    prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            warnings.simplefilter("error", DeprecationWarning)
            ids = sample(llama, prompt, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]), SamplingParams(1.0, 0, 1.0, 6),
                         eos_token_id=63, pad_token_id=0)  # fmt: skip
    finally:
        root.removeHandler(said)
    assert ids.shape == (2, 6)
    assert not [m for m in said.messages if "deprecated" in m], said.messages


def test_the_cache_argument_is_the_one_the_forward_takes(llama):
    import inspect

    name = cache_argument(llama)
    assert name in inspect.signature(llama.forward).parameters


@pytest.mark.parametrize("top_k", [0, 5])
def test_cached_steps_give_the_full_forwards_log_probs(llama, top_k):
    prompt = torch.tensor([[0, 0, 5, 6], [8, 9, 10, 11]])
    mask = (prompt != 0).long()
    torch.manual_seed(1)
    ids, logp = sample(llama, prompt, mask, SamplingParams(0.7, top_k, 1.0, 10), eos_token_id=63, pad_token_id=0, with_logprobs=True)
    real, _ = response_mask(ids, 63)
    seq, att = torch.cat([prompt, ids], 1), torch.cat([mask, real], 1)
    with torch.no_grad():
        full, _ = policy_forward(llama, seq, att, prompt.shape[1], 0.7)
    assert torch.allclose(logp[real.bool()], full[real.bool()], atol=2e-5, rtol=0)


# ---------------------------------------------------------------------------------------
# keys and values carried from one call to the next (generation/cache_rows.py; the tree's
# children start from their parent's rows)


def test_realigned_rows_are_the_slices_moved_to_the_right_end():
    from marlhf_cli.generation.cache_rows import CacheRows, Slice, realigned

    generator = torch.Generator().manual_seed(3)
    sources = [
        CacheRows([torch.randn(3, 2, columns, 4, generator=generator) for _ in range(2)],
                  [torch.randn(3, 2, columns, 4, generator=generator) for _ in range(2)])  # fmt: skip
        for columns in (5, 9)
    ]
    for _ in range(20):
        width = int(torch.randint(1, 10, (), generator=generator))
        slices = []
        for _ in range(4):
            source = sources[int(torch.randint(0, 2, (), generator=generator))]
            end = int(torch.randint(0, source.columns + 1, (), generator=generator))
            length = int(torch.randint(0, min(end, width) + 1, (), generator=generator))
            slices.append(Slice(source, int(torch.randint(0, 3, (), generator=generator)), end, length))
        out = realigned(slices, width)
        for side in ("keys", "values"):
            for layer in range(2):
                expected = torch.zeros(4, 2, width, 4)
                for row, piece in enumerate(slices):  # the plain loop
                    source = getattr(piece.source, side)[layer][piece.row]
                    for j in range(piece.length):
                        expected[row, :, width - piece.length + j] = source[:, piece.end - piece.length + j]
                assert torch.equal(getattr(out, side)[layer], expected)
    with pytest.raises(ValueError):
        realigned([Slice(sources[0], 0, 5, 4)], 3)


def _left_padded(rows, pad=0):
    from marlhf_cli.train.ppo.continuations import left_padded

    return left_padded([torch.tensor(r) for r in rows], pad, "cpu")


@pytest.mark.parametrize("generation", ["eager", "compiled"])
@pytest.mark.parametrize("repeats", [1, 3])
def test_starting_from_an_earlier_calls_cache_draws_what_reading_the_prefix_draws(llama, generation, repeats):
    """Prefixes cut from the responses of two earlier calls (prompts of different lengths,
    so the rows move) sampled from their kept cache rows: the same tokens and log-probs as
    sampled after a forward over the prefixes, and the kept cache is again a start."""
    from marlhf_cli.generation.cache_rows import Slice, realigned
    from marlhf_cli.generation.compiled import sampler_for

    params = SamplingParams(1.0, 0, 1.0, 8, generation=generation)
    calls, slices, prefixes = [], [], []
    for prompts in ([[5, 6, 7], [8, 9, 10, 11, 12]], [[13, 14], [15, 16, 17, 18]]):
        ids, mask = _left_padded(prompts)
        torch.manual_seed(len(calls))
        (drawn, _), kept = sample(llama, ids, mask, params, eos_token_id=[], pad_token_id=0, with_logprobs=True, keep_cache=True)
        assert kept is not None and kept.rows == 2 and kept.columns >= ids.shape[1] + 8 - 1
        calls.append(kept)
        for row, prompt in enumerate(prompts):
            cut = 2 + row  # response[:cut] is the new prefix
            prefixes.append(prompt + drawn[row, :cut].tolist())
            end = ids.shape[1] + cut - 1  # the column of the prefix's last token, fed again
            slices.append(Slice(kept, row, end, len(prefixes[-1]) - 1))
    ids, mask = _left_padded(prefixes)
    start = realigned(slices, ids.shape[1] - 1)
    uniforms = torch.rand((len(prefixes) * repeats, 8), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    common = dict(eos_token_id=[], pad_token_id=0, with_logprobs=True, uniforms=uniforms, repeats=repeats)
    read_again = sample(llama, ids, mask, params, **common)
    steps_before = sampler_for(llama).steps
    (tokens, logprobs), kept = sample(llama, ids, mask, params, start=start, keep_cache=True, **common)
    assert (sampler_for(llama).steps > steps_before) == (generation == "compiled")  # it ran, not the eager fallback
    assert torch.equal(tokens, read_again[0])
    assert torch.allclose(logprobs, read_again[1], atol=2e-5, rtol=0)
    assert kept.rows == len(prefixes) * repeats and kept.columns >= ids.shape[1] + 8 - 1
    with pytest.raises(ValueError, match="start cache"):
        sample(llama, ids[:, 1:], mask[:, 1:], params, start=start, **common)


def test_compacted_rows_are_the_real_columns_moved_to_the_right_end():
    from marlhf_cli.generation.cache_rows import CacheRows, compacted

    generator = torch.Generator().manual_seed(4)
    for _ in range(20):
        rows = CacheRows([torch.randn(3, 2, 7, 4, generator=generator)], [torch.randn(3, 2, 7, 4, generator=generator)])
        mask = (torch.rand(3, 7, generator=generator) < 0.6).long()
        mask[:, -1] = 1
        out = compacted(rows, mask)
        width = int(mask.sum(dim=1).max())
        for side in ("keys", "values"):
            expected = torch.zeros(3, 2, width, 4)
            for row in range(3):  # the plain loop
                real = [c for c in range(7) if mask[row, c]]
                for j, column in enumerate(real):
                    expected[row, :, width - len(real) + j] = getattr(rows, side)[0][row, :, column]
            assert torch.equal(getattr(out, side)[0], expected)


def test_extended_rows_are_what_a_forward_over_the_whole_sequences_keeps(llama):
    """Kept rows of different lengths, and new columns of different lengths read onto them (an
    episode's next turn after the environment's message): the keys and values of every token
    but each sequence's last, as one left-padded forward over the whole sequences gives them,
    and a sampler call started from them draws what reading the sequences again draws."""
    from marlhf_cli.generation.cache_rows import extended, from_dynamic

    sequences = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20], [21, 22, 23, 24]]
    kept_lengths = [3, 6, 3]  # the rest, 4, 3 and 1 tokens, is new
    ids, mask = _left_padded([s[:n] for s, n in zip(sequences, kept_lengths)])
    out = llama(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True)
    kept = from_dynamic(getattr(out, "cache", None) or out.past_key_values)
    new_ids, new_mask = _left_padded([s[n:] for s, n in zip(sequences, kept_lengths)])
    start = extended(llama, kept, mask, new_ids, new_mask)
    whole, whole_mask = _left_padded(sequences)
    full = llama(input_ids=whole[:, :-1], attention_mask=whole_mask[:, :-1],
                 position_ids=(whole_mask[:, :-1].cumsum(-1) - 1).clamp(min=0), use_cache=True)  # fmt: skip
    reference = from_dynamic(getattr(full, "cache", None) or full.past_key_values)
    real = whole_mask[:, :-1].bool()[:, None, :, None]
    assert start.columns == whole.shape[1] - 1
    for got, expected in zip(start.keys + start.values, reference.keys + reference.values):
        torch.testing.assert_close(torch.where(real, got, 0), torch.where(real, expected, 0), rtol=0, atol=2e-5)
        assert (got[~real.expand_as(got)] == 0).all()
    params = SamplingParams(1.0, 0, 1.0, 6)
    torch.manual_seed(1)
    read_again = sample(llama, whole, whole_mask, params, eos_token_id=[], pad_token_id=0)
    torch.manual_seed(1)
    assert torch.equal(sample(llama, whole, whole_mask, params, eos_token_id=[], pad_token_id=0, start=start), read_again)


def test_only_full_attention_caches_travel():
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    from marlhf_cli.generation.cache_rows import CacheRows, from_dynamic, to_dynamic

    rows = CacheRows([torch.randn(2, 1, 3, 4)], [torch.randn(2, 1, 3, 4)])
    again = from_dynamic(to_dynamic(rows))
    assert torch.equal(again.keys[0], rows.keys[0]) and again.keys[0] is not rows.keys[0]
    windowed = DynamicCache()
    windowed.layers = [DynamicSlidingWindowLayer(sliding_window=2)]
    windowed.update(torch.randn(2, 1, 3, 4), torch.randn(2, 1, 3, 4), 0)
    assert from_dynamic(windowed) is None
    assert from_dynamic(DynamicCache()) is None  # nothing in it yet
