"""
What protects the Triton kernels where only a GPU would show a problem:
- kernel='auto' falls back to PyTorch, once per entry point and with one warning line naming
  the error, when a Triton kernel fails to compile or launch; kernel='triton' raises;
- the PyTorch stand-ins (attention_kernels/fallback.py) equal the Triton kernels;
- HFA's factor offsets a * N T D are int64 (int32 wraps at 2^31), checked without
  allocating such tensors;
- bench.py's kernel rows reach disk one by one, and tools/gpu_check.sh's sections fit its
  8 minutes (its dry mode, which also runs where there is no GPU);
- HA (sm_90 and sm_80) and the chunked linear kernels (sm_90) compile at head size 64 in
  bf16 with no register spill, shared memory within the limit and no tile matmul computed twice
  (tools/compile_check.py).
"""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import attention_kernels

TRITON_ERROR = attention_kernels.load_triton()
if TRITON_ERROR is None:  # module level: a Triton kernel reads its names from its module's globals
    import triton
    import triton.language as tl
    from attention_kernels.triton_common import factor_offset
pytestmark = [pytest.mark.skipif(TRITON_ERROR is not None, reason=f'no usable triton: {TRITON_ERROR}'),
              pytest.mark.slow()]  # the Triton interpreter, compile_check.py, gpu_check.sh: make test, not make test-fast
DEV = 'cuda' if torch.cuda.is_available() else 'cpu'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh_policy(monkeypatch):
    """No entry point failed yet, kernel='auto'; restored afterwards."""
    monkeypatch.setattr(attention_kernels, '_failed', {})
    monkeypatch.setattr(attention_kernels, '_policy', {'fallback': True})


def _lin_inputs(seed=0, T=9, dh=16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, T, dh, generator=g).to(DEV) for _ in range(4)]


def test_auto_falls_back_once_with_one_line(fresh_policy, monkeypatch):
    mod = attention_kernels._modules['linear']
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("out of resource: shared memory, Required: 300000, Hardware limit: 232448\nmore")
    monkeypatch.setattr(mod, 'linear_forward', broken)
    q, k, v, _ = _lin_inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        out = attention_kernels.triton_module('linear').linear_forward(q, k, v, 0, True, 0, False, 0.25)
        again = attention_kernels.triton_module('linear').linear_forward(q, k, v, 0, True, 0, False, 0.25)
    lines = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(lines) == 1 and 'linear_forward' in lines[0] and 'out of resource' in lines[0]
    assert '\n' not in lines[0]
    assert len(calls) == 1  # not retried
    from attention_kernels import fallback
    torch.testing.assert_close(out, fallback.linear_forward(q, k, v, 0, True, 0, False, 0.25))
    torch.testing.assert_close(again, out)


def test_triton_kernel_raises(fresh_policy, monkeypatch):
    mod = attention_kernels._modules['linear']
    monkeypatch.setattr(mod, 'linear_forward', lambda *a, **k: (_ for _ in ()).throw(RuntimeError('no')))
    attention_kernels.prepare('triton')
    q, k, v, _ = _lin_inputs()
    with pytest.raises(RuntimeError, match='no'):
        attention_kernels.triton_module('linear').linear_forward(q, k, v, 0, True, 0, False, 0.25)


def test_bad_arguments_are_not_swallowed(fresh_policy):
    q, k, v, _ = _lin_inputs()
    with pytest.raises(ValueError):
        attention_kernels.triton_module('linear').linear_forward(q, k, v.double(), 0, True, 0, False, 0.25)
    assert not attention_kernels._failed


@pytest.mark.parametrize('family', ['linear', 'hfa', 'ha'])
def test_fallback_equals_triton(family):
    """The stand-ins give the Triton kernels' outputs and gradients (fp32, 1e-4)."""
    from attention_kernels import fallback
    tri = attention_kernels._modules[family]
    q, k, v, dout = _lin_inputs(seed=3)
    if family == 'linear':
        geo = (2, True, 5, True, 0.25)
        pairs = [(tri.linear_forward(q, k, v, *geo), fallback.linear_forward(q, k, v, *geo))]
        pairs += zip(tri.linear_backward(q, k, v, dout, *geo), fallback.linear_backward(q, k, v, dout, *geo))
    elif family == 'hfa':
        g = torch.Generator().manual_seed(4)
        qa, ka = (torch.randn(2, 2, 9, 16, generator=g).to(DEV) for _ in range(2))
        geo = (0, True, 4, 0.25)
        o1, l1, _ = tri.hfa_forward(qa, ka, v, *geo)
        o2, l2, _ = fallback.hfa_forward(qa, ka, v, *geo)
        pairs = [(o1, o2), (l1, l2)]
        pairs += zip(tri.hfa_backward(qa, ka, v, o1, l1, dout, *geo), fallback.hfa_backward(qa, ka, v, o2, l2, dout, *geo))
    else:
        geo = (0, True, 5, 3, 0.25)
        o1, l1 = tri.ha3_forward(q, k, v, k, v, *geo)
        o2, l2 = fallback.ha3_forward(q, k, v, k, v, *geo)
        pairs = [(o1, o2), (l1, l2)]
        pairs += zip(tri.ha3_backward(q, k, v, k, v, o1, l1, dout, *geo),
                     fallback.ha3_backward(q, k, v, k, v, o2, l2, dout, *geo))
    for a, b in pairs:
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_factor_offsets_are_int64():
    """HFA reads factor a of an (A, N, T, D) tensor at a * (N T D). With N T D = 2^30 + 7,
    3 * (N T D) passes 2^31: computed in int32 it wraps (shown below, so this test can
    fail), through factor_offset it does not. Nothing of that size is allocated."""
    @triton.jit
    def probe(OUT, stride, A: tl.constexpr):
        tl.store(OUT, factor_offset(stride, A))
        tl.store(OUT + 1, (stride * A).to(tl.int64))

    stride = 2 ** 30 + 7
    out = torch.zeros(2, dtype=torch.int64, device=DEV)
    probe[(1,)](out, stride, A=3)
    assert out[0].item() == 3 * stride
    assert out[1].item() != 3 * stride  # the int32 product wraps: the bug this guards against


