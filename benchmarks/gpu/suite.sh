#!/usr/bin/env bash
# The GPU suite: four stages, each one command of under 9 minutes on an H100.
#
#   benchmarks/gpu/suite.sh STAGE OUTDIR [--device cpu]
#
#   first  benchmarks/gpu/first_contact.py, under 90 s: the compiled sampler's checks no CPU can
#          make (sampling ops recorded alone, fp32 exactness, stale weights, the bf16 gap, ms per
#          token eager against compiled), each PASS or FAIL, all run whatever fails
#          -> OUTDIR/first.log, OUTDIR/first.json
#   tests  pytest -m gpu (tests/test_gpu.py): sft, rm, PPO / MA-PPO / RLOO / GRPO in bf16, ZeRO 0-3,
#          the KV-cached sampler against a full forward, SIGKILL + --resume
#          -> OUTDIR/tests.log, OUTDIR/tests.xml (JUnit, with the sampler's measured gaps)
#   speed  in bf16: decode_cost.py (the PPO step, eager against compiled sampling, batches 8x64 and
#          64x128) at SmolLM2-135M's and -1.7B's shapes, LoRA rank 16's peak memory at 1.7B,
#          mc_cost.py (mc against rloo), vs_trl.py (against TRL 1.12's PPOTrainer) and
#          vs_trl_dpo.py (the DPO step; against TRL's DPOTrainer where it is installed) at 135M
#          -> OUTDIR/speed.log, decode-<shape>[-lora16].json, mc_cost-<shape>.json,
#             vs_trl-<shape>.json, dpo-<shape>.json, speed.json, speed.png
#   study  the credit-assignment pilot at SmolLM2-135M's shape with 256-token responses
#          (studies/credit/gpu_scale.py) -> OUTDIR/study.log, credit_scale.json, credit_scale.png, runs.log
#
# On any CUDA machine with the project installed (README.md; TRL 1.12.0 beside it for vs_trl),
# from the repository root. On the lent machine, after install.sh: this script sources its env.
# --device cpu (or MARLHF_SUITE_DEVICE=cpu) is the dry run: the same commands on the CPU with
# the tiny model and a few steps, so that every line has run before a GPU is lent.
# PYTHON picks the interpreter (default python3); each part has a time limit (seconds) so
# that one part that hangs cannot take the stage's time; the stage's exit status is 1 when any
# part failed, and every part runs regardless.
set -uo pipefail

STAGE=${1:-}
OUT=${2:-}
DEVICE=${MARLHF_SUITE_DEVICE:-cuda}
[ "${3:-}" = "--device" ] && DEVICE=${4:-}
case "$STAGE" in first | tests | speed | study) ;; *) echo "usage: benchmarks/gpu/suite.sh first|tests|speed|study OUTDIR [--device cpu]" >&2; exit 2 ;; esac
[ -n "$OUT" ] || { echo "suite: OUTDIR missing" >&2; exit 2; }
case "$DEVICE" in cuda | cpu) ;; *) echo "suite: --device is cuda or cpu, not '$DEVICE'" >&2; exit 2 ;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SITE_ENV=${MARLHF_SITE:-/tmp/marlhf-site}/env.sh
# shellcheck disable=SC1090
[ -f "$SITE_ENV" ] && . "$SITE_ENV"  # the lent machine: what install.sh installed
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO" || exit 1
THREADS=1
[ "$DEVICE" = cuda ] && THREADS=4  # torch's CPU threads per process (the GPU does the work)

# part NAME SECONDS COMMAND...: run one part under a time limit (its child processes too),
# record a failure, go on
part() {
    local name=$1 limit=$2
    shift 2
    echo "## $name ($(date -u +%H:%M:%S), limit ${limit} s): $*"
    local began=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    local code=$?
    echo "## $name: exit $code after $((SECONDS - began)) s"
    [ "$code" -eq 0 ] || FAILED+=("$name (exit $code)")
}

stage() {
    FAILED=()
    echo "# suite $STAGE on $DEVICE, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$PYTHON" "$HERE/device.py" || FAILED+=("device report")
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    "$PYTHON" -c "import sys, torch, transformers, deepspeed; print(f'# python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, deepspeed {deepspeed.__version__}')" \
        || FAILED+=("imports")
    if [ "$DEVICE" = cuda ]; then
        "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'suite: torch sees no GPU; --device cpu runs the dry run')" || return 1
    fi
    case "$STAGE" in
    first) first_stage ;;
    tests) tests_stage ;;
    speed) speed_stage ;;
    study) study_stage ;;
    esac
    if [ "${#FAILED[@]}" -gt 0 ]; then
        printf '# suite %s FAILED: %s\n' "$STAGE" "$(IFS=';'; echo "${FAILED[*]}")"
        return 1
    fi
    echo "# suite $STAGE passed; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}

first_stage() {
    local quick=()
    [ "$DEVICE" = cpu ] && quick=(--quick)
    part "first contact" 90 "$PYTHON" benchmarks/gpu/first_contact.py --device "$DEVICE" "${quick[@]}" --json "$OUT/first.json"
}

tests_stage() {
    [ "$DEVICE" = cpu ] && export MARLHF_GPU_TESTS_ON_CPU=1
    # shellcheck disable=SC2086
    part "pytest -m gpu" 520 "$PYTHON" -m pytest -m gpu tests/test_gpu.py -q -ra -p no:cacheprovider \
        --junitxml "$OUT/tests.xml" ${MARLHF_SUITE_PYTEST_ARGS:-}
}

