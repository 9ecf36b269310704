"""
Attention kernels, kept apart from the model (model.py states the maths and calls these).

    masks.py           which keys a query may read (causal, offset, windows)
    ha/                HyperAttention: pytorch.py (blockwise order 3, the materialising
                       reference for any order, linear HA by prefix sums), triton.py (order 3)
    hfa/triton.py      HyperFeatureAttention in Triton (A = 1..4 score tiles, one softmax)
    linear/triton.py   linear attention in Triton (no softmax, optional 1/(visible keys))
    triton_common.py   pieces the Triton kernels share
    fallback.py        PyTorch stand-ins of the Triton entry points (kernel='auto' falls
                       back to them when a Triton kernel fails to compile or launch)
    ops.py             each kernel as a torch.library custom op, with autograd and a fake
                       (meta) implementation, so torch.compile traces through them

`backend` below is the one place that chooses between the Triton and the PyTorch kernel,
following the `kernel` flag: 'torch' always PyTorch; 'triton' always Triton; 'auto'
Triton for CUDA tensors when triton imports, PyTorch elsewhere. On a machine without
CUDA, triton is imported with its interpreter on, so kernel='triton' runs the Triton
kernels on CPU tensors (slowly; the tests do this at tiny sizes).
"""

import importlib
import os
import sys
import warnings

import torch

KERNELS = ('auto', 'triton', 'torch')
FAMILIES = {'hfa': 'hfa.triton', 'linear': 'linear.triton', 'ha': 'ha.triton'}

_triton = {'tried': False, 'error': None, 'env_before': None}  # filled once by load_triton()
_modules = {}


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
            try:
                _modules[family] = importlib.import_module(f'{__name__}.{name}')
            except ModuleNotFoundError as e:
                if e.name != f'{__name__}.{name}':
                    raise
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


def triton_module(family):
    """The Triton entry points of a kernel family ('hfa', 'linear', 'ha'), guarded: with
    kernel='auto', an entry point that fails to compile or launch (another triton version,
    too little shared memory, ...) is replaced by its PyTorch stand-in (fallback.py) for
    the rest of the process, after one warning line naming the error; kernel='triton'
    raises. Bad arguments (ValueError, TypeError) always raise."""
    err = load_triton()
    if err:
        raise RuntimeError(err)
    if family not in _modules:
        raise RuntimeError(f"no Triton kernel for {family!r} in this checkout")
    return _Guarded(family)


_policy = {'fallback': True}  # kernel='auto' (True) or 'triton' (False): set by prepare()
_failed = {}  # entry point name -> the error that replaced it


class _Guarded:
    def __init__(self, family):
        self.family = family

    def __getattr__(self, name):
        fn = getattr(_modules[self.family], name)
        if not callable(fn) or name.startswith('_'):
            return fn

        def call(*args, **kwargs):
            if name in _failed and _policy['fallback']:
                return getattr(_fallback(), name)(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            except (ValueError, TypeError):
                raise
            except Exception as e:  # compile or launch failure
                if not _policy['fallback']:
                    raise
                _failed[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                warnings.warn(f"Triton {name} failed ({_failed[name]}); kernel='auto' uses PyTorch for it from now on",
                              RuntimeWarning, stacklevel=2)
                return getattr(_fallback(), name)(*args, **kwargs)
        return call


def _fallback():
    return importlib.import_module(f'{__name__}.fallback')


def prepare(kernel):
    """Called when a model is built: checks the flag and imports triton if it may be used,
    so that the forward pass (also under torch.compile) only reads what is loaded."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    _policy['fallback'] = kernel != 'triton'
    if kernel == 'triton':
        err = load_triton()
        if err:
            raise ValueError(f"kernel='triton' but {err}; install triton (Linux) or use kernel='torch'")
    elif kernel == 'auto' and torch.cuda.is_available():
        load_triton()


TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def backend(kernel, x, family, supported=True):
    """'triton' or 'torch': the kernel that computes `family` for inputs like x.
    `supported` is False for a case the Triton kernel does not cover (e.g. attention-weight
    dropout, hfa_order > 4): then PyTorch, as for float64 inputs."""
    if kernel == 'torch' or not supported or x.dtype not in TRITON_DTYPES:
        return 'torch'
    if kernel == 'triton':
        if family not in _modules:
            raise RuntimeError(f"kernel='triton' but there is no Triton kernel for {family!r} "
                               f"({_triton['error'] or 'not loaded'}); use kernel='auto' or 'torch'")
        return 'triton'
    return 'triton' if (x.is_cuda and family in _modules) else 'torch'