@pytest.mark.skipif(sys.platform != 'linux', reason="the triton wheel's ptxas runs on Linux")
def test_ha_compiles_for_hopper_and_ampere_without_spills(tmp_path):
    """tools/compile_check.py for sm_90 and sm_80 (each with its own tiles): HA forward and
    backward (windows 512 x 32, T = 4096: the fused dq + slot-a kernel) at head size 64, bf16, in a child process (here
    triton is interpreted). It exits non-zero on a spill or on shared memory over the
    limit; every kernel must also run exactly the formula's tile matmuls per step, plus
    the split ones (none twice)."""
    out = tmp_path / 'cc.json'
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / 'cache'))
    env.pop('TRITON_INTERPRET', None)
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'compile_check.py'), '--arch', '90,80', '--only', 'ha',
                        '--dtypes', 'bf16', '--dh', '64', '--ha_geometry', 'windows',
                        '--json', str(out)], capture_output=True, text=True, env=env, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = json.loads(out.read_text())['records']
    ha = [x for x in recs if x['family'] == 'ha']
    # windows (512, 32): dq and slot a in the fused kernel
    assert {x['kernel'] for x in ha} == {'ha_fwd', 'ha_bwd_dqa', 'ha_bwd_db'}
    assert sorted(x['arch'] for x in ha) == [80] * 3 + [90] * 3
    assert all(x['spill'] == 0 and x['smem'] <= x['smem_limit'] for x in recs)
    ha_triton = attention_kernels._modules['ha']
    split = ha_triton.default_split(torch.bfloat16)
    for x in ha:
        assert abs(x['mma_per_step'] - (x['formula'] + ha_triton.split_matmuls(x['kernel'], split))) < 1e-9, x


@pytest.mark.skipif(sys.platform != 'linux', reason="the triton wheel's ptxas runs on Linux")
def test_chunked_linear_compiles_for_hopper_without_spills(tmp_path):
    """The chunked linear kernels (causal, head size 64, bf16, with and without linear_norm)
    compile for sm_90 without spills, each running exactly the formula's tile matmuls."""
    out = tmp_path / 'cc.json'
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / 'cache'))
    env.pop('TRITON_INTERPRET', None)
    r = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'compile_check.py'), '--arch', '90', '--only', 'linear',
                        '--quick', '--dtypes', 'bf16', '--dh', '64', '--json', str(out)],
                       capture_output=True, text=True, env=env, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    chunked = [x for x in json.loads(out.read_text())['records'] if x['family'] == 'linear_chunked']
    assert {x['kernel'] for x in chunked} == {'linear_chunk_states', 'linear_chunk_states_rev', 'linear_chunk_fwd',
                                              'linear_chunk_bwd_dq', 'linear_chunk_bwd_dkdv'}
    assert len(chunked) == 10  # norm False and True
    for x in chunked:
        assert x['spill'] == 0 and x['smem'] <= x['smem_limit'], x
        assert abs(x['mma_per_step'] - x['formula']) < 1e-9, x


def test_bench_writes_each_record_as_measured(tmp_path):
    import argparse
    import bench
    p = argparse.ArgumentParser()
    bench.add_kernel_args(p)
    path = tmp_path / 'rows.jsonl'
    args = p.parse_args(['--kernels_only', '--kernel_seq_lens', '16', '--kernel_head_dims', '16', '--kernel_batch', '1',
                         '--kernel_heads', '1', '--kernel_dtype', 'fp32', '--kernel_list', 'sdpa,linear',
                         '--kernel_min_time', '0', '--kernel_min_iters', '1', '--jsonl', str(path)])
    args.device = DEV
    assert bench.parse_kernel_args(args)
    records = bench.kernel_rows(args)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == len(records) == 6
    assert [(x['variant'], x['mode']) for x in lines] == [(r['variant'], r['mode']) for r in records]


def test_gpu_check_dry_mode_fits_eight_minutes():
    r = subprocess.run(['bash', os.path.join(ROOT, 'tools', 'gpu_check.sh'), '--dry'], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    limits = [int(x.split()[1]) for x in r.stdout.splitlines()[1:] if x.split() and x.split()[-1].isdigit()
              and len(x.split()) == 2]
    assert limits[:3] and sum(limits) + 5 * len(limits) <= 480
    assert 'fits' in r.stdout
