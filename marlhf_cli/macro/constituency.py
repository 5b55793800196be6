"""The ``parsing`` rule's tree walk: constituency trees and token offsets in, segment lengths out.

Backend independent and parser free (:mod:`.parsing` runs the parsers and turns their output
into the :class:`Node` trees used here), so the rule itself can be read, and tested on
hand-built trees, without any model.

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
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import NamedTuple

Span = tuple[int, int]

DEFAULT_CUTOFF = 5

_NON_SPACE = re.compile(r"\S")


class Node(NamedTuple):
    """A constituent. Leaves have no children and ``word`` = index into the word spans."""

    label: str
    children: tuple["Node", ...] = ()
    word: int | None = None


# ---------------------------------------------------------------------------------------------
# The tree walk


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
# Trees from bracketed strings and from parsers' trees


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
