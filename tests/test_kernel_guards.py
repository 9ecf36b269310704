"""
What protects the Triton kernels where only a GPU would show a problem:
- the guard (attention_kernels/guard.py): kernel='auto' falls back to PyTorch, per
  configuration class and with one line naming the error, when a Triton kernel fails to
  compile or launch, or disagrees with PyTorch in its first-use self-check (a perturbed
  output, or one perturbed gradient, is caught; a correct kernel passes silently);
  kernel='triton' raises; kernel_check=False trusts the kernel; two models with different
  settings in one process each keep their own rule; a compiled GPT runs the check;
- the PyTorch stand-ins (attention_kernels/fallback.py) equal the Triton kernels;
- HFA's factor offsets a * N T D are int64 (int32 wraps at 2^31), checked without
  allocating such tensors;
- bench.py's kernel rows reach disk one by one, and tools/gpu_check.sh's sections fit its
  8 minutes (its dry mode, which also runs where there is no GPU);
- HA (sm_90 and sm_80) and the chunked linear kernels (sm_90) compile at head size 64 in
  bf16 with no register spill, shared memory within the limit and no tile matmul computed twice
  (tools/compile_check.py).
On CPU the self-check runs in Triton's interpreter on tiny float32 shapes (guard.CHECK_DEVICES
is widened to 'cpu' here; by default it checks CUDA tensors only).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import attention_kernels
from attention_kernels import guard
from attention_kernels.ha import ops as ha_ops
from attention_kernels.hfa import ops as hfa_ops
from attention_kernels.linear import ops as linear_ops

TRITON_ERROR = attention_kernels.load_triton()  # on Linux an error fails the session (conftest.py)
if TRITON_ERROR is None:  # module level: a Triton kernel reads its names from its module's globals
    import triton
    import triton.language as tl
    from attention_kernels.triton_common import factor_offset
pytestmark = [pytest.mark.skipif(TRITON_ERROR is not None, reason=f'no usable triton: {TRITON_ERROR}'),
              pytest.mark.slow()]  # the Triton interpreter, compile_check.py, gpu_check.sh: make test, not make test-fast
DEV = 'cuda' if torch.cuda.is_available() else 'cpu'
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ['linear', 'hfa', 'ha']
ENTRIES = {'linear': ('linear_forward', 'linear_backward'), 'hfa': ('hfa_forward', 'hfa_backward'),
           'ha': ('ha3_forward', 'ha3_backward')}
GRAD_NAMES = {'linear': 'dk', 'hfa': 'dk', 'ha': 'dk1'}  # the gradient perturbed below (the second)


@pytest.fixture
def fresh_guard(monkeypatch):
    """No configuration class checked or replaced yet; the check also on CPU (the interpreter)."""
    monkeypatch.setattr(guard, '_replaced', {})
    monkeypatch.setattr(guard, '_checked', set())
    monkeypatch.setattr(guard, 'CHECK_DEVICES', ('cuda', 'cpu'))


def _lin_inputs(seed=0, T=9, dh=16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, T, dh, generator=g).to(DEV) for _ in range(4)]


def run_op(family, strict, check, seed=0):
    """One forward and backward of a family's Triton op (fp32, tiny): [out, *grads]."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(DEV).requires_grad_()
    if family == 'linear':
        xs = [rand(2, 9, 16) for _ in range(3)]
        out = linear_ops.linear_fwd(*xs, 0, True, 5, True, 0.25, False, strict, check)
    elif family == 'hfa':
        xs = [rand(2, 2, 9, 16), rand(2, 2, 9, 16), rand(2, 9, 16)]
        out = hfa_ops.hfa_fwd(*xs, 0, True, 4, 0.25, strict, check)[0]
    else:
        xs = [rand(2, 9, 16) for _ in range(5)]
        out = ha_ops.ha3_fwd(*xs, 0, True, 5, 3, 0.25, strict, check)[0]
    dout = torch.randn(out.shape, generator=g).to(DEV)
    return [out.detach()] + list(torch.autograd.grad(out, xs, dout))


