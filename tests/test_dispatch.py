"""
attention_kernels.dispatch, the one place a kernel is chosen: its decision for every
(kernel setting, family, dtype, device, shape class), from one table, and the function it
hands back. No kernel runs here (the forms themselves are tested in test_kernels.py,
test_kernels_triton.py and test_triton_ha.py).
"""

import itertools

import pytest
import torch

import attention_kernels
from attention_kernels import CHUNKED_MIN_T, FORMS, KERNELS, dispatch, route

TRITON_ERROR = attention_kernels.load_triton()  # on Linux an error fails the session (conftest.py)

# shape class -> (family, dispatch's keyword arguments and shapes, the PyTorch form, the Triton
# form or None where no Triton kernel computes the case)
T_LONG = CHUNKED_MIN_T
CLASSES = {
    'sa': ('sa', dict(), 'sdpa', None),
    'sa dropout': ('sa', dict(dropout_p=0.1), 'sdpa', None),
    'linear': ('linear', dict(), 'torch', 'triton'),
    'linear long causal': ('linear', dict(T=T_LONG), 'torch', 'triton_chunked'),
    'linear long window': ('linear', dict(T=T_LONG, window=64), 'torch', 'triton'),
    'linear long non-causal': ('linear', dict(T=T_LONG, causal=False), 'torch', 'triton'),
    'linear decoding': ('linear', dict(T=1, Tk=T_LONG, offset=T_LONG - 1), 'torch', 'triton'),
    'linear dropout': ('linear', dict(dropout_p=0.1), 'torch', None),
    'hfa A=2 dh 16 (lifted width 256)': ('hfa', dict(A=2, dh=16), 'torch_kron', 'triton'),
    'hfa A=2 dh 32 (lifted width 1024)': ('hfa', dict(A=2, dh=32), 'torch_explicit', 'triton'),
    'hfa A=2 dh 32 kron on': ('hfa', dict(A=2, dh=32, kron='on'), 'torch_kron', 'triton'),
    'hfa A=2 dh 16 kron off': ('hfa', dict(A=2, dh=16, kron='off'), 'torch_explicit', 'triton'),
    'hfa A=4': ('hfa', dict(A=4, dh=16), 'torch_explicit', 'triton'),
    'hfa A=5': ('hfa', dict(A=5, dh=2), 'torch_kron', None),
    'hfa no softmax': ('hfa', dict(A=2, dh=16, softmax=False), 'torch_explicit', None),
    'hfa dropout': ('hfa', dict(A=2, dh=16, dropout_p=0.1), 'torch_kron', None),
    'ha order 3': ('ha', dict(), 'torch_blockwise', 'triton'),
    'ha order 3 narrow windows': ('ha', dict(T=64, windows=(16, 8)), 'torch_windowed', 'triton'),
    'ha order 3 narrow windows, blockwise asked': ('ha', dict(T=64, windows=(16, 8), ha_form='blockwise'),
                                                   'torch_blockwise', 'triton'),
    'ha order 3 no softmax': ('ha', dict(softmax=False), 'torch_prefix', None),
    'ha order 4': ('ha', dict(order=4), 'torch_naive', None),
}
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16, 'float64': torch.float64}
DEVICES = ('cpu', 'cuda')


def expected(kernel, dtype, device, torch_form, triton_form):
    """The rule the README states, written from the table's side."""
    if kernel == 'reference':
        return 'reference'
    triton_ok = triton_form is not None and dtype != torch.float64
    if triton_ok and (kernel == 'triton' or (kernel == 'auto' and device == 'cuda')):
        return triton_form
    return torch_form


def inputs(family, kw, dtype, device):
    """q and k of the family's layout (meta tensors: shapes and dtypes only), and the rest of kw."""
    kw = dict(kw)
    T, Tk, A, dh = kw.pop('T', 8), kw.pop('Tk', None), kw.pop('A', 2), kw.pop('dh', 16)
    lead = (A,) if family == 'hfa' else ()
    kshape = (A,) if family == 'hfa' else (kw.get('order', 3) - 1,) if family == 'ha' else ()
    q = torch.empty(*lead, 1, 2, T, dh, dtype=dtype, device=device)
    k = torch.empty(*kshape, 1, 2, Tk or T, dh, dtype=dtype, device=device)
    return q, k, kw


