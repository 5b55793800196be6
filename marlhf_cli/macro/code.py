"""The ``code`` termination rule: Python statements as macro actions.

docs/method.md "Termination rules": parse the response as Python; each simple statement and each
compound-statement header is one segment, split further at expression boundaries when it
is longer than C_code LM tokens. The paper's implementation used RedBaron, which cannot
parse walrus, ``match``, positional-only parameters, parenthesised ``with`` or ``except*``;
this module uses the standard library (``ast`` for the tree, ``tokenize`` for logical lines,
comments and token boundaries), which parses whatever the running interpreter parses.

How a response becomes segments
-------------------------------
1. *Units.* A unit starts at: the first token of every logical line (this covers simple
   statements, compound headers such as ``def f(x):``, ``for ...:``, ``with (...):``,
   ``match``/``case``, decorators, ``try:``/``except ...:``/``else:``/``elif``/``finally:``
   and ``class``), the start of every statement node (a body on the same line as its header,
   ``if x: return y``, and statements separated by ``;``), and every comment that stands on
   its own line. A unit runs to the next unit start, so a compound statement's unit is its
   header only; its body statements are units of their own.
2. *Token mapping.* LM tokens are mapped through their character ``offsets`` in ``text``
   (never by re-tokenising): a token belongs to the unit that contains its first
   non-whitespace character; a whitespace-only token joins the preceding segment (the first
   segment if nothing precedes it).
3. *Expression split* (when a unit has more than ``cutoff`` LM tokens). The unit's direct
   sub-expressions (for a header: its test, target, iterator, parameters, bases, ...; never
   its body) cut the unit into pieces at their starts; the text before the first
   sub-expression (a keyword, ``@``, ``(``) stays with it, and the text after a
   sub-expression (an operator, a comma, ``):``) stays with it too. Consecutive pieces are
   packed greedily into segments of at most ``cutoff`` tokens; a piece that alone exceeds
   ``cutoff`` is split the same way by *its* sub-expressions. This is the depth-first
   "expand nodes larger than C" scheme of the parsing rule, with sibling packing so that a
   long argument list becomes a few segments of up to C tokens instead of one per argument.
   f-strings are not descended into (their inner positions are unreliable before Python
   3.12); they are leaves.
4. *Token split.* A segment still longer than ``cutoff`` (a long string, a leaf expression
   with its trailing punctuation) is cut into the fewest chunks of at most ``cutoff`` LM
   tokens, as even as possible, each cut preferably at an LM token that starts a Python
   token and never before a whitespace-only token unless unavoidable (a single Python token
   longer than ``cutoff``, such as a long string, is cut inside). Hence every segment has at
   most ``cutoff`` tokens.

The function returns None when the text is not Python (SyntaxError, null bytes, nesting too
deep, tokenizer error): the dispatcher then falls back to ``fixed`` and counts it.
"""

from __future__ import annotations

import ast
import bisect
import io
import re
import tokenize
from collections.abc import Iterable, Sequence

__all__ = ["DEFAULT_CODE_CUTOFF", "code_lengths"]

# C_code. The paper does not state a value for the statement rule's cutoff; 10 matches the
# paper's fixed-n default for code (n=10, docs/method.md "Termination rules"), so both code rules give segments of
# comparable granularity.
DEFAULT_CODE_CUTOFF = 10

_PARSE_ERRORS = (
    SyntaxError,  # includes IndentationError / TabError
    ValueError,  # null bytes in the source (3.11)
    RecursionError,
    MemoryError,
    OverflowError,
    tokenize.TokenError,
)
_NON_TOKENS = {
    tokenize.NEWLINE,
    tokenize.NL,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}
# Fields whose expressions belong to other units (decorators are units of their own).
_OTHER_UNIT_FIELDS = {"decorator_list"}
_UNIT_CONTAINERS = (ast.stmt, ast.excepthandler, ast.match_case)


