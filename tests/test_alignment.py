"""Character spans of exact token ids (marlhf_cli.macro.alignment), docs/method.md "Termination rules"."""

from __future__ import annotations

import json
import random

import pytest

from marlhf_cli.macro import alignment
from marlhf_cli.macro.alignment import token_offsets

UNICODE_TEXTS = [
    "héllo wörld, ça va? Ünïcödé façade naïve",
    "emoji 😀 and family 👩‍👩‍👧 and flag 🇫🇷!",
    "日本語のテキスト and 中文 mixed with English.",
    "  leading spaces\n\n\ttabs and\r\nwindows newlines  ",
    "I don't know (like this) -- the the the cat.",
    "def f(x):\n    return x ** 2  # ✓ done",
    "Ελληνικά, русский, עברית, العربية",
]


def assert_partition(text: str, spans: list[tuple[int, int]], n_tokens: int) -> None:
    """The module's guarantee: contiguous increasing spans that concatenate to the text."""
    assert len(spans) == n_tokens
    cursor = 0
    for start, end in spans:
        assert start == cursor and end >= start
        cursor = end
    assert cursor == len(text)
    assert "".join(text[s:e] for s, e in spans) == text


def owner_by_prefix_decoding(tokenizer, ids: list[int], char_index: int) -> int:
    """Reference: the first k such that decode(ids[:k+1]) already holds text[char_index]."""
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    for k in range(len(ids)):
        prefix = tokenizer.decode(ids[: k + 1], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if len(prefix) > char_index and prefix[: char_index + 1] == text[: char_index + 1]:
            return k
    raise AssertionError("character never decoded")


# --------------------------------------------------------------------------------------------
# Byte-level BPE: the real SmolLM2 tokenizer


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_spans_partition_the_decoded_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoded, spans = token_offsets(tokenizer, ids)
    assert decoded == text
    assert_partition(decoded, spans, len(ids))


def test_multibyte_char_split_across_tokens_goes_to_the_completing_token(tokenizer):
    text = "Smile 😀 and café"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    # the premise: byte-level BPE really splits the emoji's 4 bytes over two tokens here
    assert any(len(p) and not tokenizer.convert_tokens_to_string([p]).strip("\ufffd ") for p in pieces)
    decoded, spans = token_offsets(tokenizer, ids)
    emoji_at = decoded.index("😀")
    owner = next(i for i, (s, e) in enumerate(spans) if s <= emoji_at < e)
    assert owner == owner_by_prefix_decoding(tokenizer, ids, emoji_at)
    assert decoded[spans[owner][0]:spans[owner][1]].endswith("😀")
    # the token before holds the emoji's first bytes and only the space it completes
    assert decoded[spans[owner - 1][0]:spans[owner - 1][1]] == " "
    assert all(decoded[s:e] != "\ufffd" for s, e in spans)


def test_every_char_belongs_to_the_token_that_completes_it(tokenizer):
    text = "naïve 👩‍👩‍👧 日本"
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoded, spans = token_offsets(tokenizer, ids)
    for char_index in range(len(decoded)):
        owner = next(i for i, (s, e) in enumerate(spans) if s <= char_index < e)
        assert owner == owner_by_prefix_decoding(tokenizer, ids, char_index), char_index
    assert any(s == e for s, e in spans), "expected zero-length spans for partial-byte tokens"


def test_special_tokens_get_empty_spans(tokenizer):
    start, end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    body = tokenizer.encode("Hi there!", add_special_tokens=False)
    ids = [start] + body + [end, end]
    decoded, spans = token_offsets(tokenizer, ids)
    assert decoded == "Hi there!"
    assert_partition(decoded, spans, len(ids))
    assert spans[0] == (0, 0) and spans[-1] == spans[-2] == (len(decoded), len(decoded))


def test_spans_come_from_the_ids_not_from_retokenizing(tokenizer):
    # a non-canonical split the policy may sample: "hello" spelt letter by letter
    ids = tokenizer.convert_tokens_to_ids(list("hello") + ["Ġworld"])
    assert tokenizer.encode("hello world", add_special_tokens=False) != ids
    decoded, spans = token_offsets(tokenizer, ids)
    assert decoded == "hello world"
    assert [decoded[s:e] for s, e in spans] == ["h", "e", "l", "l", "o", " world"]


def test_no_cleanup_of_spaces_before_punctuation(tokenizer):
    ids = tokenizer.encode("a , b . c ' s", add_special_tokens=False)
    decoded, spans = token_offsets(tokenizer, ids)
    assert decoded == "a , b . c ' s"
    assert_partition(decoded, spans, len(ids))


def test_fast_path_is_used_and_agrees_with_prefix_decoding(tokenizer):
    ids = tokenizer.encode(" ".join(UNICODE_TEXTS), add_special_tokens=False) + [tokenizer.eos_token_id]
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    fast = alignment._replayed_decoder_spans(tokenizer, ids, text)
    assert fast is not None
    assert fast == alignment._prefix_decoding_spans(tokenizer, ids, text)


def test_random_ids_keep_the_guarantees_on_both_paths(tokenizer):
    rng = random.Random(0)
    vocab = len(tokenizer)
    for _ in range(150):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        text, spans = token_offsets(tokenizer, ids)
        assert text == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert_partition(text, spans, len(ids))
        slow = alignment._prefix_decoding_spans(tokenizer, ids, text)
        assert_partition(text, slow, len(ids))
        if "\ufffd" not in text:  # on invalid UTF-8 the two paths may place U+FFFD differently
            assert spans == slow


def test_generic_path_when_the_decoder_cannot_be_replayed(tokenizer, monkeypatch):
    monkeypatch.setattr(alignment, "_replayed_decoder_spans", lambda *args: None)
    text = "Smile 😀, naïve café!"
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    decoded, spans = token_offsets(tokenizer, ids)
    assert decoded == text
    assert_partition(decoded, spans, len(ids))
    emoji_at = decoded.index("😀")
    owner = next(i for i, (s, e) in enumerate(spans) if s <= emoji_at < e)
    assert owner == owner_by_prefix_decoding(tokenizer, ids, emoji_at)


def test_empty_ids(tokenizer):
    assert token_offsets(tokenizer, []) == ("", [])


# --------------------------------------------------------------------------------------------
# SentencePiece style: "▁" for spaces and <0xNN> byte fallback, built offline


CORPUS = [
    "The cat sat on the mat.",
    "I don't know (like this).",
    "Hello world, this is a test of the tokenizer.",
    "Numbers 123 and 456.\nNew line here.",
] * 10


def _wrap(raw):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def llama_style_tokenizer():
    """BPE with byte fallback and Llama's decoder (Replace ▁, ByteFallback, Fuse, Strip)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE(byte_fallback=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    raw.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    raw.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=150, special_tokens=["<s>", "</s>"], limit_alphabet=40)
    )
    config = json.loads(raw.to_str())  # byte tokens are ordinary vocabulary entries, as in Llama
    vocab = config["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    return _wrap(Tokenizer.from_str(json.dumps(config)))


@pytest.fixture(scope="module")
def metaspace_tokenizer():
    """Unigram with the Metaspace decoder (T5 style)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.Unigram())
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    raw.train_from_iterator(
        CORPUS, trainers.UnigramTrainer(vocab_size=80, special_tokens=["<s>", "</s>", "<unk>"], unk_token="<unk>")
    )
    return _wrap(raw)