def perturb(monkeypatch, family, which):
    """Make the family's Triton forward ('output') or backward ('gradient': its second
    gradient) 1% wrong; returns the list of calls the wrong kernel received."""
    module = attention_kernels._modules[family]
    name = ENTRIES[family][0 if which == 'output' else 1]
    real, calls = getattr(module, name), []

    def wrong(*args, **kwargs):
        calls.append(name)
        result = real(*args, **kwargs)
        (result[0] if which == 'output' and isinstance(result, tuple) else
         result if which == 'output' else result[1]).mul_(1.01)
        return result
    monkeypatch.setattr(module, name, wrong)
    return calls


def assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('family', FAMILIES)
def test_correct_kernel_passes_the_check_silently(fresh_guard, capfd, family):
    want = run_op(family, strict=True, check=False)
    got = run_op(family, strict=False, check=True)
    assert capfd.readouterr().err == ''
    assert {entry for entry, _ in guard._checked} == set(ENTRIES[family]) and not guard._replaced
    assert_same(got, want)


@pytest.mark.parametrize('which', ['output', 'gradient'])
@pytest.mark.parametrize('family', FAMILIES)
def test_wrong_kernel_is_caught_and_replaced_with_one_line(fresh_guard, capfd, monkeypatch, family, which):
    want, want_again = run_op(family, strict=True, check=False), run_op(family, strict=True, check=False, seed=1)
    calls = perturb(monkeypatch, family, which)
    got = run_op(family, strict=False, check=True)
    lines = capfd.readouterr().err.splitlines()
    entry = ENTRIES[family][0 if which == 'output' else 1]
    assert len(lines) == 1, lines
    assert f"Triton {entry} ({family}" in lines[0] and 'disagrees with PyTorch' in lines[0]
    assert f"{'out' if which == 'output' else GRAD_NAMES[family]} relative RMSE" in lines[0]
    assert 'float32 dh=16 causal window cpu sm_90 tiles' in lines[0]  # the configuration class
    assert_same(got, want)  # PyTorch's results, not the wrong ones
    again = run_op(family, strict=False, check=True, seed=1)  # that class stays with PyTorch, silently
    assert capfd.readouterr().err == '' and len(calls) == 1
    assert_same(again, want_again)


@pytest.mark.parametrize('which', ['output', 'gradient'])
@pytest.mark.parametrize('family', FAMILIES)
def test_triton_setting_raises_on_a_mismatch(fresh_guard, monkeypatch, family, which):
    perturb(monkeypatch, family, which)
    entry = ENTRIES[family][0 if which == 'output' else 1]
    with pytest.raises(guard.KernelMismatch, match=f"Triton {entry} .* disagrees with PyTorch.*kernel='triton' stops"):
        run_op(family, strict=True, check=True)
    assert not guard._replaced


def test_kernel_check_off_trusts_the_kernel(fresh_guard, capfd, monkeypatch):
    want = run_op('hfa', strict=True, check=False)
    perturb(monkeypatch, 'hfa', 'output')
    got = run_op('hfa', strict=False, check=False)
    assert capfd.readouterr().err == '' and not guard._checked
    torch.testing.assert_close(got[0], want[0] * 1.01)


def test_a_class_replaced_under_auto_raises_under_triton(fresh_guard, capfd, monkeypatch):
    perturb(monkeypatch, 'linear', 'output')
    run_op('linear', strict=False, check=True)
    assert len(capfd.readouterr().err.splitlines()) == 1
    with pytest.raises(guard.KernelMismatch, match="linear_forward .* disagrees"):
        run_op('linear', strict=True, check=True)


def test_auto_falls_back_on_a_launch_failure_with_one_line(fresh_guard, capfd, monkeypatch):
    mod = attention_kernels._modules['linear']
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("out of resource: shared memory, Required: 300000, Hardware limit: 232448\nmore")
    monkeypatch.setattr(mod, 'linear_forward', broken)
    q, k, v, _ = _lin_inputs()
    geo = (0, True, 0, False, 0.25)
    out = linear_ops.linear_fwd(q, k, v, *geo, False, False, True)
    again = linear_ops.linear_fwd(q, k, v, *geo, False, False, True)
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 1 and 'linear_forward' in lines[0] and 'out of resource' in lines[0]
    assert 'more' not in lines[0] and "kernel='auto' computes this configuration with PyTorch" in lines[0]
    assert len(calls) == 1  # not retried
    from attention_kernels import fallback
    torch.testing.assert_close(out, fallback.linear_forward(q, k, v, *geo))
    torch.testing.assert_close(again, out)
    with pytest.raises(guard.KernelMismatch, match='out of resource'):  # kernel='triton': no stand-in
        linear_ops.linear_fwd(q, k, v, *geo, False, True, True)


