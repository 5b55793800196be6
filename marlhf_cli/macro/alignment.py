"""Character spans of generated token ids, computed from the ids themselves.

The ``parsing`` termination rule (docs/method.md "Termination rules") maps parser words to LM tokens through
character offsets. Public implementations got this wrong by re-tokenizing the decoded text
or searching for word strings in it: re-tokenizing a sampled response does not give back the
sampled ids (BPE is not injective on ids, and the policy may sample non-canonical splits),
and string search mis-aligns repeated words ("the the the cat"). So the offsets here come from
the exact ids:

* ``text`` is ``tokenizer.decode(ids, skip_special_tokens=True,
  clean_up_tokenization_spaces=False)``. Clean-up is forced off because it deletes spaces
  before punctuation, and then the text would no longer be the concatenation of the tokens'
  pieces.
* ``spans[i] = (start, end)`` is the slice of ``text`` that token ``i`` contributes.

Guarantees (tested): the spans are contiguous and increasing, ``spans[0][0] == 0``,
``spans[i][1] == spans[i+1][0]``, the last end is ``len(text)``, so the slices concatenate to
``text``. Special tokens (skipped by decoding) get empty spans.

Multi-byte characters split across tokens: byte-level BPE (GPT-2, Llama-3, SmolLM2) can cut a
UTF-8 character between two tokens (an emoji is often ``' \\xf0\\x9f\\x98'`` + ``'\\x80'``),
and SentencePiece byte fallback emits one ``<0xNN>`` token per byte. A character belongs to
the token that *completes* it; earlier tokens holding only its leading bytes get the
characters they complete themselves, possibly none (a zero-length span). Bytes that never
form a valid character decode to U+FFFD exactly as ``decode`` does; the fast path below gives
that U+FFFD to the token whose bytes make it final, the generic path to the first token whose
prefix decodes to it (the two differ only on invalid UTF-8, which only a badly trained policy
samples; both keep the guarantees).

Two ways to get there, with the same result:

1. Fast, O(T): rebuild each token's bytes by replaying the tokenizer's decoder pipeline
   (ByteLevel, or the SentencePiece pieces Replace/ByteFallback/Fuse/Strip/Metaspace) on
   single tokens, then feed the bytes through an incremental UTF-8 decoder, token by token.
   The result is checked against ``decode``; on any difference (an unusual decoder, an
   added token the replay does not model) the slow way is used instead.
2. Generic, O(T^2) in the tokenizer's own code: decode every prefix ``ids[:i+1]`` and take
   the longest prefix of ``text`` it agrees with (a provisional U+FFFD for an unfinished
   character at the end of a prefix does not agree, so the character goes to the token
   that completes it). Works for any tokenizer, fast or slow.
"""

from __future__ import annotations

import codecs
import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

Span = tuple[int, int]

