"""
The windowed HA form (attention_kernels/ha/windowed.py): each query's two windows gathered,
only its w1 x w2 visible pairs computed, its own backward from the logsumexp.

- values and gradients == the definition (ha/naive.py, float64): odd sizes, windows wider
  than T, the causal edge, decoding offsets, shared and separate keys, either window wider;
- the query chunks give the same numbers as one chunk, and backward saves nothing T x w1 x w2;
- bf16 / fp16 within 2x of SDPA's own error;
- ha_form and the dispatch rule: where 'auto' takes it, the model's setting, run.json's record.
"""

import json

import numpy as np
import pytest
import torch
from test_kernels import inputs, low_precision_errors, reference, sdpa_errors, value_and_grads

import attention_kernels
from attention_kernels.ha import ops, windowed
from model import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures('one_thread')
NAMES = ['out', 'dq', 'dk1', 'dk2', 'dv1', 'dv2']


def gathered(q, k1, k2, v1, v2, offset=0, window1=3, window2=2):
    return ops.windowed_attention(q, k1, k2, v1, v2, offset, True, window1, window2)


# (Tq, Tk, offset, w1, w2): odd windows, w2 > w1, windows wider than T, one-token decoding, a
# chunk after a prompt, windows of one, queries past the keys (they see nothing)
CASES = [(11, 11, 0, 3, 2), (7, 7, 0, 2, 5), (9, 9, 0, 16, 8), (6, 6, 0, 6, 6), (1, 10, 9, 4, 3),
         (4, 10, 6, 5, 2), (13, 13, 0, 1, 1), (4, 5, 3, 2, 2)]


@pytest.mark.parametrize('shared', [False, True], ids=['separate', 'shared'])
@pytest.mark.parametrize('Tq, Tk, offset, w1, w2', CASES)
def test_windowed_equals_the_definition(Tq, Tk, offset, w1, w2, shared):
    x = inputs(Tq, Tk, seed=Tq + 3 * Tk + w1, dh=5)
    if shared:  # one stream in both slots, as the model passes it: autograd sums the two
        def wrap(f):
            return lambda q, k, v: f(q, k, k, v, v)
        x = [x[0], x[1], x[3]]
    else:
        def wrap(f):
            return f
    want = value_and_grads(wrap(lambda *t: reference(*t, offset, True, w1, w2, True)), x, 1)
    got = value_and_grads(wrap(lambda *t: gathered(*t, offset, w1, w2)), x, 1)
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=name)


def test_many_query_chunks_give_the_numbers_of_one(monkeypatch):
    x = inputs(12, 12, seed=4, dh=6)
    one = value_and_grads(lambda *t: gathered(*t, 0, 4, 3), x, 2)
    monkeypatch.setitem(windowed.CHUNK_ELEMENTS, 'cpu', 2 * 2 * 4 * 3)  # 2 queries per chunk (B*H = 4)
    many = value_and_grads(lambda *t: gathered(*t, 0, 4, 3), x, 2)
    for name, a, b in zip(NAMES, many, one):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13, msg=name)


def test_backward_saves_nothing_the_size_of_the_pairs():
    """Autograd keeps the inputs, the output and the logsumexp: O(T dh) per head."""
    B, H, T, dh, w1, w2 = 1, 2, 16, 3, 8, 8  # T * w1 * w2 = 1024 > T * dh = 48
    x = [t.float() for t in inputs(T, T, seed=1, B=B, H=H, dh=dh)]
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        gathered(*x, 0, w1, w2)
    assert sizes and max(sizes) <= B * H * T * dh


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_windowed_low_precision_within_2x_of_sdpa(dtype):
    T, dh = 32, 16
    x = inputs(T, T, seed=21, dh=dh)
    got = low_precision_errors(lambda *t: gathered(*t, 0, 9, 4), x, dtype, 3)
    floor = sdpa_errors(T, T, dtype, 21, dh)
    for name, e, f in zip(NAMES, got, [floor[0], floor[1], floor[2], floor[2], floor[3], floor[3]]):
        assert e <= 2 * f, f'{name}: relative RMSE {e:.2e} vs SDPA {f:.2e}'
    lo = [t.detach().to(dtype).requires_grad_() for t in x]
    assert all(t.dtype == dtype for t in value_and_grads(lambda *t: gathered(*t, 0, 9, 4), lo, 0))


def route(T, w1, w2, form='auto', causal=True, offset=0, Tk=None, device='cpu'):
    return attention_kernels.route('torch', 'ha', torch.float32, device,
                                   ha_geometry=(T, Tk or T, offset, causal, w1, w2), ha_form=form)