speed_stage() {
    local trl_python=${MARLHF_TRL_PYTHON:-$(command -v "$PYTHON")} small large batches large_batches rounds lora mc trl
    local small_name large_name  # the shapes' names in the files' names
    if [ "$DEVICE" = cuda ]; then  # ~5 minutes on an H100 (the limits are caps, not estimates)
        small=random:smollm2-135m large=random:smollm2-1.7b batches=8x64,64x128 large_batches=$batches rounds=2 lora=16
        small_name=smollm2-135m large_name=smollm2-1.7b
        mc=(--prompts 8 --k 4 --new-tokens 64) trl=(--steps 8 --warmup 2)
    else  # the dry run: the tiny model, small batches, one round
        small=tiny large=tiny batches=2x8,4x16 large_batches=2x8 rounds=1 lora=4 small_name=tiny large_name=tiny-as-large
        mc=(--prompts 2 --k 2 --new-tokens 8) trl=(--steps 3 --warmup 1)
    fi
    local device=(--device "$DEVICE" --dtype bf16 --threads "$THREADS")
    part "decode $small_name" 110 "$PYTHON" benchmarks/decode_cost.py --model "$small" --batches "$batches" \
        --rounds "$rounds" "${device[@]}" --json "$OUT/decode-$small_name.json"
    part "decode $large_name" 170 "$PYTHON" benchmarks/decode_cost.py --model "$large" --batches "$large_batches" \
        --rounds 1 "${device[@]}" --json "$OUT/decode-$large_name.json"
    part "LoRA $large_name" 90 "$PYTHON" benchmarks/decode_cost.py --model "$large" --lora-rank "$lora" \
        --batches "${batches%%,*}" --generations compiled --rounds 1 "${device[@]}" --json "$OUT/decode-$large_name-lora$lora.json"
    part "mc vs rloo $small_name" 90 "$PYTHON" benchmarks/mc_cost.py --model "$small" --configs rloo,mc-ppl-m2 \
        "${mc[@]}" --rounds "$rounds" --no-prefix-sharing "${device[@]}" --json "$OUT/mc_cost-$small_name.json"
    if "$trl_python" -c "import trl" 2>/dev/null; then
        part "vs_trl $small_name" 110 "$PYTHON" benchmarks/vs_trl.py --model "$small" "${trl[@]}" --rounds 1 \
            --no-shipped --trl-python "$trl_python" --flops "${device[@]}" --json "$OUT/vs_trl-$small_name.json"
    elif [ "$DEVICE" = cuda ]; then
        FAILED+=("vs_trl: $trl_python cannot import trl (install trl==1.12.0)")
    else
        echo "## vs_trl $small_name: SKIPPED in the dry run: $trl_python cannot import trl (pip install --no-deps trl==1.12.0)"
    fi
    # GRPO against TRL's current GRPOTrainer: an interpreter with TRL's newest release (its own site,
    # since trl 1.12 serves vs_trl above); its wheels are not carried to the lent machine yet
    local grpo_python=${MARLHF_TRL_NEW_PYTHON:-}
    if [ -n "$grpo_python" ] && "$grpo_python" -c "import trl, sys; sys.exit(int(trl.__version__.split('.')[1]) < 13)" 2>/dev/null; then
        part "grpo vs TRL $small_name" 110 "$PYTHON" benchmarks/vs_trl.py --algorithm grpo --model "$small" "${trl[@]}" \
            --rounds 1 --trl-grpo-python "$grpo_python" "${device[@]}" --json "$OUT/vs_trl_grpo-$small_name.json"
    else
        echo "## grpo vs TRL $small_name: SKIPPED: MARLHF_TRL_NEW_PYTHON names no interpreter with TRL 1.13 or later"
    fi
    # DPO in bf16 (issue 53): marlhf's step, against TRL's DPOTrainer where an interpreter with it is named
    local dpo=(--steps 6 --warmup 2) dpo_trl=(--marlhf-only)
    [ "$DEVICE" = cpu ] && dpo=(--steps 3 --warmup 1 --prompt-tokens 32 --response-tokens 16)
    if [ -n "$grpo_python" ] && "$grpo_python" -c "import trl" 2>/dev/null; then dpo_trl=(--trl-python "$grpo_python"); fi
    part "dpo $small_name" 110 "$PYTHON" benchmarks/vs_trl_dpo.py --models "$small" "${dpo[@]}" --rounds 1 "${dpo_trl[@]}" \
        --device "$DEVICE" --dtype bf16 --threads "$THREADS" --json "$OUT/dpo-$small_name.json"
    part "speed report" 60 "$PYTHON" "$HERE/speed_report.py" "$OUT"
}

study_stage() {
    if [ "$DEVICE" = cuda ]; then
        part "credit_scale" 500 "$PYTHON" -m studies.credit.gpu_scale --out "$OUT" --device cuda --dtype bf16 --budget 420
    else
        part "credit_scale" 300 "$PYTHON" -m studies.credit.gpu_scale --out "$OUT" --device cpu --dtype bf16 \
            --model tiny --tokens 8 --steps 2 --seeds 1 --budget 120
    fi
}

stage 2>&1 | tee "$OUT/$STAGE.log"
exit "${PIPESTATUS[0]}"