def code_lengths(
    text: str,
    offsets: Sequence[tuple[int, int]],
    cutoff: int = DEFAULT_CODE_CUTOFF,
) -> list[int] | None:
    """Segment lengths (in LM tokens) for Python source ``text``, or None if it does not parse.

    ``offsets[i]`` is the character span ``(start, end)`` of LM token ``i`` in ``text``.
    The result has lengths >= 1, each <= ``cutoff``, summing to ``len(offsets)``.
    """
    if isinstance(cutoff, bool) or not isinstance(cutoff, int) or cutoff < 1:
        raise ValueError(f"cutoff must be an int >= 1, got {cutoff!r}")
    n_tokens = len(offsets)
    if n_tokens == 0:
        return []
    # A lone "\r" is a line break for the compiler but not for tokenize over a StringIO;
    # replacing it by "\n" keeps every character index and makes both agree.
    source = re.sub(r"\r(?!\n)", "\n", text)
    try:
        tree = ast.parse(source)
        py_tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except _PARSE_ERRORS:
        return None

    chars = _CharPositions(source)
    tokens = _LmTokens(text, offsets)

    line_starts, comment_starts = _logical_line_and_comment_starts(py_tokens, chars)
    owners = _unit_owners(tree, chars, line_starts)
    unit_chars = sorted(set(line_starts) | set(comment_starts) | set(owners))
    unit_tokens = [tokens.first_at_or_after(c) for c in unit_chars]

    cuts = {t for t in unit_tokens if 0 < t < n_tokens}
    bounds = sorted(cuts | {0, n_tokens})
    # Step 3: expression split of every unit that is too long.
    work: list[tuple[int, int, list[ast.AST]]] = []
    owner_at_token = {}
    for char, token in zip(unit_chars, unit_tokens):
        if char in owners:
            owner_at_token.setdefault(token, owners[char])
    for start, end in zip(bounds, bounds[1:]):
        if end - start > cutoff and start in owner_at_token:
            work.append((start, end, owner_at_token[start]))
    while work:
        start, end, children = work.pop()
        for sub in _split_by_children(start, end, children, cutoff, tokens, chars, cuts):
            work.append(sub)

    # Whitespace-only tokens before the first anchored token join the first segment.
    first_anchored = tokens.first_at_or_after(0)
    cuts = {t for t in cuts if t > first_anchored}

    # Step 4: token split of whatever is still too long.
    py_token_starts = {
        chars.char(tok.start) for tok in py_tokens if tok.type not in _NON_TOKENS
    }
    clean = [a is not None and a in py_token_starts for a in tokens.anchors]
    blank = [a is None for a in tokens.anchors]
    bounds = sorted(cuts | {0, n_tokens})
    for start, end in zip(bounds, bounds[1:]):
        cuts.update(_chunk(start, end, cutoff, clean, blank))

    bounds = sorted(cuts | {0, n_tokens})
    return [b - a for a, b in zip(bounds, bounds[1:])]


class _CharPositions:
    """Convert (line, column) positions of ``ast`` (UTF-8 byte columns) and ``tokenize``
    (character columns) into character offsets of the source."""

    def __init__(self, source: str) -> None:
        self.lines = source.split("\n")
        self.line_offsets = [0]
        for line in self.lines:
            self.line_offsets.append(self.line_offsets[-1] + len(line) + 1)
        self.source_length = len(source)

    def char(self, position: tuple[int, int]) -> int:
        """tokenize position (1-based line, character column) -> character offset."""
        line, col = position
        if line - 1 >= len(self.lines):
            return self.source_length
        return min(self.line_offsets[line - 1] + col, self.source_length)

    def from_ast(self, line: int, byte_col: int) -> int:
        """ast position (1-based line, UTF-8 byte column) -> character offset."""
        if line - 1 >= len(self.lines):
            return self.source_length
        text = self.lines[line - 1]
        col = len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))
        return min(self.line_offsets[line - 1] + col, self.source_length)

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.from_ast(node.lineno, node.col_offset)
        end = self.from_ast(node.end_lineno, node.end_col_offset)
        return start, max(start, end)


class _LmTokens:
    """The LM tokens' anchors: the character index of each token's first non-whitespace
    character, or None for a whitespace-only (or empty) token."""

    def __init__(self, text: str, offsets: Sequence[tuple[int, int]]) -> None:
        self.anchors: list[int | None] = []
        for start, end in offsets:
            start, end = max(0, int(start)), min(len(text), int(end))
            anchor = None
            for i in range(start, end):
                if not text[i].isspace():
                    anchor = i
                    break
            self.anchors.append(anchor)
        # For bisecting: anchored tokens in order, with a running maximum so that even
        # non-monotone offsets give a sorted key.
        self._keys: list[int] = []
        self._indices: list[int] = []
        running = -1
        for index, anchor in enumerate(self.anchors):
            if anchor is not None:
                running = max(running, anchor)
                self._keys.append(running)
                self._indices.append(index)
        self.count = len(self.anchors)

    def first_at_or_after(self, char: int) -> int:
        """Index of the first anchored token whose anchor is >= ``char``: the token where a
        unit starting at ``char`` begins (``count`` if there is none)."""
        k = bisect.bisect_left(self._keys, char)
        return self._indices[k] if k < len(self._indices) else self.count


def _logical_line_and_comment_starts(
    py_tokens: Iterable[tokenize.TokenInfo], chars: _CharPositions
) -> tuple[list[int], list[int]]:
    """Character offsets of the first token of each logical line, and of each comment that
    stands on its own line (before any token of a logical line)."""
    line_starts: list[int] = []
    comment_starts: list[int] = []
    at_line_start = True
    for tok in py_tokens:
        if tok.type in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        if tok.type == tokenize.NEWLINE:
            at_line_start = True
            continue
        if tok.type == tokenize.COMMENT:
            if at_line_start:
                comment_starts.append(chars.char(tok.start))
            continue
        if at_line_start:
            line_starts.append(chars.char(tok.start))
            at_line_start = False
    return line_starts, comment_starts


def _has_position(node: ast.AST) -> bool:
    return getattr(node, "lineno", None) is not None and getattr(node, "end_lineno", None) is not None


