"""
torch.compile(fullgraph=True) traces a GPT of every variant without a graph break: the
kernels are torch.library custom ops with fake implementations, and the PyTorch paths
compute their block geometry from Python integers (no tensor read back to the host).
fullgraph=True turns any graph break into an error. On CPU the PyTorch kernels are the
ones traced; backend 'aot_eager' (forward and backward graphs, no code generation) keeps
this fast. The compiled loss and gradients must equal eager ones. Every variant also
compiles with kernel='triton' (on CPU: the Triton kernels in the interpreter), its
first-use self-check switched on (attention_kernels/guard.py; it runs from the ops' eager
implementations, outside the graph). With CUDA the same tests trace the Triton kernels,
and one model also goes through inductor (on CPU its C++ code generation alone takes
longer than this whole file).
"""

import pytest
import torch

from attention_kernels import guard
from model import GPT, GPTConfig

pytestmark = pytest.mark.slow()  # torch.compile: make test, not make test-fast

VARIANTS = {
    'sa': dict(attention='sa'),
    'linear': dict(attention='linear', linear_norm=True),
    'hfa_v1': dict(attention='hfa_v1'),
    'hfa_v1_explicit': dict(attention='hfa_v1', hfa_kron='off'),
    'hfa_v2': dict(attention='hfa_v2', hfa_order=3),
    'hfa_mixed': dict(attention='hfa_v2', n_head=4, n_hfa_head=2, head_dim=4),
    'ha': dict(attention='ha'),
    'ha_shared': dict(attention='ha', ha_share_kv=True),
    'ha_windowed': dict(attention='ha', ha_window1=5, ha_window2=3),
    'ha_linear': dict(attention='ha', softmax=False, ha_window2=3),
    'ha_order4': dict(attention='ha', ha_order=4, ha_window1=4),
    'sa,ha': dict(attn_layers='sa,ha'),
    'attn_window': dict(attn_layers='sa,hfa_v1', attn_window=4),
}
DEV = 'cuda' if torch.cuda.is_available() else 'cpu'


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def loss_and_grads(model, idx):
    _, loss = model(idx, targets=idx)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return [loss] + list(grads)


def check_compiles(kw, backend, T=12, n_layer=2):
    cfg = GPTConfig(**{**dict(n_layer=n_layer, n_head=2, n_embd=16, block_size=16, vocab_size=11), **kw})
    torch.manual_seed(0)
    model = GPT(cfg).to(DEV)
    idx = torch.randint(0, 11, (2, T), generator=torch.Generator().manual_seed(1)).to(DEV)
    want = loss_and_grads(model, idx)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    got = loss_and_grads(compiled, idx)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('kernel', ['auto', 'triton'])
@pytest.mark.parametrize('name', list(VARIANTS))
def test_gpt_compiles_fullgraph(name, kernel, monkeypatch):
    monkeypatch.setattr(guard, '_checked', set())
    monkeypatch.setattr(guard, '_replaced', {})
    monkeypatch.setattr(guard, 'CHECK_DEVICES', ('cuda', 'cpu'))
    check_compiles(dict(VARIANTS[name], kernel=kernel), 'aot_eager')
    assert not guard._replaced


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (on CPU inductor takes ~90 s here)')
def test_gpt_compiles_with_inductor(tmp_path, monkeypatch):
    """inductor on CUDA: generated Triton code around the custom ops (Triton HA and HFA)."""
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path))  # no cache left behind
    check_compiles(dict(attn_layers='hfa_v1,ha'), 'inductor')