def test_byte_fallback_char_goes_to_its_last_byte_token(llama_style_tokenizer):
    tok = llama_style_tokenizer
    text = "I said 😀 and héllo"
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    pieces = tok.convert_ids_to_tokens(ids)
    assert ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"] == [p for p in pieces if p.startswith("<0x")][:4]
    decoded, spans = token_offsets(tok, ids)
    assert decoded == text
    assert_partition(decoded, spans, len(ids))
    by_piece = [(piece, decoded[s:e]) for piece, (s, e) in zip(pieces, spans)]
    assert ("<0xF0>", "") in by_piece and ("<0x80>", "😀") in by_piece
    assert ("<0xC3>", "") in by_piece and ("<0xA9>", "é") in by_piece
    assert alignment._replayed_decoder_spans(tok, ids, decoded) == spans  # the O(T) path


@pytest.mark.parametrize("name", ["llama_style_tokenizer", "metaspace_tokenizer"])
def test_sentencepiece_style_paths_agree(name, request):
    tok = request.getfixturevalue(name)
    rng = random.Random(1)
    texts = ["  two leading spaces", "I don't know (like this).\nNew line.", "a  b   c"]
    samples = [tok.encode(t, add_special_tokens=False) for t in texts]
    samples += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 25))] for _ in range(100)]
    for ids in samples:
        text, spans = token_offsets(tok, ids)
        assert text == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert_partition(text, spans, len(ids))
        assert alignment._replayed_decoder_spans(tok, ids, text) is not None
        if "\ufffd" not in text:
            assert spans == alignment._prefix_decoding_spans(tok, ids, text)
