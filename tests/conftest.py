"""Shared fixtures. Tests never touch a hub: the environment is set offline before imports."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# --dtype auto (the default) means fp32 in tests whatever the CPU: the suite's figures and
# exactness checks must not depend on the machine (tests/test_precision.py tests "auto")
os.environ.setdefault("MARLHF_AUTO_DTYPE", "fp32")
# no training-curve PNGs (marlhf_cli/train/monitor.py): a quarter of a few-step run's time,
# in the hundreds of runs here (and the subprocesses, which inherit it); the tests of the
# plots turn them back on with the draw_plots fixture (below)
os.environ.setdefault("MARLHF_PLOTS", "0")
# pytest-xdist runs a worker per core (up to 4): each computes with one thread, as the
# modules that opt into one_torch_thread (below) and the subprocesses the tests start always
# did. torch's default, one OpenMP thread per core in every worker, oversubscribes the cores
# and spins (several times slower on a 2-core machine). Set before torch is imported; the
# subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_data(*parts: str) -> Path:
    """A file of ../shared/data, or a skip saying why the test cannot run."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the real-data tests need ../shared/data beside the repository")
    return path


@pytest.fixture
def one_torch_thread():
    """One intra-op thread: the tiny model's ops are too small to split, and on a busy 2-core
    machine two OpenMP threads per process run several times slower than one. Test modules
    of the tiny model opt in with ``pytestmark``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def draw_plots():
    """Stages draw plots/<stage>-*.png again, as they do outside the suite (MARLHF_PLOTS,
    off above): for the modules that check them. Module-scoped, so that a module's shared
    run (a module fixture that asks for it) draws them too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MARLHF_PLOTS", "1")
        yield


@pytest.fixture(scope="session")
def tokenizer():
    """The real SmolLM2 tokenizer (byte-level BPE), loaded offline."""
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_tokenizer

    return load_tokenizer("tiny")


def pytest_collection_modifyitems(config, items):
    """Modules with slow tests run first, each module's tests still together (its module
    fixtures are made once per worker). pytest-xdist's load scheduling hands each worker a
    batch of tests it keeps, and then the rest a few at a time: when a slow module came last
    in that first batch, one worker went on with it for up to a minute while the other had
    nothing left. Now the run ends on short tests, taken by whichever worker is free."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the collection's order otherwise