_BYTE_FALLBACK_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[Span]]:
    """Return ``(text, spans)`` for the exact ``ids``: see the module docstring.

    ``tokenizer`` is a transformers tokenizer (fast or slow). ``ids`` may be any sequence of
    ints (a list, a 1-D tensor converted with ``.tolist()``); pass only the real response
    tokens (no padding), the EOS may be included: as a special token it gets an empty span.
    """
    ids = [int(token_id) for token_id in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if not ids:
        return text, []
    spans = _replayed_decoder_spans(tokenizer, ids, text)
    if spans is None:
        spans = _prefix_decoding_spans(tokenizer, ids, text)
    return text, spans


# ---------------------------------------------------------------------------------------------
# Fast path: replay the decoder per token


@lru_cache(maxsize=1)
def _byte_level_char_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``: the printable stand-in char of each byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    byte_values = printable[:]
    code_points = printable[:]
    shift = 0
    for byte in range(256):
        if byte not in byte_values:
            byte_values.append(byte)
            code_points.append(256 + shift)
            shift += 1
    return {chr(point): byte for byte, point in zip(byte_values, code_points)}


@dataclass
class _DecoderReplay:
    """What the fast path needs to know about one tokenizer, computed once per tokenizer."""

    steps: list[dict]  # the decoder pipeline, flattened
    skipped_ids: frozenset[int]  # ids ``decode(skip_special_tokens=True)`` drops
    id_to_token: object  # callable id -> token string or None


_REPLAYS: "weakref.WeakKeyDictionary[object, _DecoderReplay | bool]" = weakref.WeakKeyDictionary()


def _decoder_replay(tokenizer) -> _DecoderReplay | None:
    """The tokenizer's replay plan (None: not replayable), built once per tokenizer object."""
    try:
        if tokenizer in _REPLAYS:
            return _REPLAYS[tokenizer] or None
    except TypeError:  # unhashable or not weak-referenceable: build it every time
        return _build_decoder_replay(tokenizer)
    replay = _build_decoder_replay(tokenizer)
    _REPLAYS[tokenizer] = replay or False
    return replay


def _build_decoder_replay(tokenizer) -> _DecoderReplay | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        return None
    try:
        decoder_config = json.loads(backend.decoder.__getstate__())
    except Exception:  # noqa: BLE001 - any failure only disables the fast path
        return None
    steps = _flatten_decoder(decoder_config)
    if steps is None or not all(step.get("type") in _REPLAYABLE for step in steps):
        return None
    skipped = frozenset(
        token_id for token_id, added in backend.get_added_tokens_decoder().items() if added.special
    )
    return _DecoderReplay(steps=steps, skipped_ids=skipped, id_to_token=backend.id_to_token)


def _flatten_decoder(config: dict) -> list[dict] | None:
    if config.get("type") == "Sequence":
        flat: list[dict] = []
        for inner in config.get("decoders", []):
            inner_steps = _flatten_decoder(inner)
            if inner_steps is None:
                return None
            flat.extend(inner_steps)
        return flat
    return [config]


_REPLAYABLE = {"ByteLevel", "ByteFallback", "Replace", "Fuse", "Strip", "Metaspace"}


def _replayed_decoder_spans(tokenizer, ids: list[int], text: str) -> list[Span] | None:
    """Spans from per-token bytes, or None when the replay does not reproduce ``text``."""
    replay = _decoder_replay(tokenizer)
    if replay is None:
        return None
    kept_positions = []
    kept_tokens = []
    for position, token_id in enumerate(ids):
        if token_id in replay.skipped_ids:
            continue
        token = replay.id_to_token(token_id)
        if token is None:  # out of vocabulary: decode drops it too
            continue
        kept_positions.append(position)
        kept_tokens.append(token)
    pieces = _replay_pieces(replay.steps, kept_tokens)
    if pieces is None:
        return None
    chunks = _utf8_chunks_per_piece(pieces)
    if "".join(chunks) != text:
        return None
    spans: list[Span] = []
    cursor = 0
    chunk_of_position = dict(zip(kept_positions, chunks))
    for position in range(len(ids)):
        width = len(chunk_of_position.get(position, ""))
        spans.append((cursor, cursor + width))
        cursor += width
    return spans


def _replay_pieces(steps: list[dict], tokens: list[str]) -> list[bytes] | None:
    """Apply the decoder steps to each token separately; each result is that token's bytes.

    Pieces are ``str`` until a byte-producing step (ByteLevel, ByteFallback) turns them into
    ``bytes``. ``Fuse`` only matters to a later ``Strip``, which then strips the joined
    string's ends instead of every piece's.
    """
    pieces: list[str | bytes] = list(tokens)
    fused = False
    for step in steps:
        kind = step["type"]
        if kind == "ByteLevel":
            pieces = [_byte_level_bytes(piece) for piece in pieces]
            if any(piece is None for piece in pieces):
                return None
            fused = True  # the real decoder joins everything into one string here
        elif kind == "ByteFallback":
            pieces = _byte_fallback(pieces)
        elif kind == "Replace":
            pattern = step.get("pattern", {})
            if "String" not in pattern:
                return None  # regex patterns are not replayed
            pieces = [_replace(piece, pattern["String"], step.get("content", "")) for piece in pieces]
        elif kind == "Fuse":
            fused = True
        elif kind == "Strip":
            pieces = _strip(pieces, step["content"], step.get("start", 0), step.get("stop", 0), fused)
        elif kind == "Metaspace":
            pieces = _metaspace(pieces, step)
            if pieces is None:
                return None
        else:
            return None
    return [piece if isinstance(piece, bytes) else piece.encode("utf-8") for piece in pieces]


def _byte_level_bytes(piece: str | bytes) -> bytes | None:
    if isinstance(piece, bytes):
        return None
    char_to_byte = _byte_level_char_to_byte()
    try:
        return bytes(char_to_byte[char] for char in piece)
    except KeyError:
        # The real decoder keeps such a token's UTF-8 bytes as they are (added tokens).
        return piece.encode("utf-8")


def _byte_fallback(pieces: list) -> list:
    """``<0xNN>`` pieces become their byte; like tokenizers' ByteFallback decoder, a run of
    consecutive byte pieces that is not valid UTF-8 as a whole becomes one U+FFFD per byte."""
    result = list(pieces)
    run_start = None
    for index in range(len(pieces) + 1):
        match = None
        if index < len(pieces) and isinstance(pieces[index], str):
            match = _BYTE_FALLBACK_PIECE.match(pieces[index])
        if match:
            result[index] = bytes([int(match.group(1), 16)])
            if run_start is None:
                run_start = index
            continue
        if run_start is not None:
            run = result[run_start:index]
            try:
                b"".join(run).decode("utf-8")
            except UnicodeDecodeError:
                result[run_start:index] = ["\ufffd"] * len(run)
            run_start = None
    return result


def _replace(piece: str | bytes, pattern: str, content: str) -> str | bytes:
    if isinstance(piece, bytes):
        return piece.replace(pattern.encode("utf-8"), content.encode("utf-8"))
    return piece.replace(pattern, content)


def _strip(pieces: list, content: str, start: int, stop: int, fused: bool) -> list:
    """Strip up to ``start`` leading / ``stop`` trailing ``content`` chars.

    Per piece, or across the pieces' concatenation once they have been fused.
    """
    pieces = list(pieces)
    if not fused:
        return [_strip_one(piece, content, start, stop) for piece in pieces]
    budget = start
    for index, piece in enumerate(pieces):
        if budget == 0:
            break
        stripped = _strip_one(piece, content, budget, 0)
        budget -= _count_removed(piece, stripped, content)
        pieces[index] = stripped
        if len(stripped):
            break
    budget = stop
    for index in range(len(pieces) - 1, -1, -1):
        if budget == 0:
            break
        piece = pieces[index]
        stripped = _strip_one(piece, content, 0, budget)
        budget -= _count_removed(piece, stripped, content)
        pieces[index] = stripped
        if len(stripped):
            break
    return pieces


def _strip_one(piece: str | bytes, content: str, start: int, stop: int) -> str | bytes:
    unit = content.encode("utf-8") if isinstance(piece, bytes) else content
    for _ in range(start):
        if piece.startswith(unit):
            piece = piece[len(unit):]
        else:
            break
    for _ in range(stop):
        if piece.endswith(unit) and len(piece):
            piece = piece[: len(piece) - len(unit)]
        else:
            break
    return piece


def _count_removed(before, after, content: str) -> int:
    unit = content.encode("utf-8") if isinstance(before, bytes) else content
    return (len(before) - len(after)) // max(len(unit), 1)


def _metaspace(pieces: list, step: dict) -> list | None:
    """Metaspace decoder: replacement char -> space; first token loses one leading space.

    Only replayed on ``str`` pieces; anything else defers to the generic path.
    """
    replacement = step.get("replacement", "▁")
    scheme = step.get("prepend_scheme")
    if scheme is None:
        scheme = "always" if step.get("add_prefix_space", True) else "never"
    result = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, bytes):
            return None
        piece = piece.replace(replacement, " ")
        if index == 0 and scheme != "never" and piece.startswith(" "):
            piece = piece[1:]
        result.append(piece)
    return result


