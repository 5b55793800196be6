"""What a run's figures depend on besides its options: the code, the libraries, the machine.

run.json records it for every stage (``provenance``), and every resume checkpoint carries
it, so that ``--resume`` can say where the machine or the code changed since the checkpoint
(a note, not a refusal: the options decide what a run is). A saved run re-executed on a CPU
without AVX-512 departed from its record at step 4: its record should say what it ran on.

Imports no torch: the GPU is read only where a stage has already loaded torch.
"""

from __future__ import annotations

import functools
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

# the libraries whose versions decide a run's numbers (run.json's "versions")
TRACKED_LIBRARIES = ("torch", "transformers", "deepspeed", "peft", "datasets", "spacy", "stanza", "openai")
# CPU extensions that decide fp32 and bf16 speed, and which kernels torch picks (hence rounding)
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "asimd", "sve")

_invocation: list[str] | None = None  # the arguments the marlhf app was given, once it runs


def remember_invocation(args: Iterable[str]) -> None:
    """Called by the app (options.OneLineErrors) with the arguments it parses: the command a
    run records is the one typed, also where marlhf runs inside another program (tests)."""
    global _invocation
    _invocation = list(args)


def command_line() -> str:
    """The command this process runs, as typed: ``marlhf ppo --preset cpu-tiny`` (code that
    calls a stage directly: its program's name and arguments)."""
    if _invocation is not None:
        return " ".join(shlex.quote(part) for part in ("marlhf", *_invocation))
    return " ".join(shlex.quote(part) for part in (Path(sys.argv[0]).name, *sys.argv[1:]))


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


@functools.lru_cache(maxsize=1)
def commit() -> str | None:
    """The git commit of the checkout marlhf runs from (``+changes`` when files differ from
    it), or None for an installed package."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        changed = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, Any]:
    """The CPU's model and the extensions of :data:`CPU_FLAGS` it has."""
    from .precision import cpu_flags

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    have = cpu_flags()
    return {"model": model, "flags": [flag for flag in CPU_FLAGS if flag in have]}


def gpus() -> list[str]:
    """The GPUs torch sees, by name (none where torch is not loaded or sees none)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def provenance() -> dict[str, Any]:
    """marlhf's version and commit, the command, the libraries, the CPU and the GPUs."""
    from . import __version__

    return {"marlhf": __version__, "commit": commit(), "command": command_line(), "versions": library_versions(),
            "cpu": cpu(), "gpus": gpus()}  # fmt: skip


def differences(then: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's provenance and this process's, in words
    ('transformers 5.17.0, now 5.24.0'); nothing for a checkpoint written before it was kept."""
    if not then:
        return []
    out = []
    if then.get("commit") != now.get("commit") and then.get("commit") and now.get("commit"):
        out.append(f"marlhf commit {then['commit']}, now {now['commit']}")
    old, new = then.get("versions", {}), now.get("versions", {})
    out += [f"{name} {old[name]}, now {new.get(name, 'absent')}" for name in old if old[name] != new.get(name)]
    if then.get("cpu", {}).get("model") != now.get("cpu", {}).get("model"):
        out.append(f"CPU {then.get('cpu', {}).get('model')}, now {now.get('cpu', {}).get('model')}")
    elif then.get("cpu", {}).get("flags") != now.get("cpu", {}).get("flags"):
        out.append(f"CPU flags {' '.join(then['cpu']['flags'])}, now {' '.join(now['cpu']['flags'])}")
    if then.get("gpus") != now.get("gpus"):
        out.append(f"GPUs {', '.join(then.get('gpus') or ['none'])}, now {', '.join(now.get('gpus') or ['none'])}")
    return out
