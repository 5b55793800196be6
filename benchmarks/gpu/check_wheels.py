"""Check that the wheels carried to the GPU machine are complete: every requirement met.

    python benchmarks/gpu/check_wheels.py DIR               # here, after fetch_wheels.sh DIR
    python benchmarks/gpu/check_wheels.py --installed DIR   # there, after install.sh DIR

Here: every ``Requires-Dist`` of every wheel in DIR (markers evaluated for CPython 3.12 on
Linux x86_64, extras left out) must name a wheel in DIR whose version satisfies it, or a
package the GPU machine already has (``MACHINE`` below, from
/work/.library/device/KINDS.md; versions where that page gives them). No package may come
twice. There: every requirement must be importable with a version that satisfies it; a
version outside the range is reported (pip would refuse it; it may still work), a missing
package is an error.

Exit status 1 with one line per problem, else 0 with the list of wheels.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

TARGET = dict(python_version="3.12", python_full_version="3.12.3", sys_platform="linux", platform_system="Linux",
              platform_machine="x86_64", os_name="posix", implementation_name="cpython",
              platform_python_implementation="CPython", extra="")  # fmt: skip

# The 'cuda' image of nvidia-h100-x1 / nvidia-h200 as KINDS.md lists it (read 2026-11-17);
# versions only where its pip list row gives them.
KNOWN_VERSIONS = dict(accelerate="1.15.0", huggingface_hub="1.33.0", numpy="2.5.2", safetensors="0.8.0",
                      tokenizers="0.23.2", torch="2.11.0", transformers="5.17.0", triton="3.6.0", jaxtyping="0.3.11",
                      sentencepiece="0.2.2", tiktoken="0.14.0", onnx="1.23.1")  # fmt: skip
MACHINE_NAMES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
"""
MACHINE = {canonicalize_name(n): None for n in MACHINE_NAMES.split()}
MACHINE.update({canonicalize_name(n): v for n, v in KNOWN_VERSIONS.items()})


def wheel_requirements(path: Path) -> list[Requirement]:
    """The wheel's unconditional requirements on the target (markers evaluated, extras left out)."""
    with zipfile.ZipFile(path) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode("utf-8").splitlines()
    out = []
    for line in lines:
        if not line:
            break  # the headers end at the first blank line
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(TARGET):
                out.append(requirement)
    return out


def carried(folder: Path) -> tuple[dict[str, tuple[Version, Path]], list[str]]:
    wheels, problems = {}, []
    for path in sorted(folder.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if name in wheels:
            problems.append(f"{name} twice: {wheels[name][1].name} and {path.name} (keep one)")
        wheels[name] = (version, path)
    return wheels, problems


def check_here(folder: Path) -> list[str]:
    wheels, problems = carried(folder)
    if not wheels:
        return [f"no wheels in {folder}"]
    for name, (version, path) in wheels.items():
        if name in MACHINE and MACHINE[name] == str(version):
            problems.append(f"{path.name}: the machine already has {name} {version}")
        for req in wheel_requirements(path):
            need = canonicalize_name(req.name)
            if need in wheels:
                if not req.specifier.contains(wheels[need][0], prereleases=True):
                    problems.append(f"{path.name} needs {req}, carried {need} {wheels[need][0]}")
            elif need in MACHINE:
                have = MACHINE[need]
                if have is not None and not req.specifier.contains(Version(have), prereleases=True):
                    problems.append(f"{path.name} needs {req}, the machine has {need} {have}: carry another version")
            else:
                problems.append(f"{path.name} needs {req}: neither carried nor on the machine")
    return problems


def check_installed(folder: Path) -> tuple[list[str], list[str]]:
    """(missing packages, versions outside a requirement's range) as this interpreter sees them."""
    from importlib import metadata

    wheels, problems = carried(folder)
    missing, outside = list(problems), []
    for name, (version, path) in wheels.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(f"{name} {version} is not installed")
            continue
        if Version(installed) != version:
            outside.append(f"{name}: {installed} is found before the carried {version} (check PYTHONPATH)")
        for req in wheel_requirements(path):
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                missing.append(f"{path.name} needs {req}: not installed")
                continue
            if not req.specifier.contains(Version(have), prereleases=True):
                outside.append(f"{path.name} needs {req}, found {req.name} {have}")
    return missing, outside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--installed", action="store_true", help="check what this interpreter imports (on the GPU machine)")
    args = parser.parse_args()
    if args.installed:
        missing, outside = check_installed(args.folder)
        for line in outside:
            print(f"check_wheels: version outside the required range: {line}")
        for line in missing:
            print(f"check_wheels: MISSING: {line}")
        if missing:
            sys.exit(1)
        print(f"check_wheels: every requirement of the carried wheels is installed ({len(outside)} version warning(s))")
        return
    problems = check_here(args.folder)
    for line in problems:
        print(f"check_wheels: {line}")
    if problems:
        sys.exit(1)
    wheels, _ = carried(args.folder)
    print(f"check_wheels: {len(wheels)} wheels, every requirement carried or on the GPU machine: "
          + ", ".join(f"{n} {v}" for n, (v, _) in sorted(wheels.items())))  # fmt: skip


if __name__ == "__main__":
    main()
