"""
Attention kernels, kept apart from the model (model.py states the maths and calls these),
one folder per family in the manner of flash-linear-attention:

    sa.py              softmax attention: the naive reference and torch's SDPA
    linear/            linear attention ([IA] Eq. 1)
    hfa/               HyperFeatureAttention ([IA] Def 5.1, E.2)
    ha/                HyperAttention ([IA] Def 6.1, App. F)
    masks.py           which keys a query may read (causal, offset, windows)
    op_common.py       what the torch.library custom ops share
    triton_common.py   pieces the Triton kernels share
    guard.py           what stands between a Triton kernel and the model: a kernel that fails
                       to compile or launch, or that disagrees with PyTorch on its first
                       use (the self-check), is replaced by its PyTorch stand-in
    preflight.py       before that, each Triton kernel a run uses runs once in a child process
                       (a crash, a hang, a mismatch there sends the family to PyTorch)
    fallback.py        those stand-ins, one per Triton entry point

A family holds naive.py (its definition, materialised: the float64 reference the tests
import), its PyTorch forms, its Triton kernel (triton.py) and that kernel as a custom op
(ops.py, so torch.compile traces through it), and one entry function, `<family>.attention`,
that asks `dispatch` below which form computes the call and calls it.

`dispatch` is the one place a kernel is chosen, from the model's `kernel` setting, the
family and the inputs (`route` holds the rule, by name): 'reference' runs every family
through its definition (materialising: small sizes only); 'torch' the PyTorch forms;
'triton' the Triton kernels wherever they cover the case; 'auto' Triton for CUDA tensors
when triton imports (and the family passed the preflight), PyTorch elsewhere. The choice is the model's own: nothing here
remembers a setting, so models with different settings live side by side in one process.
On a machine without CUDA, triton is imported with its interpreter on, so kernel='triton'
runs the Triton kernels on CPU tensors (slowly; the tests do this at tiny sizes).
"""

import functools
import importlib
import os
import sys

import torch

KERNELS = ('auto', 'triton', 'torch', 'reference')
FAMILIES = {'hfa': 'hfa.triton', 'linear': 'linear.triton', 'ha': 'ha.triton'}

_triton = {'tried': False, 'error': None, 'env_before': None}  # filled once by load_triton()
_modules = {}
_pytorch_for = {}  # family -> the preflight's line that sent it to PyTorch (about the kernel on this GPU)


def use_pytorch(family, why):
    """kernel='auto' computes `family` with PyTorch from now on in this process (preflight.py)."""
    _pytorch_for[family] = why


def load_triton():
    """Import triton and the Triton kernel modules once. Returns None or the reason triton
    cannot be used. Without CUDA the interpreter is switched on for this import only: it
    must be chosen before triton's own modules load, and the environment variable is
    restored at once so that it reaches no other code or subprocess."""
    if _triton['tried']:
        return _triton['error']
    _triton['tried'] = True
    interpret = not torch.cuda.is_available()
    if interpret and 'triton' in sys.modules and not _interpreting(sys.modules['triton']):
        _triton['error'] = ("triton was imported before attention_kernels on a machine without CUDA, so its "
                            "interpreter cannot be switched on; import attention_kernels first or use kernel='torch'")
        return _triton['error']
    old = _triton['env_before'] = os.environ.get('TRITON_INTERPRET')
    try:
        if interpret:
            os.environ['TRITON_INTERPRET'] = '1'
        import triton
        if interpret:
            triton.knobs.runtime.interpret = True  # kept by triton for this process
        for family, name in FAMILIES.items():
            _modules[family] = importlib.import_module(f'{__name__}.{name}')
    except Exception as e:  # no triton, or one too old for these kernels
        _triton['error'] = f"triton cannot be used here: {type(e).__name__}: {e}"
    finally:
        if old is None:
            os.environ.pop('TRITON_INTERPRET', None)
        else:
            os.environ['TRITON_INTERPRET'] = old
    return _triton['error']


def _interpreting(triton):
    knobs = getattr(triton, 'knobs', None)
    return bool(knobs and knobs.runtime.interpret)


