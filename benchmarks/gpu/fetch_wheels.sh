#!/usr/bin/env bash
# Everything the lent GPU machine lacks, into DIR (run here, where PyPI is reachable):
#
#   benchmarks/gpu/fetch_wheels.sh DIR        # e.g. .whl (ignored by git, carried with `carry`)
#
# - the wheels pinned in wheels.txt, for CPython 3.12 on manylinux x86_64 (no dependencies
#   resolved: wheels.txt names each one), replacing any *.whl already in DIR;
# - deepspeed's wheel built from its sdist with DS_BUILD_OPS=0 when PyPI has no wheel (pure
#   Python: its ops compile on first use, and the project's engine needs none of them);
# (SmolLM2's tokenizer, all the 'tiny' and 'random:<shape>' models need, travels in the
# package: marlhf_cli/assets.) Then check_wheels.py checks every requirement is carried or on the machine, and the folder
# must stay under 60 MiB (the machine takes 64 MiB with the working tree): else exit 1.
#
# PYTHON (default: the repository's .venv) must have torch (deepspeed's setup imports it).
set -euo pipefail

DIR=${1:?usage: benchmarks/gpu/fetch_wheels.sh DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
LIMIT_MIB=60
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
fail() { echo "fetch_wheels: $*" >&2; exit 1; }

[ -x "$PYTHON" ] || PYTHON=$(command -v python3) || fail "no python: set PYTHON"
"$PYTHON" -c "import torch, marlhf_cli" 2>/dev/null || fail "$PYTHON lacks torch or marlhf_cli (set PYTHON)"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
rm -f "$DIR"/*.whl
mapfile -t PINS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/wheels.txt" | grep -v '^$')
echo "fetch_wheels: ${#PINS[@]} pins from wheels.txt into $DIR"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for pin in "${PINS[@]}"; do
    if "$PYTHON" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$DIR" "$pin" 2>"$WORK/err"; then
        continue
    fi
    [ "${pin%%==*}" = deepspeed ] || { cat "$WORK/err" >&2; fail "no cp312 manylinux x86_64 wheel of $pin"; }
    echo "fetch_wheels: no wheel of $pin on the index: building one from its sdist (DS_BUILD_OPS=0)"
    "$PYTHON" -m pip download -q --no-deps --no-binary=:all: -d "$WORK/sdist" "$pin"
    # no build isolation (it would install a CUDA torch); setuptools here may lack bdist_wheel
    "$PYTHON" -m pip install -q --target "$WORK/tools" wheel
    PYTHONPATH="$WORK/tools" DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation \
        -w "$DIR" "$WORK"/sdist/deepspeed-*.tar.gz >"$WORK/build.log" 2>&1 \
        || { tail -30 "$WORK/build.log" >&2; fail "building $pin failed"; }
done

"$PYTHON" "$HERE/check_wheels.py" "$DIR" || fail "the wheels in $DIR are incomplete (above)"
ls -l "$DIR"/*.whl | awk '{printf "  %9d  %s\n", $5, $NF}'
BYTES=$(du -sb "$DIR" | cut -f1)
MIB=$(( (BYTES + 1048575) / 1048576 ))
[ "$MIB" -le "$LIMIT_MIB" ] || fail "$DIR is $MIB MiB, over the $LIMIT_MIB MiB limit (the machine takes 64 MiB with the working tree)"
echo "fetch_wheels: $DIR holds $(ls "$DIR"/*.whl | wc -l) wheels, $BYTES bytes ($MIB MiB of $LIMIT_MIB); SmolLM2's tokenizer travels in the package"
