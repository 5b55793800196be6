"""Rewards written as Python functions: ``--reward py:FILE.py:FUNCTION``, TRL's convention.

The function is the user's own code, imported from its file by path (``importlib``) and run
in the training process as it is: it is *not* sandboxed (model-written programs are, by
:mod:`.sandbox`; a user's reward function is trusted like the rest of their command line).

It is called as TRL's ``GRPOTrainer`` calls its ``reward_funcs``, once per batch, with
keyword arguments that are lists with one entry per response:

* ``prompts``: the prompt texts; ``completions``: the responses (decoded, special tokens
  dropped); ``completions_ids``: each response's token ids up to and including its EOS;
* ``trainer_state``: ``None`` (marlhf has no ``transformers.TrainerState``);
* every other field of the prompt's record: the columns of a TRL file beside ``prompt``
  (``answer``, ``ground_truth``, ...), or the fields of the paper datasets' records
  (``chosen``, ``rejected``; APPS's ``question``, ``inputs``, ``outputs``, ...). A record
  without a field another record of the batch has gets ``None`` there.

A function with ``**kwargs`` receives them all; one without receives only the names in its
signature, and a name it requires that no record has is a one-line error at start-up. It
returns one number per response (a list, tuple, NumPy array or tensor); ``None`` for a
response counts as 0.0, as in TRL, where a summed reward ignores a function's ``None``.
``async def`` functions are awaited. Anything else it does wrong (an exception, a wrong
count, a string, NaN or inf) stops the command with exit code 2: the function's own
traceback, then one line naming the response it failed on (found by calling it again one
response at a time when the batch call raised).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import inspect
import math
import numbers
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import UserCodeError, UserError

PREFIX = "py:"
# the arguments every call gets, beside the records' fields (which they win over)
ARGUMENTS = ("prompts", "completions", "completions_ids", "trainer_state")


def is_function_spec(value: Any) -> bool:
    """Whether a ``--reward`` value names a Python function (``py:FILE.py:FUNCTION``)."""
    return isinstance(value, str) and value.startswith(PREFIX)


@dataclass(frozen=True)
class FunctionSpec:
    text: str  # as given: py:FILE.py:FUNCTION
    path: Path
    name: str


def parse_spec(text: str, flag: str = "--reward") -> FunctionSpec:
    """``py:FILE.py:FUNCTION`` -> its parts; a one-line error when it cannot name a function."""
    body = text[len(PREFIX) :]
    where, _, name = body.rpartition(":")
    if not where or not name.isidentifier():
        raise UserError(f"{flag} {text}: expected py:FILE.py:FUNCTION (a Python file and the name of a function in it)")
    path = Path(where).expanduser()
    if not path.exists():
        raise UserError(f"{flag} {text}: {path}: file not found")
    if not path.is_file():
        raise UserError(f"{flag} {text}: {path} is not a file")
    return FunctionSpec(text, path, name)


_MODULES: dict[tuple, Any] = {}  # each file is imported once per process (again once it changed)


def load_function(text: str, flag: str = "--reward") -> Callable[..., Any]:
    """Import the file (once per process, again after it changed) and return its callable ``FUNCTION``.

    The file's folder joins ``sys.path`` (at the end), so it can import modules beside it.
    An error while importing it shows its traceback, then one line.
    """
    spec = parse_spec(text, flag)
    path = spec.path.resolve()
    stat = path.stat()
    key = (path, stat.st_mtime_ns, stat.st_size)
    module = _MODULES.get(key)
    if module is None:
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(f"marlhf_reward_{path.stem}_{digest}", path)
        if module_spec is None or module_spec.loader is None:
            raise UserError(f"{flag} {text}: {spec.path} cannot be imported as Python (name it .py)")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module  # dataclasses and pickling look modules up there
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        try:
            module_spec.loader.exec_module(module)
        except Exception as err:  # the user's code: any exception is theirs to see
            del sys.modules[module_spec.name]
            raise UserCodeError(
                f"{flag} {text}: importing {spec.path} raised {_one_line(err)}", details=user_traceback(err)
            ) from err
        _MODULES[key] = module
    function = getattr(module, spec.name, None)
    if function is None:
        own = [name for name, value in vars(module).items()
               if callable(value) and not name.startswith("_") and getattr(value, "__module__", None) == module.__name__]  # fmt: skip
        listed = f" (its functions: {', '.join(sorted(own))})" if own else ""
        raise UserError(f"{flag} {text}: {spec.path} defines no '{spec.name}'{listed}")
    if not callable(function):
        raise UserError(f"{flag} {text}: '{spec.name}' in {spec.path} is a {type(function).__name__}, not a function")
    return function


def file_digest(text: str) -> str:
    """A hash of the function's file, so a cached result is not reused after the file changed."""
    return hashlib.sha256(parse_spec(text).path.read_bytes()).hexdigest()[:16]