def test_triton_setting_raises_a_launch_failure(fresh_guard, monkeypatch):
    mod = attention_kernels._modules['linear']
    monkeypatch.setattr(mod, 'linear_forward', lambda *a, **k: (_ for _ in ()).throw(RuntimeError('no')))
    q, k, v, _ = _lin_inputs()
    with pytest.raises(RuntimeError, match='no'):
        linear_ops.linear_fwd(q, k, v, 0, True, 0, False, 0.25, False, True, True)
    assert not guard._replaced


def test_bad_arguments_are_not_swallowed(fresh_guard):
    q, k, v, _ = _lin_inputs()
    with pytest.raises(ValueError):
        linear_ops.linear_fwd(q, k, v.double(), 0, True, 0, False, 0.25, False, False, True)
    assert not guard._replaced


def tiny_gpt(kernel, **kw):
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=17, attention='linear', kernel=kernel,
                    **kw)
    return GPT(cfg).to(DEV, torch.float32)


def test_two_models_keep_their_own_settings(fresh_guard, capfd, monkeypatch):
    """A kernel='triton' model built before a kernel='auto' one still raises when its kernel
    fails (the last model built used to set the rule for all); the 'auto' one falls back
    (on CUDA, after one line) or, on CPU, never runs Triton; a 'torch' one never does."""
    strict, auto, plain = tiny_gpt('triton'), tiny_gpt('auto'), tiny_gpt('torch')
    mod = attention_kernels._modules['linear']
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError('launch failed')
    monkeypatch.setattr(mod, 'linear_forward', broken)
    idx = torch.randint(0, 17, (2, 12), generator=torch.Generator().manual_seed(1)).to(DEV)
    want, _ = plain(idx)
    assert not calls
    got, _ = auto(idx)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert len(calls) == (1 if DEV == 'cuda' else 0)
    assert len(capfd.readouterr().err.splitlines()) == len(calls)
    with pytest.raises(RuntimeError, match='launch failed'):
        strict(idx)
    assert len(calls) == (2 if DEV == 'cuda' else 1)


def test_model_runs_the_check_on_its_first_step(fresh_guard, capfd, monkeypatch):
    """GPT with kernel='triton': the first forward checks, a wrong kernel raises; with
    kernel_check=False the same model trusts it."""
    idx = torch.randint(0, 17, (2, 12), generator=torch.Generator().manual_seed(1)).to(DEV)
    _, loss = tiny_gpt('triton')(idx, targets=idx)
    loss.backward()
    assert {entry for entry, _ in guard._checked} == {'linear_forward', 'linear_backward'}
    perturb(monkeypatch, 'linear', 'output')
    monkeypatch.setattr(guard, '_checked', set())
    with pytest.raises(guard.KernelMismatch, match='linear_forward'):
        tiny_gpt('triton')(idx)
    tiny_gpt('triton', kernel_check=False)(idx)
    assert capfd.readouterr().err == ''


@pytest.mark.parametrize('name', ['linear', 'hfa_v1', 'ha_shared'])
def test_compiled_gpt_runs_the_check_outside_the_graph(fresh_guard, capfd, monkeypatch, name):
    """torch.compile(fullgraph=True) traces the ops by their fake implementations; the check
    runs from the eager implementation on the first compiled step (no graph break)."""
    from model import GPT, GPTConfig
    kw = {'linear': dict(attention='linear'), 'hfa_v1': dict(attention='hfa_v1'),
          'ha_shared': dict(attention='ha', ha_share_kv=True, ha_window1=5)}[name]
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=11, kernel='triton',
                          **kw)).to(DEV, torch.float32)
    idx = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(1)).to(DEV)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend='aot_eager', fullgraph=True)
        _, loss = compiled(idx, targets=idx)
        loss.backward()
    finally:
        torch._dynamo.reset()
    assert len(guard._checked) == 2 and not guard._replaced and capfd.readouterr().err == ''


