"""Read rows from a local ``.jsonl``, ``.json`` or ``.parquet`` file, each with its line number.

File-level problems always raise :func:`~marlhf_cli.errors.bad_input` (one line naming the
file, the line and, where it can be told, the field), whatever ``strict`` says, because they
mean the file is not what the user thinks it is:

* the file does not exist, or is a directory, or has an unsupported suffix;
* a line holds bytes that are not UTF-8 (the message names the line, the byte column and the
  field whose string holds them);
* a line is not valid JSON (a truncated or hand-edited line);
* a ``.json`` file that is neither one JSON array/object nor JSON Lines.

Rows come back as they were decoded (normally dicts); judging their content is the
adapters' job. For Parquet the "line" is the 1-based row number. Blank lines in JSON Lines
are not rows and are passed over.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from ..errors import bad_input

SUFFIXES = (".jsonl", ".json", ".parquet")

Row = tuple[int, Any]


def read_rows(path: str | Path) -> Iterator[Row]:
    """Yield ``(line, row)`` pairs from ``path``; raise a one-line user error for a bad file."""
    path = Path(path)
    if not path.exists():
        raise bad_input("file not found", path)
    if path.is_dir():
        raise bad_input("is a directory, expected a .jsonl, .json or .parquet file", path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(path, path.read_bytes())
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    raise bad_input(f"unsupported file type '{suffix or '(none)'}': expected one of {', '.join(SUFFIXES)}", path)


def is_data_file(name: str) -> bool:
    """Whether a ``--dataset`` value names a local data file rather than a registered dataset."""
    return name.lower().endswith(SUFFIXES) or Path(name).exists()


def _read_jsonl(path: Path, data: bytes) -> Iterator[Row]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte-order mark is not content
        text = _decode(path, number, raw)
        if not text.strip():
            continue
        try:
            yield number, json.loads(text)
        except json.JSONDecodeError as err:
            raise bad_input(f"malformed JSON: {err.msg} (column {err.colno})", path, number) from None


def _decode(path: Path, line: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        field = _field_with_bad_bytes(raw)
        message = f"invalid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
        raise bad_input(message, path, line, field) from None


def _field_with_bad_bytes(raw: bytes) -> str | None:
    """Name the field whose string carries the undecodable bytes, when the line parses."""
    try:
        row = json.loads(raw.decode("utf-8", errors="surrogateescape"))
    except ValueError:
        return None
    return _find_surrogates(row, None)


def _find_surrogates(value: Any, label: str | None) -> str | None:
    if isinstance(value, str):
        return label if any("\udc80" <= ch <= "\udcff" for ch in value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _find_surrogates(item, f"{label}.{key}" if label else str(key))
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _find_surrogates(item, f"{label}[{index}]" if label else f"[{index}]")
            if found:
                return found
    return None


def _read_json(path: Path) -> Iterator[Row]:
    """A JSON array of rows (with each row's line number), an object holding one, or JSONL."""
    data = path.read_bytes()
    text = "\n".join(_decode(path, n, raw) for n, raw in enumerate(data.split(b"\n"), start=1))
    text = text.lstrip("\ufeff")
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "[":
        return _read_json_array(path, text, start)
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # several documents, one per line: JSON Lines named .json
            return _read_jsonl(path, data)
        raise bad_input(f"malformed JSON: {err.msg} (column {err.colno})", path, err.lineno) from None
    return iter(_rows_of_object(path, whole))


def _rows_of_object(path: Path, whole: Any) -> list[Row]:
    """``{"data": [...]}``-style files: the one list value (line numbers are unknown)."""
    if isinstance(whole, dict):
        lists = [v for v in whole.values() if isinstance(v, list)]
        if len(lists) == 1:
            return [(i, row) for i, row in enumerate(lists[0], start=1)]
        if lists == [] and whole:
            return [(1, whole)]  # a single row
    raise bad_input("expected a JSON array of rows, an object holding one list of rows, or JSON Lines", path)


def _read_json_array(path: Path, text: str, start: int) -> Iterator[Row]:
    decoder = json.JSONDecoder()
    pos = _skip_space(text, start + 1)
    if text[pos : pos + 1] == "]":
        return
    while True:
        line = text.count("\n", 0, pos) + 1
        try:
            row, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise bad_input(f"malformed JSON: {err.msg} (column {err.colno})", path, err.lineno) from None
        yield line, row
        pos = _skip_space(text, pos)
        char = text[pos : pos + 1]
        if char == "]":
            if text[pos + 1 :].strip():
                raise bad_input("malformed JSON: extra data after the array", path, text.count("\n", 0, pos) + 1)
            return
        if char != ",":
            lineno = text.count("\n", 0, pos) + 1
            raise bad_input("malformed JSON: expected ',' or ']' between rows", path, lineno)
        pos = _skip_space(text, pos + 1)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _read_parquet(path: Path) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        reason = f"{type(err).__name__}: {str(err).splitlines()[0]}"
        raise bad_input(f"not a readable Parquet file ({reason})", path) from None
    for number, row in enumerate(table.to_pylist(), start=1):
        yield number, row