def test_auto_takes_the_windowed_form_for_narrow_windows():
    assert route(64, 16, 8) == 'torch_windowed'        # the scale study's geometry
    assert route(1024, 64, 64) == 'torch_windowed'     # the [IA] table's
    # decoding one token: both forms compute the same 16 x 8 pairs; on CUDA the fixed number
    # of ops decides (the fallback of a Triton kernel), on the CPU the blockwise form stays
    assert route(1, 16, 8, offset=500, Tk=501, device='cuda') == 'torch_windowed'
    assert route(1, 16, 8, offset=500, Tk=501) == 'torch_blockwise'


def test_auto_keeps_the_blockwise_form_where_it_computes_less():
    assert route(64, 64, 64) == 'torch_blockwise'      # windows as wide as the context
    assert route(512, 512, 32) == 'torch_blockwise'
    assert route(64, 0, 8) == 'torch_blockwise'        # a full slot
    assert route(64, 0, 0) == 'torch_blockwise'


def test_ha_form_overrides_the_rule():
    assert route(64, 16, 8, form='blockwise') == 'torch_blockwise'
    assert route(64, 64, 64, form='windowed') == 'torch_windowed'
    assert route(64, 0, 8, form='windowed') == 'torch_blockwise'  # a full slot: the form does not apply


def test_the_rule_counts_the_logits_of_both_forms():
    gathered_n, blockwise_n = windowed.logit_counts(64, 64, 0, 16, 8)
    assert gathered_n == 64 * 16 * 8 and blockwise_n > gathered_n


CFG = dict(block_size=16, vocab_size=40, n_layer=1, n_head=2, n_embd=16, attention='ha', ha_share_kv=True,
           ha_window1=5, ha_window2=3, kernel='torch', dropout=0.0)


def test_the_model_trains_the_same_on_either_form():
    torch.manual_seed(0)
    a = GPT(GPTConfig(**CFG, ha_form='windowed'))
    b = GPT(GPTConfig(**CFG, ha_form='blockwise'))
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(1))
    (la := a(x, x)[1]).backward()
    (lb := b(x, x)[1]).backward()
    torch.testing.assert_close(la, lb, rtol=1e-6, atol=1e-6)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)


def test_ha_form_windowed_without_both_windows_is_refused():
    with pytest.raises(ValueError, match="ha_form='windowed' computes HA with both slots windowed"):
        GPTConfig(**{**CFG, 'ha_window2': 0}, ha_form='windowed')
    with pytest.raises(ValueError, match="ha_form must be"):
        GPTConfig(**CFG, ha_form='fast')


@pytest.mark.slow
def test_run_json_records_the_form_each_run_trained_with(tmp_path):
    """Two tiny HA runs, 'auto' and 'blockwise': run.json names the form that computed them."""
    from test_train_loop import finish, start
    data = tmp_path / 'data'
    data.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 16, 3000).astype(np.uint16).tofile(data / 'train.bin')
    rng.integers(0, 16, 600).astype(np.uint16).tofile(data / 'val.bin')
    meta = {'tokenizer': 'char', 'vocab_size': 16, 'itos': list('abcdefghijklmnop')}
    (data / 'meta.json').write_text(json.dumps(meta))
    ha = ['--attention=ha', '--ha_share_kv=True', '--ha_window1=4', '--ha_window2=2', '--max_iters=2',
          '--eval_interval=2', '--log_interval=1']
    procs = {form: start(data, tmp_path / form, *ha, f'--ha_form={form}') for form in ('auto', 'blockwise')}
    for form, p in procs.items():
        r = finish(p)
        assert r.returncode == 0, r.stdout + r.stderr
    kernels = {form: json.loads((tmp_path / form / 'run.json').read_text())['kernels'] for form in procs}
    assert kernels['auto']['ha']['form'] == 'torch_windowed'
    assert kernels['blockwise']['ha']['form'] == 'torch_blockwise'


def test_the_committed_cpu_grids_rerun_on_the_form_they_trained_with():
    """Their HA runs were trained blockwise: config/compare_cpu.py keeps that form, so that
    tools/rerun.py remakes them as they were; the depth study, new, runs every cell gathered."""
    import subprocess
    import sys
    cfg = {}
    exec(compile(open('config/compare_cpu.py').read(), 'config/compare_cpu.py', 'exec'), cfg)
    assert cfg['ha_form'] == 'blockwise'
    out = subprocess.run([sys.executable, 'tools/cpu_grids.py', 'depth', '--dry_run'], capture_output=True, text=True,
                         check=True).stdout
    presets = [p.split() for p in out.split('--preset ')[1:]]
    ha = [p for p in presets if 'attention=ha' in p]
    assert len(ha) == 6 and all('ha_form=windowed' in p for p in ha)
    assert not any('ha_form=windowed' in p for p in presets if 'attention=sa' in p)
