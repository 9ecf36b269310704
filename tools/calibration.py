"""
Calibrate tools/program_model.py against kernels whose H100 speed is published: the model's
figure for a kernel at the published shape against the published TFLOP/s.

    python tools/calibration.py                       # plain flash attention (our HFA, A = 1)
    python tools/calibration.py --simplicial PATH     # also FBGEMM's 2-simplicial Triton forward,
                                                      # PATH = a local copy of its fwd.py

Flash attention: our HFA kernel with A = 1 is a Triton flash-attention forward (one score
tile, online softmax); it is modelled at the shapes of the FlashAttention-3 paper's forward
benchmark (Shah et al. 2024, arXiv 2407.08608, Figure 5: H100 80GB SXM5, BF16, batch x
sequence = 16k tokens, hidden 2048 = heads x head dim; FLOPs 4 x T^2 x dh per head, half
with causality) and compared with that figure's FlashAttention-2 and Triton bars.

2-simplicial: FBGEMM's Triton forward (fbgemm_gpu/experimental/simplicial_attention,
simplicial/ops/triton/fwd.py; not part of this project, read from a path given) at its
benchmark grid (benchmarks/bench_fwd.py: B = 4, w1 = 32, D = 128, one K/V head, N = 1k-16k,
Hq = 64, 128, w2 = 256, 512, 1024; FLOPs by simplicial/utils.py, 4 x D per visible
(query, k1, k2) triple as ours), against the 337 TFLOP/s "peak" of the PyTorch blog
"Fast 2-Simplicial Attention: Hardware-Efficient Kernels in TLX": the model's highest
figure over that grid is compared with it.
"""

import argparse
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import compile_check as cc  # noqa: E402  (sets up triton for compiling)
from tools import program_model as pm  # noqa: E402

PEAK_TFLOPS = pm.SMS * pm.MMA_FLOP_PER_CYCLE * pm.CLOCK_HZ / 1e12  # 989

# FlashAttention-3 paper, Figure 5 (forward, BF16, H100 SXM5), sequence length 4k: TFLOP/s
# of FlashAttention-2 and of Triton's fused attention, per (causal, head dim)
FA3_FIG5 = {(False, 64): dict(fa2=321, triton=400), (False, 128): dict(fa2=368, triton=389),
            (True, 64): dict(fa2=284, triton=363), (True, 128): dict(fa2=319, triton=353)}
SIMPLICIAL_PEAK = 337


