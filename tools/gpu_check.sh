#!/usr/bin/env bash
# Checks that need a CUDA GPU, run from the repository root:
#   OUT=gpu_check_out bash tools/gpu_check.sh
# Each section is independent; SECTIONS="train" runs only the named ones.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
PY=${PY:-python}
SECTIONS=${SECTIONS:-train}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0

# =============================================================================
# Section "train": the training loop on a GPU (train.py, bench.py's GPT-2-small rows)
# - the loop never syncs the host per step (CUDA sync-debug test of tests/test_train_loop.py)
# - 20 iterations of train.py per distinct GPU config, torch.compile on, one process, on a
#   synthetic token file built here: tokens/s, MFU, first-step (compile) time -> $OUT/smoke.json
# - optional (BENCH_GPT2=1): bench.py --gpt2 only, every variant's GPT-2-small step, compile
#   on and off -> $OUT/bench_gpt2.json (about a minute per compiled row)
# Time: about 1 minute per distinct config (compilation dominates), 11 configs.
# =============================================================================
if [[ " $SECTIONS " == *" train "* ]]; then
    echo "== train: no per-step host sync (CUDA sync-debug mode)"
    $PY -m pytest -q -x tests/test_train_loop.py -k cuda 2>&1 | tee "$OUT/train_loop_cuda.txt" || status=1
    echo "== train: 20 compiled iterations per GPU config"
    $PY tools/train_smoke.py --iters 20 --out "$OUT" ${SMOKE_ONLY:+--only "$SMOKE_ONLY"} || status=1
    if [[ "${BENCH_GPT2:-0}" == 1 ]]; then
        echo "== train: bench.py GPT-2-small training steps"
        $PY bench.py --gpt2 only --out "$OUT/bench_gpt2.json" || status=1
    fi
fi

exit $status
