#!/usr/bin/env bash
# On the GPU machine, offline: install the wheels fetch_wheels.sh put in DIR, then this project.
#
#   benchmarks/gpu/install.sh [DIR]     # DIR defaults to .whl; then suite.sh finds the install
#
# Installs into a folder of its own (MARLHF_SITE, default /tmp/marlhf-site) with
# --no-index --no-deps, as the device README recommends: the machine's python
# (/opt/torch/.venv/bin/python3, a virtualenv without a user site) keeps its own torch,
# transformers and the rest untouched. Writes MARLHF_SITE/env.sh, which sets PYTHONPATH (the
# checkout first, so edits here take effect without reinstalling; then the wheels), PATH (the
# `marlhf` command) and MARLHF_CACHE (marlhf's cache in DIR); suite.sh sources it. Then checks
# that every carried wheel's requirements are met there and that SmolLM2's tokenizer loads.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DIR=$(cd "${1:-$REPO/.whl}" && pwd)
SITE=${MARLHF_SITE:-/tmp/marlhf-site}
PYTHON=${PYTHON:-python3}
fail() { echo "install: $*" >&2; exit 1; }

ls "$DIR"/*.whl >/dev/null 2>&1 || fail "no wheels in $DIR: run benchmarks/gpu/fetch_wheels.sh $DIR where PyPI is reachable"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$DIR"/*.whl
# the project: no build isolation (there is no index to fetch setuptools from). Where the
# machine's setuptools cannot build it, the checkout on PYTHONPATH is the project all the same
# and a two-line `marlhf` stands in for the console script.
if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
        --target "$SITE" "$REPO" >"$SITE/project-install.log" 2>&1; then
    echo "install: pip could not build the project offline ($SITE/project-install.log): running it from the checkout"
    mkdir -p "$SITE/bin"
    printf '#!/bin/sh\nexec %s -m marlhf_cli.cli "$@"\n' "$(command -v "$PYTHON")" >"$SITE/bin/marlhf"
    chmod +x "$SITE/bin/marlhf"
fi
cat >"$SITE/env.sh" <<EOF
# written by benchmarks/gpu/install.sh
export PYTHONPATH="$REPO:$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$SITE/bin:\$PATH"
export MARLHF_CACHE="$DIR/marlhf-cache"
EOF
# shellcheck disable=SC1091
. "$SITE/env.sh"
"$PYTHON" "$HERE/check_wheels.py" --installed "$DIR" || fail "requirements missing (above)"
"$PYTHON" - <<'EOF' || fail "the installed packages do not import (above)"
import deepspeed, datasets, openai, tenacity, trl  # noqa: F401
from marlhf_cli.models import load_tokenizer
print(f"install: deepspeed {deepspeed.__version__}, datasets {datasets.__version__}, trl {trl.__version__}; "
      f"SmolLM2 tokenizer loads ({len(load_tokenizer('tiny'))} tokens)")
EOF
echo "install: done; in a new shell: . $SITE/env.sh (suite.sh does it by itself)"
