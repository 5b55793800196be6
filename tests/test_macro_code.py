"""The ``code`` termination rule (docs/method.md "Termination rules") on modern Python syntax.

LM-token offsets come from simple regex "tokenizers" written here (spans that cover the
text contiguously), so the tests do not depend on a real LM tokenizer.
"""

from __future__ import annotations

import random
import re
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marlhf_cli.macro import TerminationRule, code_lengths, fixed_lengths, segment_lengths

BIG = 1000  # a cutoff that never splits a statement


def word_spans(text: str) -> list[tuple[int, int]]:
    """One token per word or punctuation mark, leading whitespace attached (GPT-2 style);
    trailing whitespace at the end is a whitespace-only token."""
    spans = [m.span() for m in re.finditer(r"\s*(\w+|[^\w\s])|\s+", text)]
    assert "".join(text[a:b] for a, b in spans) == text
    return spans


def split_whitespace_spans(text: str) -> list[tuple[int, int]]:
    """Whitespace runs are tokens of their own."""
    spans = [m.span() for m in re.finditer(r"\w+|\s+|[^\w\s]", text)]
    assert "".join(text[a:b] for a, b in spans) == text
    return spans


def random_spans(text: str, seed: int, max_width: int = 4) -> list[tuple[int, int]]:
    """Arbitrary contiguous chunks: tokens that straddle statement boundaries."""
    rng = random.Random(seed)
    spans, start = [], 0
    while start < len(text):
        end = min(len(text), start + rng.randint(1, max_width))
        spans.append((start, end))
        start = end
    return spans


def segments(text: str, cutoff: int = BIG, spans=word_spans) -> list[str]:
    """The rule's segments as stripped source strings."""
    offsets = spans(text)
    lengths = code_lengths(text, offsets, cutoff)
    assert lengths is not None, "expected the text to parse"
    assert all(x >= 1 for x in lengths) and sum(lengths) == len(offsets)
    assert max(lengths, default=0) <= cutoff
    out, index = [], 0
    for length in lengths:
        out.append(text[offsets[index][0] : offsets[index + length - 1][1]].strip())
        index += length
    return out