def _sub_expressions(node: ast.AST) -> list[ast.AST]:
    """The direct sub-expressions of ``node`` that carry a source position, looking through
    position-less helper nodes (``arguments``, ``comprehension``, ``withitem``) and skipping
    statements, handlers and cases (units of their own) and decorators."""
    if isinstance(node, ast.JoinedStr):
        return []  # f-string: a leaf (inner positions are unreliable before 3.12)
    found: list[ast.AST] = []
    stack: list[ast.AST] = []
    for field, value in ast.iter_fields(node):
        if field in _OTHER_UNIT_FIELDS:
            continue
        if isinstance(value, ast.AST):
            stack.append(value)
        elif isinstance(value, list):
            stack.extend(v for v in value if isinstance(v, ast.AST))
    while stack:
        child = stack.pop()
        if isinstance(child, _UNIT_CONTAINERS):
            continue
        if _has_position(child):
            found.append(child)
        else:
            stack.extend(ast.iter_child_nodes(child))
    return found


def _unit_owners(
    tree: ast.AST, chars: _CharPositions, line_starts: list[int]
) -> dict[int, list[ast.AST]]:
    """Map a unit's start character to the expressions that may split it (step 3)."""
    owners: dict[int, list[ast.AST]] = {}

    def line_start_before(char: int) -> int:
        k = bisect.bisect_right(line_starts, char) - 1
        return line_starts[k] if k >= 0 else 0

    for node in ast.walk(tree):
        if isinstance(node, (ast.stmt, ast.excepthandler)):
            start, _ = chars.span(node)
            owners.setdefault(start, _sub_expressions(node))
            for decorator in getattr(node, "decorator_list", ()):
                # A decorator's unit starts at its "@", the first token of its logical line.
                d_start, _ = chars.span(decorator)
                owners.setdefault(line_start_before(d_start), [decorator])
        elif isinstance(node, ast.match_case):
            # match_case has no position: its unit starts at "case", the line's first token.
            parts = [node.pattern] + ([node.guard] if node.guard is not None else [])
            p_start, _ = chars.span(node.pattern)
            owners.setdefault(line_start_before(p_start), parts)
    return owners


def _split_by_children(
    start: int,
    end: int,
    children: list[ast.AST],
    cutoff: int,
    tokens: _LmTokens,
    chars: _CharPositions,
    cuts: set[int],
) -> list[tuple[int, int, list[ast.AST]]]:
    """Step 3 for one span of LM tokens [start, end): add cuts at sub-expression starts,
    packing consecutive pieces into segments of <= cutoff tokens; return the pieces that
    are still too long together with the sub-expressions that may split them further."""
    placed = sorted(
        ((tokens.first_at_or_after(chars.span(c)[0]), chars.span(c)[0], id(c), c) for c in children),
        key=lambda item: (item[0], item[1], item[2]),
    )
    placed = [(t, c) for t, _, _, c in placed if start <= t < end]
    if not placed:
        return []
    # Piece starts: ``start`` (leading keyword/punctuation glues to the first child), then
    # every later child's first token. A piece is owned by the first child starting there.
    piece_owner: dict[int, ast.AST] = {start: placed[0][1]}
    for token, child in placed[1:]:
        if token > start:
            piece_owner.setdefault(token, child)
    piece_starts = sorted(piece_owner)
    pieces = list(zip(piece_starts, piece_starts[1:] + [end]))

    too_long: list[tuple[int, int, list[ast.AST]]] = []
    group_size = 0
    for piece_start, piece_end in pieces:
        size = piece_end - piece_start
        if size > cutoff:
            if piece_start > start:
                cuts.add(piece_start)
            if piece_end < end:
                cuts.add(piece_end)
            too_long.append((piece_start, piece_end, _sub_expressions(piece_owner[piece_start])))
            group_size = 0
        elif group_size + size <= cutoff:
            group_size += size
        else:
            cuts.add(piece_start)
            group_size = size
    return too_long


def _chunk(start: int, end: int, cutoff: int, clean: list[bool], blank: list[bool]) -> list[int]:
    """Step 4: cuts that break [start, end) into the fewest chunks of <= cutoff tokens.

    Each cut is chosen inside the window that still allows the remaining chunks to fit,
    preferring, in order: an LM token that starts a Python token, then any token that is
    not whitespace-only (whitespace joins the preceding segment), then any token; ties go to
    the position closest to an even split (later on equal distance).
    """
    cuts = []
    position = start
    while end - position > cutoff:
        remaining = end - position
        chunks = -(-remaining // cutoff)  # ceil: the fewest chunks that fit
        low = max(position + 1, end - (chunks - 1) * cutoff)
        high = position + cutoff
        ideal = position + remaining / chunks

        def score(candidate: int) -> tuple:
            return (not clean[candidate], blank[candidate], abs(candidate - ideal), -candidate)

        cut = min(range(low, high + 1), key=score)
        cuts.append(cut)
        position = cut
    return cuts
