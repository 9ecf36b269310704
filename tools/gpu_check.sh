#!/usr/bin/env bash
# One GPU check on an H100/H200, at most 8.5 minutes with the default limits: the CUDA
# tests, the CUDA kernel benchmark, the training loop's sync check and 20 compiled train.py
# iterations of the sa, hfa and ha GPU configs (SMOKE_ONLY=all for every config, with
# SMOKE_LIMIT raised). Results as JSON in $OUT (default ./gpu_check_out).
#
#     bash tools/gpu_check.sh                  # OUT=./gpu_check_out
#     OUT=/some/dir PYTHON=python3 bash tools/gpu_check.sh
#
# Works on a bare image (python3 with torch and triton; no pytest, no datasets, no
# network): without pytest the test files run through tools/minitest.py. Every section
# has its own time limit; a failing section is reported and the script goes on. The
# summary is $OUT/gpu_check.json: one entry per section (status, exit code, seconds).
# Sections append below in the same form: section NAME LIMIT_S COMMAND...
set -u

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
SUMMARY="$OUT/gpu_check.json"
echo "[" > "$SUMMARY.tmp"
FIRST=1
T_START=$(date +%s)

section() {  # section NAME LIMIT_S COMMAND...: run with a time limit, log to $OUT/NAME.log
    local name="$1" limit="$2"
    shift 2
    echo "=== $name (limit ${limit}s): ${1} ${2:-} ${3:-}..."
    local t0 rc status
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then status=ok; elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout; else status=failed; fi
    local dt=$(( $(date +%s) - t0 ))
    tail -n 25 "$OUT/$name.log"
    echo "=== $name: $status (exit $rc, ${dt}s)"
    [ $FIRST -eq 1 ] || echo "," >> "$SUMMARY.tmp"
    FIRST=0
    printf '{"section": "%s", "status": "%s", "exit_code": %d, "seconds": %d, "log": "%s.log"}' \
        "$name" "$status" "$rc" "$dt" "$name" >> "$SUMMARY.tmp"
    return 0
}

finish() {
    echo "]" >> "$SUMMARY.tmp"
    mv "$SUMMARY.tmp" "$SUMMARY"
    echo "total $(( $(date +%s) - T_START ))s; summary in $SUMMARY"
}
trap finish EXIT

# --- environment -------------------------------------------------------------
section environment 60 "$PYTHON" -c "
import json, platform, sys, torch
info = dict(python=sys.version.split()[0], torch=torch.__version__, cuda=torch.version.cuda,
            cuda_available=torch.cuda.is_available(), platform=platform.platform())
try:
    import triton; info['triton'] = triton.__version__
except Exception as e:
    info['triton'] = f'not importable: {e}'
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, capability=f'{p.major}.{p.minor}', memory_gib=round(p.total_memory / 2**30, 1))
    sys.path.insert(0, '.')
    import hardware
    info['peak_bf16_flops'] = hardware.cuda_peak(p.name)
try:
    import pytest; info['pytest'] = pytest.__version__
except Exception:
    info['pytest'] = None
print(json.dumps(info, indent=1))
json.dump(info, open('$OUT/environment.json', 'w'), indent=1)
"

# --- kernel tests on CUDA (compiled Triton kernels, realistic bf16 sizes, torch.compile) ---
KERNEL_TESTS="tests/test_kernels_triton.py tests/test_kernels_compile.py tests/test_triton_ha.py"
KERNEL_TESTS=$(for f in $KERNEL_TESTS; do [ -f "$f" ] && printf '%s ' "$f"; done)
if "$PYTHON" -c "import pytest" 2>/dev/null; then
    section kernel_tests 140 "$PYTHON" -m pytest -q -rs -p no:cacheprovider $KERNEL_TESTS \
        --junitxml="$OUT/kernel_tests.xml"
else
    section kernel_tests 140 "$PYTHON" tools/minitest.py $KERNEL_TESTS --json "$OUT/kernel_tests.json"
fi

# --- kernel benchmark: fwd / bwd / fwd+bwd, bf16, T in {1024, 4096, 8192}, dh in {64, 128} ---
section kernel_bench 120 "$PYTHON" bench.py --device cuda --kernels_only --out "$OUT/bench_kernels.json"

# --- the training loop on a GPU (train.py; no pytest needed) ------------------------------
# host-device syncs counted by torch's sync-debug mode: as many for 16 steps as for 6
section train_sync 60 "$PYTHON" tools/train_smoke.py --sync_check
# 20 compiled iterations per distinct GPU config on synthetic GPT-2 tokens, one process:
# tokens/s, MFU and first-step (compile) time per config in $OUT/smoke.json (SMOKE_ONLY=sa,ha
# for some of them; about a minute per config, compilation dominates)
SMOKE_ONLY="${SMOKE_ONLY:-sa,hfa,ha}"
[ "$SMOKE_ONLY" = all ] && SMOKE_ONLY=
section train_smoke "${SMOKE_LIMIT:-120}" "$PYTHON" tools/train_smoke.py --iters 20 --out "$OUT" \
    ${SMOKE_ONLY:+--only "$SMOKE_ONLY"}
# GPT-2-small training step per variant, compile on and off (BENCH_GPT2=1; ~1 min per compiled row)
if [ "${BENCH_GPT2:-0}" = 1 ]; then
    section bench_gpt2 600 "$PYTHON" bench.py --device cuda --gpt2 only --out "$OUT/bench_gpt2.json"
fi