def src(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n")


# ---------------------------------------------------------------------------------------
# Statements and headers are units


def test_simple_statements_and_headers():
    code = src(
        """
        import os
        def f(x):
            y = x + 1
            for i in range(y):
                print(i)
            return y
        """
    )
    assert segments(code) == [
        "import os",
        "def f(x):",
        "y = x + 1",
        "for i in range(y):",
        "print(i)",
        "return y",
    ]


def test_walrus():
    code = "if (n := len(a)) > 10:\n    print(n)\n"
    assert segments(code) == ["if (n := len(a)) > 10:", "print(n)"]


def test_match_case():
    code = src(
        """
        match command:
            case [x, *rest] if x > 0:
                go(x)
            case {"k": v}:
                pass
            case _:
                stop()
        """
    )
    assert segments(code) == [
        "match command:",
        "case [x, *rest] if x > 0:",
        "go(x)",
        'case {"k": v}:',
        "pass",
        "case _:",
        "stop()",
    ]


def test_f_strings():
    code = 'name = f"{user!r:>{width}} has {len(items)} items"\nprint(name)\n'
    assert segments(code) == ['name = f"{user!r:>{width}} has {len(items)} items"', "print(name)"]


def test_decorators_and_class():
    code = src(
        """
        @dataclass(frozen=True)
        @ other . thing
        class Point(Base, metaclass=Meta):
            x: int = 0
        """
    )
    assert segments(code) == [
        "@dataclass(frozen=True)",
        "@ other . thing",
        "class Point(Base, metaclass=Meta):",
        "x: int = 0",
    ]


def test_positional_only_parameters():
    code = "def f(a, b, /, c, *, d=1, **kw) -> int:\n    return a\n"
    assert segments(code) == ["def f(a, b, /, c, *, d=1, **kw) -> int:", "return a"]


def test_parenthesised_with():
    code = src(
        """
        with (
            open(a) as fa,
            open(b) as fb,
        ):
            pass
        """
    )
    assert segments(code) == ["with (\n    open(a) as fa,\n    open(b) as fb,\n):", "pass"]


def test_try_except_star_else_finally():
    code = src(
        """
        try:
            run()
        except* ValueError as group:
            handle(group)
        except* (TypeError, KeyError):
            pass
        """
    )
    assert segments(code) == [
        "try:",
        "run()",
        "except* ValueError as group:",
        "handle(group)",
        "except* (TypeError, KeyError):",
        "pass",
    ]
    code = src(
        """
        try:
            run()
        except Exception:
            pass
        else:
            ok()
        finally:
            done()
        """
    )
    assert segments(code) == ["try:", "run()", "except Exception:", "pass", "else:", "ok()", "finally:", "done()"]


def test_if_elif_else_while_async():
    code = src(
        """
        async def main():
            while True:
                if a:
                    break
                elif b:
                    continue
                else:
                    await go()
            async with lock:
                pass
        """
    )
    assert segments(code) == [
        "async def main():",
        "while True:",
        "if a:",
        "break",
        "elif b:",
        "continue",
        "else:",
        "await go()",
        "async with lock:",
        "pass",
    ]


def test_same_line_bodies_semicolons_and_comments():
    code = "x = 1; y = 2\nif x: return_value = y  # trailing\n# a full-line comment\nz = 3\n"
    assert segments(code) == [
        "x = 1;",
        "y = 2",
        "if x:",
        "return_value = y  # trailing",
        "# a full-line comment",
        "z = 3",
    ]


def test_type_hints_lambda_comprehension_and_multiline_string():
    code = src(
        '''
        def g(xs: list[int]) -> dict[str, int]:
            """Doc
            string."""
            key = lambda kv: (kv[1], kv[0])
            return {str(x): x for x in xs if x}
        '''
    )
    assert segments(code) == [
        "def g(xs: list[int]) -> dict[str, int]:",
        '"""Doc\n    string."""',
        "key = lambda kv: (kv[1], kv[0])",
        "return {str(x): x for x in xs if x}",
    ]


def test_non_ascii_source_maps_characters_not_bytes():
    # ast reports UTF-8 byte columns; the rule must convert them to characters
    code = "é = 'üü'; b = 2\nprint(é)\n"
    assert segments(code) == ["é = 'üü';", "b = 2", "print(é)"]


def test_crlf_and_lone_cr_line_breaks():
    assert segments("x = 1\r\ny = 2\r\n") == ["x = 1", "y = 2"]
    assert segments("x = 1\ry = 2\r") == ["x = 1", "y = 2"]


# ---------------------------------------------------------------------------------------
# Splitting long units


def test_long_statement_splits_at_expression_boundaries():
    code = "x = compute(alpha, beta) + other(gamma)"
    # 13 tokens: x = compute ( alpha , beta ) + other ( gamma )
    assert segments(code, cutoff=5) == ["x =", "compute(alpha,", "beta) +", "other(gamma)"]
    assert segments(code, cutoff=13) == [code]


def test_long_header_splits_at_parameters():
    code = "def f(a, b, /, c, *, d=1, **kw) -> int:\n    return a\n"
    # header sub-expressions: the parameters, the default 1 and the annotation, packed
    # greedily into pieces of <= 6 tokens; the body is its own unit
    assert segments(code, cutoff=6) == ["def f(a,", "b, /,", "c, *, d=", "1, **", "kw) -> int:", "return a"]


def test_long_decorator_and_case_split_at_their_expressions():
    code = '@app.route("/x", methods=["GET", "POST"])\ndef f():\n    pass\n'
    assert segments(code, cutoff=5) == ['@app.route(', '"/x",', "methods=[", '"GET",', '"POST"])', "def f():", "pass"]
    code = "match x:\n    case Point(x=0, y=0) | Point(x=1, y=1) if x.valid:\n        pass\n"
    assert segments(code, cutoff=6) == [
        "match x:", "case Point(x=", "0, y=", "0) |", "Point(x=", "1, y=", "1) if", "x.valid:", "pass"
    ]


def test_leaf_longer_than_cutoff_is_cut_evenly():
    code = 's = "one two three four five six seven eight nine ten"\n'
    parts = segments(code, cutoff=4)
    assert parts[0] == "s ="
    assert " ".join(parts[1:]) == code.strip()[4:]
    # 13 tokens after "s =" (quote, ten words, quote, newline) -> 4 even chunks, and the
    # trailing newline token is never a segment of its own
    assert code_lengths(code, word_spans(code), 4) == [2, 3, 3, 4, 3]
    assert all(parts)


def test_whitespace_tokens_join_the_preceding_segment():
    code = "x = 1\n\n\ny = 2\n"
    offsets = split_whitespace_spans(code)
    lengths = code_lengths(code, offsets, BIG)
    # tokens: x, ' ', =, ' ', 1, '\n\n\n', y, ' ', =, ' ', 2, '\n'
    assert lengths == [6, 6]


def test_leading_whitespace_and_comments_join_the_first_segment():
    code = "\n\n# header\nx = 1\n"
    assert segments(code) == ["# header", "x = 1"]
    offsets = split_whitespace_spans(code)
    assert code_lengths(code, offsets, BIG)[0] >= 2  # the leading newlines are not alone


def test_token_straddling_a_boundary_belongs_to_its_first_character():
    code = "x = 1\ny = 2\n"
    # tokens: "x = 1", "\ny", " = 2\n"  -> "\ny" starts (first non-space) at y
    offsets = [(0, 5), (5, 7), (7, 12)]
    assert code_lengths(code, offsets, BIG) == [1, 2]
    # tokens: "x = 1\ny", " = 2\n"  -> the first token starts at x: one unit absorbs y
    assert code_lengths(code, [(0, 7), (7, 12)], BIG) == [1, 1]


# ---------------------------------------------------------------------------------------
# Text that is not Python


@pytest.mark.parametrize(
    "code",
    [
        "def f(:\n    pass\n",
        "x = (1,\n",  # truncated response
        "if x\n    pass\n",
        "  indented = 1\n",
        "print 'python 2'\n",
        "x = 1\x00\n",
        "Here is the code:\n```python\nx = 1\n```\n",
        "(" * 300 + ")" * 300,  # too many nested parentheses
        "-" * 5000 + "1",  # RecursionError / MemoryError inside the parser
        "1+" * 3000 + "1",
    ],
)
def test_unparseable_text_returns_none_and_dispatcher_falls_back(code):
    offsets = random_spans(code, seed=1)
    assert code_lengths(code, offsets, 10) is None
    rule = TerminationRule("code", n=3)
    lengths, fell_back = segment_lengths(rule, len(offsets), text=code, offsets=offsets)
    assert fell_back
    assert lengths == fixed_lengths(len(offsets), 3)


def test_empty_input():
    assert code_lengths("", [], 10) == []
    assert code_lengths("\n", [(0, 1)], 10) == [1]


def test_bad_cutoff():
    with pytest.raises(ValueError):
        code_lengths("x = 1", [(0, 5)], 0)


# ---------------------------------------------------------------------------------------
# Properties over programs x tokenizations x cutoffs

PROGRAMS = [
    src(
        """
        import sys
        from collections import defaultdict as dd

        def solve(n: int, /, *args, k=3, **kw) -> int:
            '''Count things.'''
            total = 0
            for i, (a, b) in enumerate(zip(args, args[1:])):
                if (d := a - b) > k or not total: total += d
                elif d == 0:
                    continue
                else:
                    total -= sum(x * x for x in range(d) if x % 2)
            return total

        @decorate(level=2)
        class Thing(Base):
            value: dict[str, list[int]] = {}

            async def run(self):
                async with self.lock as l, other():
                    await self.step(f"{self.value!r} {len(self.value):>5}")

        match sys.argv[1:]:
            case ["go", *rest] if rest:
                print(solve(len(rest), *map(int, rest)))
            case [("a" | "b") as x, {"k": v, **others}]:
                print(x, v, others)
            case _:
                pass

        try:
            raise ExceptionGroup("g", [ValueError(1)])
        except* ValueError as eg:
            print("v", eg); print("done")
        finally:
            x = lambda a, b=2: (a, b)
        """
    ),
    src(
        """
        n = int(input())
        a = list(map(int, input().split()))
        print(max(a) - min(a) if n > 1 else 0)
        """
    ),
    src(
        """
        with (open("a") as f, open("b") as g):
            data = [line.strip() for line in f if line and not line.startswith("#")]
        while data: data.pop()  # drain
        """
    ),
]


@settings(max_examples=120, deadline=None)
@given(
    program=st.sampled_from(PROGRAMS),
    cutoff=st.integers(1, 15),
    tokenization=st.one_of(
        st.just("words"), st.just("whitespace"), st.integers(0, 10**6)
    ),
)
def test_lengths_are_valid_for_any_tokenization(program, cutoff, tokenization):
    if tokenization == "words":
        offsets = word_spans(program)
    elif tokenization == "whitespace":
        offsets = split_whitespace_spans(program)
    else:
        offsets = random_spans(program, tokenization, max_width=6)
    lengths = code_lengths(program, offsets, cutoff)
    assert lengths is not None
    assert all(x >= 1 for x in lengths)
    assert sum(lengths) == len(offsets)
    assert max(lengths) <= cutoff


@settings(max_examples=40, deadline=None)
@given(program=st.sampled_from(PROGRAMS), cutoff=st.integers(1, 30))
def test_statement_boundaries_survive_any_cutoff(program, cutoff):
    """Splitting only adds boundaries: every statement boundary found with no cutoff is
    still a boundary with a small one."""
    offsets = word_spans(program)

    def boundaries(lengths):
        out, total = set(), 0
        for x in lengths:
            total += x
            out.add(total)
        return out

    coarse = boundaries(code_lengths(program, offsets, BIG))
    fine = boundaries(code_lengths(program, offsets, cutoff))
    assert coarse <= fine


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="abc ():=\n\t,.+#@'\"*", max_size=50), seed=st.integers(0, 1000))
def test_never_raises_on_arbitrary_text(text, seed):
    offsets = random_spans(text, seed)
    lengths = code_lengths(text, offsets, 4)
    if lengths is not None:
        assert all(x >= 1 for x in lengths) and sum(lengths) == len(offsets)
