"""Rewards computed by running code: the sandbox, output comparison, the APPS reward, pass@k,
and the user's own reward functions (``--reward py:FILE.py:FUNCTION``, :mod:`.function`).

>>> from marlhf_cli.rewards import AppsReward, pass_at_k
>>> AppsReward().score(["print(int(input()) * 2)"], [{"inputs": ["2\\n"], "outputs": ["4\\n"]}])
[1.0]

:mod:`.sandbox` runs one untrusted program per test in an isolated, limited process;
:mod:`.compare` decides whether its output is right; :mod:`.apps` turns per-test outcomes
into the paper's compiler-signal reward and computes pass@k; :mod:`.passk` is
``marlhf passk``. Names are imported lazily, so the CLI can import :mod:`.flags` without
loading the sandbox; nothing here imports torch except ``AppsReward.__call__`` and passk.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "AppsReward": "apps", "Judge": "apps", "ProgramResult": "apps", "extract_program": "apps",
    "pass_at_k": "apps", "passk_table": "apps", "reward": "apps", "test_cases": "apps",
    "FunctionReward": "function", "load_function": "function",
    "Execution": "sandbox", "Job": "sandbox", "Limits": "sandbox", "Sandbox": "sandbox",
    "SandboxUnavailable": "sandbox", "isolation": "sandbox",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