@pytest.mark.skipif(sys.platform != 'linux', reason='off Linux (no triton wheel) the Triton tests may skip')
def test_a_broken_triton_fails_the_suite_on_linux(tmp_path):
    """A triton that cannot be imported stops the session with one line, rather than
    letting every Triton test skip and the run pass."""
    (tmp_path / 'triton').mkdir()
    (tmp_path / 'triton' / '__init__.py').write_text("raise ImportError('this triton is broken')\n")
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                        os.path.join(ROOT, 'tests', 'test_references.py'), '-k', 'naive_ha3'],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=ROOT,
                       timeout=300)
    assert r.returncode != 0
    lines = [x for x in (r.stdout + r.stderr).splitlines() if 'this triton is broken' in x]
    assert len(lines) == 1 and 'on Linux the Triton kernels must be tested' in lines[0], r.stdout + r.stderr
    assert 'passed' not in r.stdout


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
        o1, l1, _ = tri.ha3_forward(q, k, v, k, v, *geo)
        o2, l2, _ = fallback.ha3_forward(q, k, v, k, v, *geo)
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
    for x in ha:
        assert abs(x['mma_per_step'] - (x['formula'] + x['split_matmuls'])) < 1e-9, x
    # the whole-program model maps every sm_90 kernel's loops to its trip counts, and a whole
    # program (setup, masked steps, merge) is slower than its fastest loop
    summary = json.loads(out.read_text())['summary']
    assert all('cycles' in x['whole'] for x in ha if x['arch'] == 90)
    assert len(summary) == 1 and 0 < summary[0]['whole']['fwd'] < summary[0]['fwd']
    assert 0 < summary[0]['whole']['fwd_bwd'] < summary[0]['fwd_bwd']


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
    assert limits[:3] and sum(limits) + 5 * (len(limits) - 1) <= 480  # every section's kill grace; not the report's
    assert [x.split()[0] for x in r.stdout.splitlines()[1:4]] == ['environment', 'warm_cache', 'self_check']
    margin = int(r.stdout.split('margin ')[1].split('s')[0])
    assert 'fits' in r.stdout and margin >= 10


def _collected(args):
    r = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider', *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return {x for x in r.stdout.splitlines() if '::' in x}


def test_gpu_check_warms_every_kernel_test():
    """The warm-up's test groups, together, are the kernel_tests section's selection: no test
    there compiles its kernels cold."""
    import re
    script = open(os.path.join(ROOT, 'tools', 'gpu_check.sh')).read()
    files = re.search(r'KERNEL_TESTS="([^"]+)"', script).group(1).split()
    selection = re.search(r'KERNEL_TEST_SELECTION="([^"]+)"', script).group(1)
    groups = re.findall(r'"(tests/\S+ -k \S+)"', script)
    assert len(groups) >= 4
    warmed = set().union(*(_collected(g.split()) for g in groups))
    wanted = _collected([*files, '-k', selection])
    assert wanted and wanted == warmed


def test_self_check_tool(fresh_guard, monkeypatch, tmp_path, capsys):
    """tools/self_check.py in the interpreter: every class agrees; with HFA's forward made
    wrong, its classes say so (one record each) and the exit code is 1."""
    from tools import self_check
    out = tmp_path / 'sc.json'
    assert self_check.main(['--device', DEV, '--tiny', '--out', str(out)]) == 0
    recs = json.loads(out.read_text())
    assert len(recs) == 18 and {r['verdict'] for r in recs} == {'ok'}
    assert all(r['checked'] for r in recs if r['dtype'] == 'bfloat16')  # a class of its own each
    monkeypatch.setattr(guard, '_checked', set())
    perturb(monkeypatch, 'hfa', 'output')
    assert self_check.main(['--device', DEV, '--tiny', '--out', str(out)]) == 1
    bad = [r for r in json.loads(out.read_text()) if r['verdict'] != 'ok']
    assert {r['family'] for r in bad} == {'hfa'} and len(bad) == 6
    assert all('hfa_forward' in r['detail'] and 'out relative RMSE' in r['detail'] for r in bad)


def test_a_check_that_cannot_run_says_so_and_trusts_the_kernel(fresh_guard, capfd, monkeypatch):
    """A sequence too long for the float64 reference (here: the limit lowered) is not
    checked: one line says so, and the kernel's result is used."""
    want = run_op('linear', strict=True, check=False)
    monkeypatch.setattr(guard, 'MAX_SCORES', 80)  # 9 x 9 scores per head
    got = run_op('linear', strict=True, check=True)
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == 2 and all('not self-checked' in x and 'more than the check' in x for x in lines)
    assert not guard._replaced
    assert_same(got, want)