CASES = list(itertools.product(KERNELS, CLASSES, DTYPES, DEVICES))


@pytest.mark.skipif(TRITON_ERROR is not None, reason=f'no usable triton: {TRITON_ERROR}')
@pytest.mark.parametrize('kernel, shape_class, dtype, device', CASES)
def test_dispatch_table(kernel, shape_class, dtype, device):
    family, kw, torch_form, triton_form = CLASSES[shape_class]
    want = expected(kernel, DTYPES[dtype], device, torch_form, triton_form)
    q, k, rest = inputs(family, kw, DTYPES[dtype], 'meta')
    long_causal = family == 'linear' and triton_form == 'triton_chunked'
    got = route(kernel, family, DTYPES[dtype], device, softmax=rest.get('softmax', True),
                dropout=bool(rest.get('dropout_p')), order=rest.get('order', 3), factors=q.size(0) if family == 'hfa'
                else 1, head_size=q.size(-1), kron=rest.get('kron', 'auto'), long_causal=long_causal,
                ha_geometry=(q.size(-2), k.size(-2), 0, True, *rest.get('windows', (0, 0))) if family == 'ha' else None,
                ha_form=rest.get('ha_form', 'auto'))
    assert got == want
    if device == 'cpu':  # dispatch itself, on CPU tensors: the function of that name
        q, k, rest = inputs(family, kw, DTYPES[dtype], 'cpu')
        fn = dispatch(kernel, family, q, k, check=False, **rest)
        if want.startswith('triton'):
            assert fn.func is FORMS[family][want] and fn.keywords == dict(strict=kernel == 'triton', check=False)
        else:
            assert fn is FORMS[family][want]


def test_the_table_reaches_every_form():
    seen = {(CLASSES[c][0], expected(kn, DTYPES[d], dev, *CLASSES[c][2:])) for kn, c, d, dev in CASES}
    assert seen == {(f, name) for f, forms in FORMS.items() for name in forms}


def test_dispatch_reads_the_shape_class_from_the_inputs():
    """The long causal class is read from q and k (not passed in): as route is told it."""
    for T, Tk, offset, window, causal, want in [(T_LONG, T_LONG, 0, 0, True, 'triton_chunked'),
                                                (T_LONG - 1, T_LONG - 1, 0, 0, True, 'triton'),
                                                (T_LONG, T_LONG, 0, 16, True, 'triton'),
                                                (T_LONG, T_LONG, 0, 0, False, 'triton'),
                                                (1, T_LONG + 1, T_LONG, 0, True, 'triton')]:
        if TRITON_ERROR:
            pytest.skip(f'no usable triton: {TRITON_ERROR}')
        q, k = torch.empty(1, 1, T, 16), torch.empty(1, 1, Tk, 16)
        fn = dispatch('triton', 'linear', q, k, offset=offset, causal=causal, window=window)
        assert fn.func is FORMS['linear'][want]


def test_bad_kernel_setting_says_which_are_valid():
    with pytest.raises(ValueError, match="auto, triton, torch, reference, not 'cuda'"):
        route('cuda', 'sa', torch.float32, 'cpu')


def test_no_setting_is_remembered():
    """Building a model records nothing in attention_kernels: its rule lives in the call."""
    from model import GPT, GPTConfig
    before = {k: v for k, v in vars(attention_kernels).items() if not k.startswith('__')}
    GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, kernel='torch'))
    after = {k: v for k, v in vars(attention_kernels).items() if not k.startswith('__')}
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)


def test_kernel_check_is_a_documented_setting():
    """train.py --help lists kernel_check, and the model takes it from there (model_args)."""
    from nanohfa import configurator
    from nanohfa import settings
    from model import GPTConfig
    line = [x for x in configurator.help_text(settings.TRAIN, 'train.py', '').splitlines() if 'kernel_check' in x]
    assert len(line) == 1 and 'kernel_check = True' in line[0] and 'PyTorch' in line[0]
    assert 'kernel_check' in GPTConfig.__dataclass_fields__ and GPTConfig().kernel_check is True
