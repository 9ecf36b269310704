#!/usr/bin/env bash
# One GPU check on an H100/H200 that returns everything within 8 minutes, and one report to
# read and share: $OUT/gpu_check.md (markdown; tools/gpu_report.py) beside the JSON. On your
# first GPU run, run this and send us gpu_check.md. The most important numbers come first:
#   0. the preflight (attention_kernels/preflight.py): each Triton family at a GPT-2-small
#      training class (bf16, dh 64 and 128, T = 1024), forward + backward in a child process
#      under a timeout: a crash, a hang or a mismatch there is a verdict in the report, first
#   1. every Triton kernel's self-check against PyTorch (tools/self_check.py): bf16 at head
#      sizes 64 and 128 (causal, windows, decoding) and fp32, the classes a GPT-2-small run uses
#   2. HA forward + backward TFLOP/s at T = 4096, dh 64 and 128 (windows 512 x 32), beside SDPA
#   3. HFA (A = 2) and linear attention beside SDPA at T = 4096
#   4. the GPT-2-small training step per variant (sa, hfa, ha; 10 compiled train.py iterations)
#   5. the CUDA kernel tests (realistic bf16 sizes), then the training loop's sync check
# A first section compiles the Triton kernels of 1-5 in parallel processes (the GPU image's
# Triton cache starts empty; compiling is CPU work, and the machine has 16 cores): the bench
# rows, the self-check and the kernel tests themselves, so that no later section compiles cold.
# The preflight (0) runs there too, beside them: a first use that compiles, in children.
#
#     bash tools/gpu_check.sh            # on a GPU; without one it prints the plan (dry mode)
#     bash tools/gpu_check.sh --dry      # the plan: every section, its limit, the total, the margin
#     OUT=/some/dir PYTHON=python3 BUDGET=480 bash tools/gpu_check.sh
#
# Needs python3 with torch and triton (and pytest for the kernel tests; no numpy, no
# datasets, no network). Every section has a time limit, capped by what is left of
# BUDGET seconds less the report's; every case writes its result as it finishes (JSON lines,
# logs flushed per test), so a section that is killed still returns what it did.
# $OUT/gpu_check.json lists the sections (status, exit code, seconds) and is rewritten after
# each one; gpu_check.md is written last, whatever happened before.
set -u

cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
PYTHON="${PYTHON:-python3}"
BUDGET="${BUDGET:-480}"   # seconds for the whole script
GRACE=5                   # kill-after of each section's timeout
REPORT=5                  # seconds kept for writing gpu_check.md at the end
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
if [ $DRY = 0 ] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "no CUDA device here: dry mode (the plan only)"
    DRY=1
fi

# section NAME LIMIT_S COMMAND...   (in the order they run)
PLAN=(
  "environment 10"
  "warm_cache 70"
  "self_check 20"
  "bench_ha 70"
  "bench_hfa_linear 45"
  "train_smoke 135"
  "kernel_tests 40"
  "train_sync 30"
)
if [ $DRY = 1 ]; then
    total=0
    printf '%-18s %8s\n' section "limit s"
    for entry in "${PLAN[@]}"; do
        set -- $entry
        printf '%-18s %8d\n' "$1" "$2"
        total=$(( total + $2 + GRACE ))
    done
    printf '%-18s %8d\n' report "$REPORT"
    total=$(( total + REPORT ))
    echo "sum of limits + ${GRACE}s kill grace each + the report: ${total}s; budget ${BUDGET}s (480 s = 8 minutes)"
    [ $total -le "$BUDGET" ] && echo "fits: ${total}s <= ${BUDGET}s, margin $(( BUDGET - total ))s" \
        || { echo "does NOT fit"; exit 1; }
    exit 0
fi

mkdir -p "$OUT"
SUMMARY="$OUT/gpu_check.json"
T_START=$(date +%s)
ENTRIES=""
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$OUT/triton_cache}"   # shared by every section
export PYTHONUNBUFFERED=1

limit_of() {  # the PLAN limit of section $NAME_Q
    local e
    for e in "${PLAN[@]}"; do set -- $e; if [ "$1" = "$NAME_Q" ]; then echo "$2"; return; fi; done
    echo 30
}

