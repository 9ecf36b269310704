"""
Compile the Triton kernels of attention_kernels/hfa/triton.py and attention_kernels/linear/triton.py for NVIDIA
GPUs without one: Triton's front end, its GPU passes and ptxas (shipped with the triton
wheel) run on any Linux machine. This catches what the CPU interpreter cannot (typing of
loop-carried values, register limits, unsupported ops) before GPU time is spent.

    python tools/compile_check.py                 # sm_90 (H100/H200) and sm_80 (A100)
    python tools/compile_check.py --arch 90 --quick

Every configuration the wrappers can choose is compiled: dtypes, head blocks 16..128,
A = 1..4, causal or not, linear_norm, with the wrappers' own tile sizes and warps.
Prints one line per kernel and configuration, registers and spills from ptxas, and exits
non-zero if any fails.
"""

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time

os.environ.pop('TRITON_INTERPRET', None)  # compile, do not interpret
os.environ.setdefault('TRITON_DEFAULT_FP_FUSION', '1')  # triton 3.9 warns when unset; 1 is its default
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from attention_kernels import triton_common as common  # noqa: E402
from attention_kernels.hfa import triton as hfa  # noqa: E402
from attention_kernels.linear import triton as lin  # noqa: E402

TT = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}
FP32_POINTERS = {'LSE', 'DELTA', 'O32'}
FLOAT_SCALARS = {'scale'}


def signature(fn, dtype, constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = 'constexpr'
        elif name.isupper() or name in ('Q', 'K', 'V', 'O'):
            sig[name] = '*fp32' if name in FP32_POINTERS else f'*{TT[dtype]}'
        elif name in FLOAT_SCALARS:
            sig[name] = 'fp32'
        else:
            sig[name] = 'i32'
    return sig


def compile_one(fn, dtype, constexprs, warps, stages, target):
    sig = signature(fn, dtype, constexprs)
    attrs = {(i,): [['tt.divisibility', 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith('*')}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=target, options={'num_warps': warps, 'num_stages': stages})
    return resource_usage(k.asm['cubin'])


def resource_usage(cubin):
    """'REG:n STACK:n SHARED:n LOCAL:n' from cuobjdump (in the triton wheel); LOCAL > 0 is spilling."""
    tool = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, '--dump-resource-usage', f.name], capture_output=True, text=True).stdout
    line = [s for s in out.splitlines() if 'REG:' in s]
    return ' '.join(w for w in line[0].split() if w.split(':')[0] in ('REG', 'STACK', 'SHARED', 'LOCAL')) if line else '?'


def cases(quick):
    dtypes = [torch.bfloat16, torch.float32] if quick else [torch.bfloat16, torch.float16, torch.float32]
    bds = [64, 128] if quick else [16, 32, 64, 128]
    for dtype, BD, causal in itertools.product(dtypes, bds, [True] if quick else [True, False]):
        prec = common.dot_precision(dtype)
        for A in ([1, 2, 4] if quick else [1, 2, 3, 4]):
            base = dict(A=A, CAUSAL=causal, D=BD, BD=BD, UP=False, PREC=prec)
            BM, BN, w, s = common.block_sizes('hfa_fwd', BD, A, dtype)
            yield 'hfa_fwd', hfa._hfa_fwd, dtype, dict(base, BM=BM, BN=BN, KEEP32=dtype != torch.float32), w, s
            BM, BN, w, s = common.block_sizes('hfa_bwd', BD, A, dtype)
            yield 'hfa_bwd_dq', hfa._hfa_bwd_dq, dtype, dict(base, BM=BM, BN=BN), w, s
            yield 'hfa_bwd_dkdv', hfa._hfa_bwd_dkdv, dtype, dict(base, BM=BM, BN=BN), w, s
        for norm in [False, True]:
            base = dict(CAUSAL=causal, NORM=norm, D=BD, BD=BD, UP=False, PREC=prec)
            BM, BN, w, s = common.block_sizes('linear_fwd', BD, 1, dtype)
            yield 'linear_fwd', lin._linear_fwd, dtype, dict(base, BM=BM, BN=BN), w, s
            BM, BN, w, s = common.block_sizes('linear_bwd', BD, 1, dtype)
            yield 'linear_bwd_dq', lin._linear_bwd_dq, dtype, dict(base, BM=BM, BN=BN), w, s
            yield 'linear_bwd_dkdv', lin._linear_bwd_dkdv, dtype, dict(base, BM=BM, BN=BN), w, s
    # an odd head size: D = 20 padded to BD = 32
    yield 'hfa_fwd_d20', hfa._hfa_fwd, torch.bfloat16, dict(A=2, CAUSAL=True, D=20, BD=32, UP=False, PREC='tf32',
                                                            BM=128, BN=64, KEEP32=True), 8, 3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--arch', default='90,80', help='comma list of compute capabilities')
    p.add_argument('--quick', action='store_true', help='fewer dtypes and head sizes')
    args = p.parse_args()
    failed, n, t0 = 0, 0, time.time()
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    for arch in [int(a) for a in args.arch.split(',')]:
        target = GPUTarget('cuda', arch, 32)
        for name, fn, dtype, constexprs, warps, stages in cases(args.quick):
            n += 1
            cfg = ' '.join(f'{k}={v}' for k, v in constexprs.items() if k in ('A', 'CAUSAL', 'NORM', 'BD', 'BM', 'BN'))
            try:
                usage = compile_one(fn, dtype, constexprs, warps, stages, target)
                print(f"ok    sm_{arch} {name:<16} {TT[dtype]:<5} {cfg} warps={warps}: {usage}", flush=True)
            except Exception as e:  # report every failure, then exit non-zero
                failed += 1
                msg = str(e).strip().splitlines()
                print(f"FAIL  sm_{arch} {name:<16} {TT[dtype]:<5} {cfg}: {type(e).__name__}: "
                      f"{msg[-1] if msg else ''}", flush=True)
    print(f"{n - failed}/{n} compiled in {time.time() - t0:.0f} s")
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