def _utf8_chunks_per_piece(pieces: list[bytes]) -> list[str]:
    """Decode the concatenated bytes incrementally; chunk i = chars completed by piece i.

    Python's UTF-8 decoder with ``errors="replace"`` substitutes U+FFFD for maximal invalid
    subparts, as Rust's ``String::from_utf8_lossy`` does; the caller still checks the result
    against ``decode``. Bytes left unfinished at the end are flushed into the last piece that
    had bytes.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chunks = [decoder.decode(piece, final=False) for piece in pieces]
    tail = decoder.decode(b"", final=True)
    if tail:
        last_with_bytes = max((i for i, piece in enumerate(pieces) if piece), default=None)
        if last_with_bytes is None:
            return chunks + [tail]  # impossible in practice; fails the text check
        chunks[last_with_bytes] += tail
    return chunks


# ---------------------------------------------------------------------------------------------
# Generic path: decode every prefix


def _prefix_decoding_spans(tokenizer, ids: list[int], text: str) -> list[Span]:
    prefixes = [ids[: end + 1] for end in range(len(ids))]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoded = backend.decode_batch(prefixes, skip_special_tokens=True)
    else:
        decoded = [
            tokenizer.decode(prefix, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for prefix in prefixes
        ]
    spans: list[Span] = []
    cursor = 0
    for index, prefix_text in enumerate(decoded):
        end = len(text) if index == len(ids) - 1 else _agreed_length(prefix_text, text)
        end = min(max(end, cursor), len(text))
        spans.append((cursor, end))
        cursor = end
    return spans


def _agreed_length(prefix_text: str, text: str) -> int:
    """Length of the longest prefix of ``text`` that ``prefix_text`` starts with.

    A trailing U+FFFD in ``prefix_text`` is usually a character whose remaining bytes come in
    later tokens; it agrees with ``text`` only if ``text`` really has U+FFFD there.
    """
    if text.startswith(prefix_text):
        return len(prefix_text)
    trimmed = prefix_text.rstrip("\ufffd")
    if text.startswith(trimmed):
        return len(trimmed)
    low, high = 0, min(len(prefix_text), len(text))  # binary search on startswith
    while low < high:
        middle = (low + high + 1) // 2
        if text.startswith(prefix_text[:middle]):
            low = middle
        else:
            high = middle - 1
    return low