def flash_rows(T=4096):
    """Our HFA A = 1 forward at the FlashAttention-3 paper's shapes: model and published."""
    import argparse as ap
    args = ap.Namespace(only='hfa', dtypes='bf16', dh='64,128', quick=False, ha_geometry='', ha_split='')
    target = cc.GPUTarget('cuda', 90, 32)
    rows = []
    for case in cc.cases(args, 90):
        if case.name != 'hfa_fwd' or not case.note.startswith('A=1'):
            continue
        dh, causal = case.shape['dh'], case.shape['causal']
        heads = (16384 // T) * (2048 // dh)
        case.shape = dict(case.shape, T=T, heads=heads)
        rec = cc.analyse(case, cc.compile_case(case, target), 90)
        u = pm.useful_forward('hfa', dh, T, causal, A=1) * heads
        model = pm.fraction(u, rec['whole']['cycles']) * PEAK_TFLOPS
        loop_only = rec['est'] * PEAK_TFLOPS
        for ref, pub in FA3_FIG5[(causal, dh)].items():
            rows.append(dict(reference=f"{'FlashAttention-2' if ref == 'fa2' else 'Triton'} forward",
                             source='FlashAttention-3 paper, Fig. 5', shape=f"{'causal' if causal else 'non-causal'},"
                             f" hd {dh}, T {T}, {16384 // T} x {2048 // dh} heads", published=pub, model=model,
                             loop_only=loop_only, ratio=pub / model, regs=rec['regs'], ctas=rec['whole']['ctas_per_sm'],
                             overlap=pm.fraction(u, rec['whole']['cycles_overlap']) * PEAK_TFLOPS,
                             l2=rec['whole']['load_bytes'] / rec['whole']['cycles'] * pm.CLOCK_HZ / 1e12))
    return rows


def simplicial_rows(path, heads_q=(64, 128), w2s=(256, 512, 1024), seqs=(1024, 2048, 4096, 8192, 16384)):
    """FBGEMM's 2-simplicial Triton forward over its benchmark grid (B = 4, w1 = 32, D = 128)."""
    spec = importlib.util.spec_from_file_location('simplicial_fwd', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = mod._gqa_pack_fwd_kernel.fn  # under its autotuner: one config (BLOCK_SIZE_KV 64, stages 16 / 1, 4 warps)
    target = cc.GPUTarget('cuda', 90, 32)
    B, w1, D, BKV = 4, 32, 128, 64
    best = None
    for hq in heads_q:
        for w2 in w2s:
            for N in seqs:
                cx = dict(w1=w1, w2=w2, BLOCK_SIZE_Q=hq, BLOCK_SIZE_KV=BKV, HEAD_DIM=D, INPUT_PRECISION='tf32',
                          SM_SCALE=1.44269504 * D ** -0.5, K2_BIAS=1.0 / D, V2_BIAS=1.0, num_stages_0=16,
                          num_stages_1=1)
                ints = dict(bs=B, seq_len=N, num_heads=hq,
                            q_stride_b=N * hq * D, q_stride_s=hq * D, q_stride_k=D, q_stride_h=1,
                            out_stride_b=N * hq * D, out_stride_s=hq * D, out_stride_k=D, out_stride_h=1,
                            m_stride_b=hq * N, m_stride_k=N, m_stride_s=1)
                for t in ('k1', 'k2', 'v1', 'v2'):
                    ints.update({f'{t}_stride_b': N * D, f'{t}_stride_s': D, f'{t}_stride_k': D, f'{t}_stride_h': 1})
                sig, attrs = {}, {}
                for i, name in enumerate(fn.arg_names):
                    if name in cx:
                        sig[name] = 'constexpr'
                    elif name.endswith('_ptr'):
                        sig[name] = '*fp32' if name == 'M_ptr' else '*bf16'
                        attrs[(i,)] = [['tt.divisibility', 16]]
                    else:
                        kind, sp = pm.specialise(ints[name])
                        if kind == 'constexpr':
                            sig[name], cx[name] = 'constexpr', ints[name]
                        else:
                            sig[name] = kind
                            if sp == 'D':
                                attrs[(i,)] = [['tt.divisibility', 16]]
                src = cc.ASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs)
                k = cc.triton.compile(src, target=target, options={'num_warps': 4})
                regs = cc.resource_usage(k.asm['cubin']).get('REG', 255)
                prog = pm.structure(k.asm['sass'], 4, ifs=True)
                traces = []
                for q in range(N):  # program q: kv1 in [q - w1 + 1, q]; kv2 in [q - w2 + 1, q] by blocks,
                    n2 = min(N, q + 1) - max(0, q - w2 + 1)  # the last, partial one masked (its `if`)
                    inner = -(-n2 // BKV) - (1 if n2 % BKV else 0)
                    traces.append((((inner, int(n2 % BKV > 0)),) * (min(N, q + 1) - max(0, q - w1 + 1)),))
                w = pm.launch(prog, traces, regs, k.metadata.shared, B, heads_fastest=False)
                u = _simplicial_flops(B, N, hq, D, w1, w2)
                tf = pm.fraction(u, w['cycles']) * PEAK_TFLOPS
                spill = cc.resource_usage(k.asm['cubin']).get('STACK', 0)
                row = dict(reference='2-simplicial Triton forward (FBGEMM)', source='PyTorch blog (TLX), peak',
                           shape=f'N {N}, Hq {hq}, w2 {w2}, B 4, w1 32, D 128', published=SIMPLICIAL_PEAK, model=tf,
                           ratio=SIMPLICIAL_PEAK / tf, regs=regs, spill=spill, loop_only=None, ctas=w['ctas_per_sm'],
                           overlap=pm.fraction(u, w['cycles_overlap']) * PEAK_TFLOPS,
                           l2=w['load_bytes'] / w['cycles'] * pm.CLOCK_HZ / 1e12)
                print(f"  simplicial N={N} Hq={hq} w2={w2}: regs {regs}, spill {spill} B, model {tf:.0f} TFLOP/s",
                      flush=True)
                if best is None or tf > best['model']:
                    best = row
    return [best]


def _simplicial_flops(B, N, Hq, D, w1, w2):
    """FBGEMM's FLOP convention (simplicial/utils.py), restated: 4 D per (query, k1, k2) in
    the windows, the first w1 and w2 queries counted as half and quarter windows."""
    per = 4 * B * Hq * D  # FLOPs per triple
    first = per * w1 * w1 * w1 / 4
    if N <= w1:
        return per * N ** 3 / 4
    if N <= w2:
        return per * (N - w1) * w1 * (N - w1) / 2 + first
    return per * ((N - w1 - w2) * w1 * w2 + (w2 - w1) * w1 * w2 / 2) + first


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--simplicial', default='', help="path to FBGEMM's simplicial/ops/triton/fwd.py")
    p.add_argument('--T', type=int, default=4096)
    args = p.parse_args()
    rows = flash_rows(args.T)
    if args.simplicial:
        rows += simplicial_rows(args.simplicial)
    print('| reference | source | shape | published TFLOP/s | model (whole program) | published / model |'
          ' loop-only model | CTAs per SM | with CTA overlap (ratio) | loads at the model\'s speed, TB/s |')
    print('|---|---|---|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        lo = f"{r['loop_only']:.0f}" if r['loop_only'] else '-'
        print(f"| {r['reference']} | {r['source']} | {r['shape']} | {r['published']} | {r['model']:.0f}"
              f" | {r['ratio']:.2f} | {lo} | {r['ctas']} | {r['overlap']:.0f} ({r['published'] / r['overlap']:.2f})"
              f" | {r['l2']:.1f} |")
    ratios = [r['ratio'] for r in rows]
    print(f"calibration: published / model from {min(ratios):.2f} to {max(ratios):.2f}")


if __name__ == '__main__':
    main()