def prepare(kernel):
    """Called when a model is built: checks the setting and imports triton if it may be used,
    so that the forward pass (also under torch.compile) only reads what is loaded."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    if kernel == 'triton':
        err = load_triton()
        if err:
            raise ValueError(f"kernel='triton' but {err}; install triton (Linux) or use kernel='torch'")
    elif kernel == 'auto' and torch.cuda.is_available():
        load_triton()


TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KRON_MAX_WIDTH = 256  # HFA, kron='auto': SDPA on lifted queries iff dh^A <= this (measured crossover, docs/performance.md)
# linear attention: the chunked Triton kernel from this length on (full causal self-attention);
# shorter, its sequential pass over the chunks (one program per head) leaves most of the GPU idle
CHUNKED_MIN_T = 1024


def route(kernel, family, dtype, device, *, softmax=True, dropout=False, order=3, factors=1, head_size=64,
          kron='auto', long_causal=False, ha_geometry=None, ha_form='auto'):
    """The name of the form that computes `family` ('sa', 'linear', 'hfa', 'ha') for inputs of
    `dtype` on `device` ('cuda', 'cpu', ...) under the model's `kernel` setting. The case:
    softmax, attention-weight dropout (only the PyTorch forms have it), HA's order, HFA's
    number of factors A and head size (the lifted width is head_size^A), hfa_kron, and
    long_causal: full causal self-attention of CHUNKED_MIN_T positions or more (linear);
    ha_geometry: HA's (Tq, Tk, offset, causal, window1, window2), and ha_form (the model's
    ha_form: 'auto', 'windowed' or 'blockwise'), which choose between HA's two PyTorch forms
    of order 3 (ha/windowed.py's `wins` holds the rule).
    Names: 'reference' (the definition), 'sdpa', 'torch' (linear's definition is its
    PyTorch form), 'torch_kron' / 'torch_explicit' (HFA), 'torch_blockwise' /
    'torch_windowed' / 'torch_prefix' / 'torch_naive' (HA order 3 softmax, both slots
    windowed or not / order 3 linear / order >= 4),
    'triton', 'triton_chunked' (linear)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    if kernel == 'reference':
        return 'reference'
    if family == 'sa':
        return 'sdpa'
    covered = dtype in TRITON_DTYPES and not dropout and {  # what the Triton kernels compute
        'linear': True, 'hfa': softmax and factors <= 4, 'ha': softmax and order == 3}[family]
    auto = kernel == 'auto' and device == 'cuda' and family not in _pytorch_for
    if covered and (kernel == 'triton' or auto) and load_triton() is None:
        return 'triton_chunked' if family == 'linear' and long_causal else 'triton'
    if covered and kernel == 'triton':
        raise RuntimeError(f"kernel='triton' but there is no Triton kernel for {family!r} "
                           f"({_triton['error']}); use kernel='auto' or 'torch'")
    if family == 'linear':
        return 'torch'
    if family == 'hfa':
        lift = softmax and (kron == 'on' or (kron == 'auto' and head_size ** factors <= KRON_MAX_WIDTH))
        return 'torch_kron' if lift else 'torch_explicit'
    if order > 3:
        return 'torch_naive'
    if not softmax:
        return 'torch_prefix'
    if ha_form != 'blockwise' and ha_geometry and ha_windowed.applies(*ha_geometry[3:]):
        if ha_form == 'windowed' or ha_windowed.wins(*ha_geometry, device=device):
            return 'torch_windowed'
    return 'torch_blockwise'


def dispatch(kernel, family, q, k, *, check=True, offset=0, causal=True, window=0, softmax=True, dropout_p=0.0,
             order=3, kron='auto', windows=(0, 0), ha_form='auto'):
    """The function that computes `family` for queries q and keys k (the family's layout:
    HFA's and HA's with their streams first) under the model's `kernel` setting, by
    `route`. Every form of a family takes that family's arguments (see `<family>.attention`);
    a Triton form also the model's fallback rule: kernel='triton' raises where 'auto' falls
    back (guard.py), and `check` (the model's kernel_check) runs the first-use self-check.
    windows and ha_form: HA's."""
    long_causal = (causal and not window and offset == 0 and q.size(-2) == k.size(-2)
                   and q.size(-2) >= CHUNKED_MIN_T)
    how = route(kernel, family, q.dtype, q.device.type, softmax=softmax, dropout=bool(dropout_p), order=order,
                factors=q.size(0) if family == 'hfa' else 1, head_size=q.size(-1), kron=kron, long_causal=long_causal,
                ha_geometry=(q.size(-2), k.size(-2), offset, causal, *windows[:2]) if family == 'ha' else None,
                ha_form=ha_form)
    fn = FORMS[family][how]
    if how.startswith('triton'):
        return functools.partial(fn, strict=kernel == 'triton', check=check)
    return fn


from attention_kernels import ha, hfa, linear, sa  # noqa: E402  the forms dispatch returns; they call dispatch
from attention_kernels.ha import windowed as ha_windowed  # noqa: E402

FORMS = {
    'sa': {'reference': sa.reference, 'sdpa': sa.sdpa},
    'linear': {'reference': linear.reference, 'torch': linear.reference, 'triton': linear.with_triton,
               'triton_chunked': linear.with_triton_chunked},
    'hfa': {'reference': hfa.reference, 'torch_kron': hfa.lifted, 'torch_explicit': hfa.explicit,
            'triton': hfa.with_triton},
    'ha': {'reference': ha.reference, 'torch_naive': ha.reference, 'torch_blockwise': ha.blockwise,
           'torch_windowed': ha.gathered,
           'torch_prefix': ha.prefix_sums, 'triton': ha.with_triton},
}
