"""
Compile every Triton kernel of attention_kernels/ (HA, HFA, linear) for NVIDIA GPUs
without one, and read the compiled artefacts: Triton's front end, its GPU passes, ptxas
and cuobjdump (shipped with the triton wheel) run on any Linux machine.

    python tools/compile_check.py                    # sm_90 (H100/H200) and sm_80 (A100)
    python tools/compile_check.py --arch 90 --quick  # bf16/fp32, dh 64/128
    python tools/compile_check.py --only ha --dtypes bf16 --dh 64 --json out.json

Per kernel and configuration (the wrappers' own tile sizes, warps and stages) it prints:
  regs     registers per thread (ptxas; 255 at most)
  spill    bytes of stack frame: Triton kernels have no local arrays, so a frame is spilled
           registers (STL: the number of local stores in the code)
  smem     shared memory the kernel allocates (Triton's own count, the launch's dynamic
           shared memory), against the per-block limit: 232,448 B on sm_90, 166,912 on sm_80
  mma/step the inner loop's tensor-core work, read from the SASS: every HGMMA (sm_90,
           per warp group of 4 warps) or HMMA (sm_80, per warp) between a loop's label and
           its back edge, as FLOPs, divided by one tile matmul of the step (2 x rows x
           cols x head block): "6.0 (formula 6)" means no tile is computed twice
  est      sm_90 only, loop-only: the fraction of the dense bf16 peak the fastest loop
           reaches (tensor time against instruction issue and the exp unit, midway between
           full and no overlap), times formula/executed
  whole program  sm_90, bf16/fp16: tools/program_model.py's figures for the launch at
           T = 4096 and --heads heads: est's fraction over the whole launch, cycles,
           programs, CTAs per SM, instructions, barriers and wgmma waits per program,
           global loads per second
and per operation the loop-only and the whole-program forward, backward and forward +
backward fractions of the peak (docs/performance.md). Integer arguments are compiled with
the divisibility hints the launch gives at run time (--no_hints: plain i32, as before).

It fails (exit 1) on a compile error, on any spill in a bf16/fp16 configuration, and on
shared memory above the limit in any configuration.
"""

import argparse
import dataclasses
import itertools
import json
import os
import re
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
from attention_kernels.ha import triton as ha  # noqa: E402
from attention_kernels.hfa import triton as hfa  # noqa: E402
from attention_kernels.linear import triton as lin  # noqa: E402
from attention_kernels.linear import triton_chunked as lin_chunked  # noqa: E402
from tools import program_model  # noqa: E402

TT = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}
DTYPES = {v: k for k, v in TT.items()}
FP32_POINTERS = {'LSE', 'DELTA', 'O32', 'S', 'R'}  # S, R: the chunked linear kernel's states
FLOAT_SCALARS = {'scale', 'qk_scale'}
FP32_POINTERS |= {'PK', 'PV'}  # HA's fused backward: slot a's float32 partial sums
FP32_POINTERS |= {'W', 'SC'}  # HA's split 'fp16': per-row and per-head scales
SMEM_LIMIT = {90: 232448, 80: 166912}
# Hopper (H100 SXM): 132 SMs, 989 TFLOP/s dense bf16 at 1.83 GHz = 4096 FLOP per SM per
# cycle; 4 schedulers per SM issue one warp instruction a cycle each; MUFU (exp2) 16 lanes
# per SM per cycle.
SM90_MMA_FLOP_PER_CYCLE = 4096
SCHEDULERS = 4
MUFU_LANES_PER_CYCLE = 16


@dataclasses.dataclass
class Case:
    family: str
    name: str
    fn: object
    dtype: torch.dtype
    constexprs: dict
    warps: int
    stages: int
    rows: int      # one step's tile: rows x cols pairs, each a dot of length hd
    cols: int
    hd: int
    formula: int   # tile matmuls per step that the formula needs (no split, no duplicate)
    useful: int    # of which count as useful FLOPs (bench.py's convention: backward = 2 x forward)
    note: str = ''
    whole: bool = False  # a loop-free kernel (one program = one step): count its whole code
    split: int = 0  # tile matmuls per step that HA's split products add to the formula
    shape: dict = None   # the launch's shape (tools/program_model.py): T, causal, windows, A, dh