def user_traceback(err: BaseException) -> str:
    """The traceback of ``err`` from the user's first frame on: marlhf's own frames (the call
    into the function, asyncio's) are left out."""
    tb = err.__traceback__
    ours = (Path(__file__).resolve(), Path(asyncio.__file__).resolve().parent, Path(importlib.__file__).resolve().parent)
    while tb is not None and tb.tb_next is not None and _inside(tb.tb_frame.f_code.co_filename, ours):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb)).rstrip("\n")


def _inside(filename: str, places: Sequence[Path]) -> bool:
    if filename.startswith("<frozen importlib"):
        return True
    path = Path(filename).resolve()
    return any(path == place or place in path.parents for place in places)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _shorten(text: Any, limit: int = 60) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


class FunctionReward:
    """A user's reward function as a PPO reward (``RewardFn`` of :mod:`marlhf_cli.scoring.rewards`),
    for ``bon`` and ``passk`` too. ``nones`` counts the responses it returned ``None`` for."""

    def __init__(self, spec: str, function: Callable[..., Any] | None = None):
        self.spec = spec
        self.function = function if function is not None else load_function(spec)
        self.name = spec
        self.nones = 0
        # which keyword arguments it takes: all (**kwargs), or the ones it names
        kind = inspect.Parameter
        parameters = inspect.signature(self.function).parameters.values()
        self.takes_all = any(p.kind is kind.VAR_KEYWORD for p in parameters)
        named = [p for p in parameters if p.kind in (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)]
        self.accepted = {p.name for p in named}
        self.required = [p.name for p in named if p.default is kind.empty]
        by_position = [p.name for p in parameters if p.kind is kind.POSITIONAL_ONLY and p.default is kind.empty]
        if by_position:
            raise UserError(
                f"--reward {spec}: its arguments are passed by name; {', '.join(by_position)} can only be passed by position"
            )

    def check_records(self, records: Sequence[Mapping[str, Any]], source: str = "the records") -> None:
        """A one-line error when the function requires an argument neither marlhf nor any record gives."""
        available = set(ARGUMENTS) | {name for record in records for name in record_fields(record)}
        missing = [name for name in self.required if name not in available]
        if missing:
            have = ", ".join(sorted(available - set(ARGUMENTS))) or "none"
            raise UserError(
                f"--reward {self.spec}: the function needs {', '.join(repr(m) for m in missing)}, which {source} "
                f"do not have (their fields: {have}; every call also gets {', '.join(ARGUMENTS)})"
            )

    # -------------------------------------------------------------------------------------

    def score(self, prompts: Sequence[str], completions: Sequence[str], completion_ids: Sequence[Sequence[int]],
              records: Sequence[Mapping[str, Any]]) -> list[float]:  # fmt: skip
        """One float per response, or a :class:`UserCodeError` naming the response at fault."""
        size = len(completions)
        failure = None
        try:
            returned = self._call(prompts, completions, completion_ids, records)
        except Exception as err:  # the user's code: any exception is theirs to see
            failure = err
        if failure is not None:  # (out of the except block: the per-row retries chain to nothing)
            raise self._located(failure, prompts, completions, completion_ids, records) from failure
        values = _as_list(returned)
        if values is None:
            raise UserError(f"reward function {self.spec} returned {type(returned).__name__}, not a list of {size} numbers")
        if len(values) != size:
            raise UserError(f"reward function {self.spec} returned {len(values)} scores for {size} responses (one per response, in order)")
        scores = []
        nones = sum(value is None for value in values)
        if nones and not self.nones:  # said once: a function may return None by design (TRL's "not applicable")
            print(f"note: reward function {self.spec} returned None for {nones} of {size} responses: "
                  "each counts as 0.0, as in TRL (said once)", file=sys.stderr)  # fmt: skip
        self.nones += nones
        for index, value in enumerate(values):
            if value is None:
                scores.append(0.0)
                continue
            problem = None
            if not isinstance(value, numbers.Real):  # bools count as 1.0 and 0.0, as in TRL
                problem = f"{type(value).__name__} {_shorten(value, 30)}, not a number"
            elif not math.isfinite(float(value)):
                problem = f"{float(value)}"
            if problem:
                raise UserError(f"reward function {self.spec} returned {problem} {self._row(index, size, prompts, completions)}")
            scores.append(float(value))
        return scores

    def __call__(self, batch: Any) -> Any:
        import torch

        lengths = batch.response_mask.sum(dim=1).tolist()
        ids = [row[: int(n)].tolist() for row, n in zip(batch.response_ids.cpu(), lengths)]
        records = batch.records or [{} for _ in batch.responses]
        return torch.tensor(self.score(batch.prompts, batch.responses, ids, records), dtype=torch.float32)

    # -------------------------------------------------------------------------------------

    def _call(self, prompts, completions, completion_ids, records) -> Any:
        kwargs = self._arguments(prompts, completions, completion_ids, records)
        returned = self.function(**kwargs)
        if inspect.isawaitable(returned):
            returned = asyncio.run(_awaited(returned))
        return returned

    def _arguments(self, prompts, completions, completion_ids, records) -> dict[str, Any]:
        fields = [record_fields(record) for record in records]
        names = list(dict.fromkeys(name for row in fields for name in row))
        kwargs: dict[str, Any] = {name: [row.get(name) for row in fields] for name in names}
        kwargs.update(prompts=list(prompts), completions=list(completions),
                      completions_ids=[list(ids) for ids in completion_ids], trainer_state=None)  # fmt: skip
        if not self.takes_all:
            kwargs = {name: value for name, value in kwargs.items() if name in self.accepted}
        return kwargs

    def _located(self, err: Exception, prompts, completions, completion_ids, records) -> UserCodeError:
        """The error of the first response that fails alone, or the batch's when none does."""
        size = len(completions)
        for index in range(size):
            try:
                self._call(prompts[index : index + 1], completions[index : index + 1],
                           completion_ids[index : index + 1], records[index : index + 1])  # fmt: skip
            except Exception as alone:
                where = self._row(index, size, prompts, completions)
                return UserCodeError(f"reward function {self.spec} raised {_one_line(alone)} {where}", details=user_traceback(alone))
        where = f"on a batch of {size} responses (each scored alone without error)"
        return UserCodeError(f"reward function {self.spec} raised {_one_line(err)} {where}", details=user_traceback(err))

    @staticmethod
    def _row(index: int, size: int, prompts, completions) -> str:
        return f"for response {index + 1} of {size} (prompt {_shorten(prompts[index])}, response {_shorten(completions[index])})"


def record_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a record gives a reward function: its fields but the prompt, and a TRL file's
    columns (not marlhf's own ``conversation``, the turns kept for the chat template)."""
    fields = {name: value for name, value in record.items() if name not in ("prompt", "columns", "conversation")}
    fields.update(record.get("columns") or {})
    return fields


async def _awaited(awaitable):
    return await awaitable


def _as_list(returned: Any) -> list | None:
    if hasattr(returned, "tolist") and not isinstance(returned, (str, bytes)):
        returned = returned.tolist()
    if isinstance(returned, (list, tuple)):
        return [v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v for v in returned]
    return None