section() {  # section NAME COMMAND...: run with its limit, log to $OUT/NAME.log, summary after
    local name="$1"
    shift
    NAME_Q="$name"
    local limit
    limit=$(limit_of)
    local left=$(( BUDGET - REPORT - ($(date +%s) - T_START) - GRACE ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 0 ]; then
        echo "=== $name: skipped (budget spent)"
        status=skipped rc=0 dt=0
    else
        echo "=== $name (limit ${limit}s): $*"
        local t0=$(date +%s)
        timeout --kill-after=$GRACE "$limit" "$@" > "$OUT/$name.log" 2>&1
        rc=$?
        if [ $rc -eq 0 ]; then status=ok; elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout; else status=failed; fi
        dt=$(( $(date +%s) - t0 ))
        tail -n 20 "$OUT/$name.log"
        echo "=== $name: $status (exit $rc, ${dt}s)"
    fi
    [ -n "$ENTRIES" ] && ENTRIES="$ENTRIES,"
    ENTRIES="$ENTRIES
 {\"section\": \"$name\", \"status\": \"$status\", \"exit_code\": $rc, \"seconds\": $dt, \"log\": \"$name.log\"}"
    printf '[%s\n]\n' "$ENTRIES" > "$SUMMARY.tmp" && mv "$SUMMARY.tmp" "$SUMMARY"
    return 0
}

# --- 0. environment ----------------------------------------------------------------------
section environment "$PYTHON" -c "
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
for mod in ('pytest', 'numpy'):
    try:
        info[mod] = __import__(mod).__version__
    except Exception:
        info[mod] = None
print(json.dumps(info, indent=1))
json.dump(info, open('$OUT/environment.json', 'w'), indent=1)
"

# --- 1. compile ahead: one process per kernel row and head size, the self-check and the ----
# kernel tests' groups, all at once (results thrown away: the sections below run warm)
BENCH=(bench.py --device cuda --kernels_only --kernel_seq_lens 4096 --kernel_min_time 0.2 --kernel_min_iters 3)
KERNEL_TESTS="tests/test_triton_ha.py tests/test_kernels_triton.py tests/test_kernel_guards.py"
KERNEL_TEST_SELECTION="cuda or fallback"
warm() {
    local pids=()
    trap 'kill "${pids[@]}" 2>/dev/null; exit 124' TERM  # a timed-out warm-up leaves nothing running
    for row in ha_win sdpa hfa_A2 linear; do
        for dh in 64 128; do
            "$PYTHON" bench.py --device cuda --kernels_only --kernel_seq_lens 4096 --kernel_head_dims $dh \
                --kernel_list $row --kernel_min_time 0 --kernel_min_iters 1 > "$OUT/warm_${row}_$dh.log" 2>&1 &
            pids+=($!)
        done
    done
    "$PYTHON" tools/self_check.py --out "$OUT/warm_self_check.json" > "$OUT/warm_self_check.log" 2>&1 &
    pids+=($!)
    # the preflight: its children die, hang or disagree, and it writes their verdicts (exit 0)
    "$PYTHON" -m attention_kernels.preflight --report "$OUT/preflight.json" --timeout 55 > "$OUT/preflight.log" 2>&1 &
    pids+=($!)
    local i=0
    for group in "tests/test_triton_ha.py -k cuda" "tests/test_kernels_triton.py -k cuda_hfa" \
                 "tests/test_kernels_triton.py -k cuda_linear" "tests/test_kernel_guards.py -k fallback"; do
        "$PYTHON" -m pytest -q -p no:cacheprovider $group > "$OUT/warm_tests_$i.log" 2>&1 &
        pids+=($!)
        i=$(( i + 1 ))
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    echo "preflight verdicts:"
    cat "$OUT/preflight.log"
    return $rc
}
section warm_cache bash -c "$(declare -f warm); PYTHON='$PYTHON' OUT='$OUT' warm"

# --- 2. every Triton kernel against PyTorch: one line per configuration class -------------
section self_check "$PYTHON" tools/self_check.py --out "$OUT/self_check.json"

# --- 3. kernels: HA first, then HFA and linear, each beside SDPA; a JSON line per case -------
section bench_ha "$PYTHON" "${BENCH[@]}" --kernel_head_dims 64,128 --kernel_list sdpa,ha_win \
    --jsonl "$OUT/bench_kernels.jsonl" --out "$OUT/bench_ha.json"
section bench_hfa_linear "$PYTHON" "${BENCH[@]}" --kernel_head_dims 64,128 --kernel_list sdpa,hfa_A2,linear \
    --jsonl "$OUT/bench_kernels.jsonl" --out "$OUT/bench_hfa_linear.json"

# --- 4. GPT-2-small training step per variant (smoke.json rewritten after every run) ------
SMOKE_ONLY="${SMOKE_ONLY:-sa,hfa,ha}"
section train_smoke "$PYTHON" tools/train_smoke.py --iters 10 --timeout 50 --out "$OUT" --only "$SMOKE_ONLY"

# --- 5. CUDA kernel tests (each test's result on its own line as it finishes) -------------
# (the GPU image has pytest; elsewhere: pip install pytest, or skip this section)
section kernel_tests "$PYTHON" -m pytest -v -p no:cacheprovider -k "$KERNEL_TEST_SELECTION" $KERNEL_TESTS \
    --junitxml="$OUT/kernel_tests.xml"

# --- 6. the training loop: host-device syncs as many for 16 steps as for 6 ----------------
section train_sync "$PYTHON" tools/train_smoke.py --sync_check

# --- the report: always, within the REPORT seconds kept for it -----------------------------
timeout "$REPORT" "$PYTHON" tools/gpu_report.py "$OUT" || echo "the report could not be written (exit $?)"
echo "total $(( $(date +%s) - T_START ))s; summary in $SUMMARY; the report to send: $OUT/gpu_check.md"