def signature(fn, dtype, constexprs):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = 'constexpr'
        elif name.isupper():
            sig[name] = '*fp32' if name in FP32_POINTERS else f'*{TT[dtype]}'
            if constexprs.get('SPLIT') == 3 and (name == 'KB' or name == 'VB' and 'O32' not in fn.arg_names):
                sig[name] = '*fp16'  # HA's split 'fp16': kb (and, in the backward, vb) in float16
        elif name in FLOAT_SCALARS:
            sig[name] = 'fp32'
        else:
            sig[name] = 'i32'
    return sig


HEADS = 16  # batch x heads of the modelled launch (tools/gpu_check.sh's B = 2, H = 8); --heads
HINTS = True  # --no_hints: every integer argument a plain i32, as before


def compile_case(case, target):
    sig = signature(case.fn, case.dtype, case.constexprs)
    attrs = {(i,): [['tt.divisibility', 16]] for i, n in enumerate(case.fn.arg_names) if sig[n].startswith('*')}
    constexprs = dict(case.constexprs)
    if HINTS and case.shape:  # what the launch's integers specialise to at run time
        for i, (n, v) in enumerate(program_model.launch_ints(case.fn.arg_names, case.shape, constexprs).items()):
            kind, spec = program_model.specialise(v)
            if kind == 'constexpr':
                sig[n], constexprs[n] = 'constexpr', v
            else:
                sig[n] = kind
                if spec == 'D':
                    attrs[(case.fn.arg_names.index(n),)] = [['tt.divisibility', 16]]
    src = ASTSource(fn=case.fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=target, options={'num_warps': case.warps, 'num_stages': case.stages})


def _tool(name):
    return os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', name)


def resource_usage(cubin):
    """{'REG': n, 'STACK': n, ...} from cuobjdump --dump-resource-usage."""
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_tool('cuobjdump'), '--dump-resource-usage', f.name], capture_output=True,
                             text=True).stdout
    line = [s for s in out.splitlines() if 'REG:' in s]
    words = line[0].split() if line else []
    return {k: int(v) for k, v in (w.split(':', 1) for w in words if ':' in w) if v.isdigit()}


MMA_RE = re.compile(r'\b(HGMMA|HMMA)\.(\d+)x?(\d*)x?(\d*)')


def mma_flops(ins):
    """FLOPs of one SASS tensor-core instruction for its executing unit (warp group or warp)."""
    m = re.search(r'\bHGMMA\.(\d+)x(\d+)x(\d+)', ins)
    if m:
        M, N, K = map(int, m.groups())
        return 2 * M * N * K
    m = re.search(r'\bHMMA\.(\d)(\d)(\d+)\.', ins)  # HMMA.16816 = m16 n8 k16, HMMA.1688 = m16 n8 k8
    if m:
        code = m.group(0)[5:-1]
        M, N, K = {'16816': (16, 8, 16), '1688': (16, 8, 8), '884': (8, 8, 4)}.get(code, (16, 8, 16))
        return 2 * M * N * K
    return 0


def inner_loops(sass):
    """The innermost loops of a SASS listing: [(instructions of the body)], each from a label
    to the branch back to it."""
    lines = [s.strip() for s in sass.splitlines() if s.strip()]
    labels, body = {}, []
    for s in lines:
        if re.match(r'^[\w.$]+:$', s):
            labels[s[:-1]] = len(body)
        else:
            body.append(s.split('\t', 1)[-1] if '\t' in s else s)
    loops = []
    for i, ins in enumerate(body):
        m = re.search(r'\bBRA\s+`?\(?([\w.$]+)\)?', ins)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            loops.append((labels[m.group(1)], i))
    inner = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    return [body[a:b + 1] for a, b in inner]


def instructions(sass):
    return [s.split('\t', 1)[-1] if '\t' in s else s for s in (x.strip() for x in sass.splitlines())
            if s and not re.match(r'^[\w.$]+:$', s)]


def loop_stats(sass, warps, whole=False):
    """Per innermost loop with tensor-core work (or the whole kernel, if `whole`): FLOPs per
    iteration for the whole block, instructions and MUFU.EX2 per warp."""
    out = []
    for loop in ([instructions(sass)] if whole else inner_loops(sass)):
        hg = sum(mma_flops(s) for s in loop if 'HGMMA' in s)
        hm = sum(mma_flops(s) for s in loop if 'HMMA' in s and 'HGMMA' not in s)
        flops = hg * (warps // 4) + hm * warps
        if flops:
            out.append(dict(flops=flops, mma_sync_flops=hm * warps, instr=len(loop), mufu=sum('MUFU.EX2' in s for s in loop),
                            mma_instr=sum(('HGMMA' in s or 'HMMA' in s) for s in loop),
                            stl=sum('STL' in s for s in loop)))
    return out


def model(loop, warps):
    """Cycles per step of one block on one SM (sm_90), and the fraction of peak:
    tensor time t_mma = FLOPs / 4096; issue time = instructions per warp x warps / 4
    schedulers; exp time = MUFU.EX2 per warp x 32 lanes x warps / 16. Full overlap:
    max of the three; none: t_mma + max(issue, exp). The estimate takes the mean of the two
    step times. Latencies (memory, barriers, dependent instructions) are not modelled."""
    # mma.sync (HMMA) on Hopper: counted at half the wgmma rate (an assumption: FlashAttention-2,
    # built on it, peaks near half of FlashAttention-3's throughput on H100)
    t_peak = loop['flops'] / SM90_MMA_FLOP_PER_CYCLE  # the executed FLOPs at the wgmma peak
    t_mma = (loop['flops'] + loop['mma_sync_flops']) / SM90_MMA_FLOP_PER_CYCLE
    t_issue = loop['instr'] * warps / SCHEDULERS
    t_exp = loop['mufu'] * 32 * warps / MUFU_LANES_PER_CYCLE
    best = max(t_mma, t_issue, t_exp)
    worst = t_mma + max(t_issue, t_exp)
    return dict(t_mma=t_peak, t_issue=t_issue, t_exp=t_exp, best=t_peak / best, worst=t_peak / worst,
                est=t_peak / ((best + worst) / 2))


def analyse(case, k, arch):
    usage = resource_usage(k.asm['cubin'])
    sass = k.asm['sass']
    loops = loop_stats(sass, case.warps, case.whole)
    unit = 2 * case.rows * case.cols * case.hd
    rec = dict(family=case.family, kernel=case.name, arch=arch, dtype=TT[case.dtype], warps=case.warps,
               stages=case.stages, config={k: v for k, v in case.constexprs.items()
                                           if k not in ('PREC', 'UP', 'DH', 'D')},
               note=case.note, regs=usage.get('REG', -1), spill=usage.get('STACK', 0),
               stl=sum('STL' in s for s in sass.splitlines()), smem=k.metadata.shared,
               smem_limit=SMEM_LIMIT.get(arch, SMEM_LIMIT[90]), formula=case.formula, useful=case.useful,
               split_matmuls=case.split, tile=(case.rows, case.cols, case.hd))
    if loops:
        # the steady state: the largest tensor work, then the fewest instructions (unmasked)
        main = min(loops, key=lambda L: (-L['flops'], L['instr']))
        rec['loops'] = [dict(L, tiles=L['flops'] / unit) for L in loops]
        rec['mma_per_step'] = main['flops'] / unit
        rec['instr_per_step'] = main['instr']
        rec['mufu_per_step'] = main['mufu']
        if arch >= 90 and case.dtype != torch.float32:
            m = model(main, case.warps)
            scale = case.formula / rec['mma_per_step']
            rec.update(t_mma=m['t_mma'], t_issue=m['t_issue'], t_exp=m['t_exp'],
                       est=m['est'] * scale, best=m['best'] * scale, worst=m['worst'] * scale,
                       cycles=m['t_mma'] / m['est'], pairs=case.rows * case.cols)
            # t_mma counts executed work; the fraction of peak counts the formula's
            rec['est'] = min(rec['est'], 1.0)
    else:
        rec['mma_per_step'] = 0.0
    if case.shape and arch >= 90 and case.dtype != torch.float32:
        try:  # the whole-program model (tools/program_model.py)
            prog = program_model.structure(sass, case.warps)
            traces, heads_fastest = program_model.traces(case.name, case.constexprs, case.shape)
            w = program_model.launch(prog, traces, rec['regs'], rec['smem'], case.shape.get('heads', 16), heads_fastest)
            per = w.pop('per_program')
            rec['whole'] = dict(w, shape=case.shape, barriers=per.bar, wgmma_waits=per.wait, instr=per.instr)
            if rec['mma_per_step']:  # as est: the executed tensor work at the dense peak, times formula/executed
                rec['whole']['est'] = program_model.fraction(w['executed_flops'], w['cycles']) * \
                    case.formula / rec['mma_per_step']
        except (KeyError, ValueError) as e:
            rec['whole'] = dict(error=str(e))
    return rec


# -----------------------------------------------------------------------------
# the configurations the wrappers choose, from what the kernel modules export (their
# tile functions and kernels): per kernel its constexprs, launch options and the step
# of its inner loop, with the tile matmuls per step that the formula needs, of which useful

def ha_plan(Tq, Tk, dh, wa, wb, dtype=torch.bfloat16, arch=90, causal=True):
    """The tiles ha3_forward / ha3_backward take on that GPU (no offset)."""
    dp, fwd, dq, dqa, da, db = ha._configs(Tq, Tk, dh, wa, wb, None, dtype, arch)
    return dict(dp=dp, fwd=fwd, dq=dq, dqa=dqa, da=da, db=db, fused=ha._fused(dqa, Tq, Tk, 0, causal, wa))


def ha_kernels(p, dtype):
    """(name, kernel, configuration) of the forward and the backward kernels the plan runs."""
    yield 'ha_fwd', ha._ha3_fwd_kernel, dict(p['fwd'], KEEP32=dtype != torch.float32)  # SPLIT: ha_cases
    if p['fused']:
        yield 'ha_bwd_dqa', ha._ha3_bwd_dqa_kernel, ha._launch(p['dqa'], 0)
    else:
        yield 'ha_bwd_dq', ha._ha3_bwd_dq_kernel, p['dq']
        for part in p['da']['PARTS']:
            yield (('ha_bwd_da', 'ha_bwd_dka', 'ha_bwd_dva')[part], ha._ha3_bwd_da_kernel,
                   dict(ha._launch(p['da'], part), PART=part))
    for part in p['db']['PARTS']:
        yield (('ha_bwd_db', 'ha_bwd_dkb', 'ha_bwd_dvb')[part], ha._ha3_bwd_db_kernel,
               dict(ha._launch(p['db'], part), PART=part))


def ha_split_matmuls(name, split):
    """Tile matmuls per step that HA's split products add to a kernel's formula: one per
    operand taken as hi + lo ('logits': the logits', 'both': also dP's, where the kernel
    forms dP); 'none' and 'fp16' none."""
    if split in (0, 3):
        return 0
    if name == 'ha_fwd' or name in ('ha_bwd_dva', 'ha_bwd_dvb'):
        return 1
    return split


def ha_step(name, c):
    """(rows, cols, tile matmuls per step that the formula needs, of which useful by the
    convention backward = 2 x forward) of an HA kernel. A step is one tile of (lane, b key)
    pairs; each split operand adds one matmul (ha_split_matmuls)."""
    if name == 'ha_fwd':
        return c['G'] * c['BA'], c['BB'], 2, 2
    if name == 'ha_bwd_dq':  # logits, dP, Gk = dS kb
        return c['G'] * c['BA'], c['BB'], 3, 1
    if name == 'ha_bwd_dqa':  # logits, dP, Gk, Gv: dq's and slot a's
        return c['G'] * c['BA'], c['BB'], 4, 3
    if name == 'ha_bwd_da':  # logits, dP, Gk, Gv = P vb
        return c['JA'] * c['BU'], c['BB'], 4, 2
    if name == 'ha_bwd_dka':  # logits, dP, Gk
        return c['JA'] * c['BU'], c['BB'], 3, 1
    if name == 'ha_bwd_dva':  # logits, Gv
        return c['JA'] * c['BU'], c['BB'], 2, 1
    if name == 'ha_bwd_dkb':  # logits^T, dP^T, dkb = dS^T A
        return c['BB'], c['G'] * c['BA'], 3, 1
    if name == 'ha_bwd_dvb':  # logits^T, dvb = P^T B
        return c['BB'], c['G'] * c['BA'], 2, 0
    return c['BB'], c['G'] * c['BA'], 4, 1  # logits^T, dP^T, dkb = dS^T A, dvb = P^T B


def ha_cases(dtypes, dhs, geometries, split_name='', arch=90):
    """HA order 3 at T = 4096: full causal and windows (512, 32) (the GPU configs' shape),
    and one non-causal case."""
    for dtype, dh, (T, w1, w2, causal) in itertools.product(dtypes, dhs, geometries):
        swap, wa, wb = ha._geometry(T, T, 0, causal, w1, w2)
        split = ha.SPLITS[split_name] if split_name and dtype != torch.float32 else ha.default_split(dtype)
        plan = ha_plan(T, T, dh, wa, wb, dtype, arch=arch, causal=causal)  # the tiles the wrapper takes on that GPU
        note = f"T={T} w=({w1},{w2}){'' if causal else ' noncausal'}"
        for kname, fn, c in ha_kernels(plan, dtype):
            c = dict(c)
            warps, stages = c.pop('num_warps'), c.pop('num_stages')
            rows, cols, formula, useful = ha_step(kname, c)
            cx = dict(DH=dh, DP=plan['dp'], PREC=common.dot_precision(dtype), UP=False, **c)
            if 'CAUSAL' in fn.arg_names:
                cx['CAUSAL'] = causal
            if 'SPLIT' in fn.arg_names:
                cx['SPLIT'] = min(split, 1) if kname == 'ha_fwd' and split != 3 else split
            yield Case('ha', kname, fn, dtype, cx, warps, stages, rows, cols, plan['dp'], formula, useful, note,
                       split=ha_split_matmuls(kname, split),
                       shape=dict(T=T, causal=causal, wa=wa, wb=wb, dh=dh, heads=HEADS))


def hfa_cases(dtype, BD, causal, arch):
    """HFA at A = 1..4: the forward, the dq kernel on its own tiles, dk/dv on theirs
    (hfa_backward: R rows kept, L rows per step)."""
    for A in [1, 2, 3, 4]:
        base = dict(A=A, CAUSAL=causal, D=BD, BD=BD, UP=False, PREC=common.dot_precision(dtype))
        note = f'A={A}' + ('' if causal else ' noncausal')
        shape = dict(T=4096, causal=causal, window=0, dh=BD, heads=HEADS, A=A)
        BM, BN, w, s = hfa.block_sizes('hfa_fwd', BD, A, dtype, arch)
        yield Case('hfa', 'hfa_fwd', hfa._hfa_fwd, dtype, dict(base, BM=BM, BN=BN, KEEP32=dtype != torch.float32),
                   w, s, BM, BN, BD, A + 1, A + 1, note, shape=shape)
        R, L, w, s = hfa.block_sizes('hfa_bwd_dq', BD, A, dtype, arch)
        yield Case('hfa', 'hfa_bwd_dq', hfa._hfa_bwd_dq, dtype, dict(base, BM=R, BN=L), w, s, R, L, BD, 2 * A + 1, A,
                   note, shape=shape)
        R, L, w, s = hfa.block_sizes('hfa_bwd', BD, A, dtype, arch)
        yield Case('hfa', 'hfa_bwd_dkdv', hfa._hfa_bwd_dkdv, dtype, dict(base, BM=L, BN=R), w, s, R, L, BD,
                   2 * A + 2, A + 2, note, shape=shape)


def linear_cases(dtype, BD, causal, arch):
    """Linear attention with and without linear_norm: the quadratic kernels, and where causal
    the chunked ones (full causal self-attention at long T). A chunked tile matmul is
    (BT x BD) @ (BD x BT); a step of its output and gradient kernels is one chunk (the whole
    program), of the state pass one chunk's dh x dh update. The chunked form's FLOPs are
    all useful: it computes the formula, regrouped."""
    prec = common.dot_precision(dtype)
    shape = dict(T=4096, causal=causal, window=0, dh=BD, heads=HEADS)
    for norm in [False, True]:
        base = dict(CAUSAL=causal, NORM=norm, D=BD, BD=BD, UP=False, PREC=prec)
        note = f'norm={norm}' + ('' if causal else ' noncausal')
        BM, BN, w, s = lin.block_sizes('linear_fwd', BD, dtype, arch)
        yield Case('linear', 'linear_fwd', lin._linear_fwd, dtype, dict(base, BM=BM, BN=BN), w, s, BM, BN, BD, 2, 2,
                   note, shape=shape)
        BM, BN, w, s = lin.block_sizes('linear_bwd', BD, dtype, arch)
        for name, fn, formula, useful in (('linear_bwd_dq', lin._linear_bwd_dq, 2, 1),
                                          ('linear_bwd_dkdv', lin._linear_bwd_dkdv, 4, 3)):
            yield Case('linear', name, fn, dtype, dict(base, BM=BM, BN=BN), w, s, BM, BN, BD, formula, useful, note,
                       shape=shape)
        if not causal:
            continue
        BT, (w, s) = lin_chunked.chunk_size(dtype, arch), lin_chunked._launch(BD, arch)
        meta = dict(D=BD, BD=BD, BT=BT, UP=False, PREC=prec)
        r = BD / BT  # a product with a dh x dh state, in tile matmuls
        for name, fn, cx, formula in (
                ('linear_chunk_states', lin_chunked._states, dict(NORM_Y=False, REVERSE=False), r),
                ('linear_chunk_states_rev', lin_chunked._states, dict(NORM_Y=norm, REVERSE=True), r),
                ('linear_chunk_fwd', lin_chunked._chunk_fwd, dict(NORM=norm), 2 + r),
                ('linear_chunk_bwd_dq', lin_chunked._chunk_bwd_dq, dict(NORM=norm), 2 + r),
                ('linear_chunk_bwd_dkdv', lin_chunked._chunk_bwd_dkdv, dict(NORM=norm), 4 + 2 * r)):
            yield Case('linear_chunked', name, fn, dtype, dict(meta, **cx), w, s, BT, BT, BD, formula, formula,
                       f'norm={norm}', whole=name != 'linear_chunk_states', shape=shape)


def hfa_linear_cases(dtypes, bds, causals, families, arch=90):
    for dtype, BD, causal in itertools.product(dtypes, bds, causals):
        if 'hfa' in families:
            yield from hfa_cases(dtype, BD, causal, arch)
        if 'linear' in families:
            yield from linear_cases(dtype, BD, causal, arch)


def cases(args, arch=90):
    fams = args.only.split(',')
    dtypes = [DTYPES[d] for d in args.dtypes.split(',')] if args.dtypes else (
        [torch.bfloat16, torch.float32] if args.quick else [torch.bfloat16, torch.float16, torch.float32])
    dhs = [int(d) for d in args.dh.split(',')] if args.dh else ([64, 128] if args.quick else [16, 32, 64, 128])
    if 'ha' in fams:
        geos = [(4096, 512, 32, True), (4096, 0, 0, True)]
        if not args.quick:
            geos.append((4096, 0, 0, False))
        if args.ha_geometry:
            geos = [g for g in geos if args.ha_geometry == ('windows' if g[1] else 'full' if g[3] else 'noncausal')]
        yield from ha_cases(dtypes, dhs, geos, args.ha_split, arch)
    yield from hfa_linear_cases(dtypes, dhs, [True] if args.quick else [True, False], fams, arch)


def check(rec):
    """Problems of one compiled configuration (empty: fine)."""
    bad = []
    if rec['spill'] > 0 and rec['dtype'] != 'fp32':
        bad.append(f"{rec['spill']} B spilled")
    if rec['smem'] > rec['smem_limit']:
        bad.append(f"shared memory {rec['smem']} B > {rec['smem_limit']} B")
    return bad


def summary(recs):
    """Per family, dtype, head block and configuration on sm_90: the forward, backward and
    forward + backward fraction of the dense peak by the model, from each kernel's cycles per
    (row, column) pair of its step. Useful FLOPs per pair: forward = the formula's useful
    tile matmuls x 2 x head block; backward = 2 x forward (bench.py's convention)."""
    groups = {}
    for r in recs:
        if 'cycles' in r:
            groups.setdefault((r['family'], r['dtype'], r['tile'][2], r['note']), []).append(r)
    out = []
    for (fam, dt, hd, note), rs in groups.items():
        fwd = [r for r in rs if r['kernel'].endswith('_fwd')]
        bwd = [r for r in rs if not r['kernel'].endswith('_fwd')]
        if fam == 'linear_chunked':  # its steps are not (row, column) pairs: whole program only
            out.append(dict(family=fam, dtype=dt, hd=hd, note=note, whole=program_model.op_summary(
                fam, [r for r in rs if r['kernel'] in ('linear_chunk_states', 'linear_chunk_fwd')],
                [r for r in rs if r['kernel'] not in ('linear_chunk_fwd',)])))
            continue
        if len(fwd) != 1 or not bwd:
            continue
        per_pair = lambda r: r['cycles'] / r['pairs']
        useful = fwd[0]['useful'] * 2 * hd  # FLOPs per pair of the forward
        c_f, c_b = per_pair(fwd[0]), sum(per_pair(r) for r in bwd)
        whole = program_model.op_summary(fam, fwd, bwd)
        out.append(dict(family=fam, dtype=dt, hd=hd, note=note, whole=whole, fwd=useful / (SM90_MMA_FLOP_PER_CYCLE * c_f),
                        bwd=2 * useful / (SM90_MMA_FLOP_PER_CYCLE * c_b),
                        fwd_bwd=3 * useful / (SM90_MMA_FLOP_PER_CYCLE * (c_f + c_b)),
                        bwd_mma_per_step=sum(r['mma_per_step'] for r in bwd),
                        cycles_per_pair=dict(fwd=c_f, bwd=c_b)))
    return out


def line(rec):
    cfg = ' '.join(f'{k}={v}' for k, v in rec['config'].items() if k not in ('CAUSAL',))
    s = (f"sm_{rec['arch']} {rec['kernel']:<14} {rec['dtype']:<4} {rec['note']:<22} {cfg} w={rec['warps']}"
         f" s={rec['stages']}: regs {rec['regs']} spill {rec['spill']} smem {rec['smem']}"
         f" mma/step {rec['mma_per_step']:.1f} (formula {rec['formula']})")
    if 'est' in rec:
        s += f" est {100 * rec['est']:.0f}% [{100 * rec['worst']:.0f}-{100 * rec['best']:.0f}]"
    w = rec.get('whole')
    if w and 'error' in w:
        s += f" | whole program: n/a ({w['error']})"
    elif w:
        s += (f" | whole program:{' %.0f%%,' % (100 * w['est']) if 'est' in w else ''}"
              f" {w['cycles'] / 1e3:.0f}k cycles, {w['programs']} programs, {w['ctas_per_sm']} CTA/SM,"
              f" per program {w['instr']:.0f} instr, {w['barriers']:.0f} barriers, {w['wgmma_waits']:.0f} wgmma waits,"
              f" loads {w['load_bytes'] / w['cycles'] * program_model.CLOCK_HZ / 1e12:.1f} TB/s")
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--arch', default='90,80', help='comma list of compute capabilities')
    p.add_argument('--quick', action='store_true', help='bf16 and fp32, head sizes 64 and 128, causal only')
    p.add_argument('--only', default='ha,hfa,linear', help='kernel families (comma list)')
    p.add_argument('--dtypes', default='', help='e.g. bf16,fp32 (default: all, or --quick\'s)')
    p.add_argument('--dh', default='', help='head sizes, e.g. 64,128')
    p.add_argument('--json', default='', help='write every record to this file')
    p.add_argument('--ha_geometry', default='', choices=['', 'windows', 'full', 'noncausal'],
                   help='HA at T = 4096 with windows (512, 32), full causal or non-causal (default: all)')
    p.add_argument('--ha_split', default='', choices=['', *ha.SPLITS],
                   help="HA backward's lane-product split (default: the wrapper's)")
    p.add_argument('--heads', type=int, default=HEADS, help='batch x heads of the modelled launch')
    p.add_argument('--no_hints', action='store_true',
                   help='compile every integer argument as a plain i32 (no run-time divisibility hints)')
    args = p.parse_args()
    globals().update(HEADS=args.heads, HINTS=not args.no_hints)  # read by the case builders and compile_case
    failed, recs, t0 = 0, [], time.time()
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    for arch in [int(a) for a in args.arch.split(',')]:
        target = GPUTarget('cuda', arch, 32)
        for case in cases(args, arch):
            try:
                rec = analyse(case, compile_case(case, target), arch)
            except Exception as e:  # report every failure, then exit non-zero
                failed += 1
                msg = str(e).strip().splitlines()
                print(f"FAIL  sm_{arch} {case.name} {TT[case.dtype]} {case.note}: {type(e).__name__}: "
                      f"{msg[-1] if msg else ''}", flush=True)
                continue
            recs.append(rec)
            bad = check(rec)
            failed += bool(bad)
            print(f"{'BAD ' if bad else 'ok  '}  {line(rec)}{'  <- ' + '; '.join(bad) if bad else ''}", flush=True)
    summ = summary([r for r in recs if r['arch'] == 90])
    for x in summ:
        head = f"model sm_90 {x['family']:<6} {x['dtype']} hd={x['hd']} {x['note']:<22}:"
        if 'fwd' in x:
            print(f"{head} loop-only: forward {100 * x['fwd']:.0f}%, backward {100 * x['bwd']:.0f}%"
                  f" ({x['bwd_mma_per_step']:.1f} tile matmuls per step), forward + backward {100 * x['fwd_bwd']:.0f}%")
        w = x['whole']
        if w and x['family'] == 'linear_chunked':  # O(T dh^2): its time against the quadratic kernel's
            quad = [y['whole'] for y in summ if y['family'] == 'linear' and y['dtype'] == x['dtype']
                    and y['hd'] == x['hd'] and y['note'] == x['note'] and y['whole']]
            vs = f", {(w['fwd_us'] + w['bwd_us']) / (quad[0]['fwd_us'] + quad[0]['bwd_us']):.2f}x the quadratic" \
                f" kernel's time" if quad else ''
            print(f"{head} whole program: {w['fwd_us']:.0f} + {w['bwd_us']:.0f} us at {w['heads']} heads{vs}")
        elif w:
            print(f"{head} whole program: forward {100 * w['fwd']:.0f}%, backward {100 * w['bwd']:.0f}%,"
                  f" forward + backward {100 * w['fwd_bwd']:.0f}% of the dense peak"
                  f" ({w['fwd_us']:.0f} + {w['bwd_us']:.0f} us at {w['heads']} heads)")
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(triton=triton.__version__, records=recs, summary=summ), f, indent=1)
    n_bad = sum(bool(check(r)) for r in recs)
    print(f"{len(recs) - n_bad} ok, {failed} failed or over a limit, in {time.time() - t0:.0f} s")
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
