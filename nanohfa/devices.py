"""
The device and the dtype a script runs on (train.py, sample.py): 'auto' picks the best this
machine has; a device it lacks, or a name that is not one, is refused with one line saying
what is valid. And reading small results back from the device without waiting for
everything it still has to do.
"""

import re
from contextlib import nullcontext

import torch

from nanohfa.errors import UserError

DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def pick_device(device):
    """The device to run on: 'auto' is cuda > mps > cpu; a device this machine lacks is refused."""
    if device == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
    if not re.fullmatch(r'cpu|mps|cuda(:\d+)?', device):
        raise UserError(f"device={device!r} is not a device name; valid: auto, cpu, cuda, cuda:N, mps")
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but CUDA is not available here; use --device=cpu (or auto)")
    if device.startswith('cuda:') and int(device[5:]) >= torch.cuda.device_count():
        raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device == 'mps' and not torch.backends.mps.is_available():
        raise UserError("device='mps' but MPS (Apple GPU) is not available here; use --device=cpu (or auto)")
    return device


def check_dtype(dtype):
    if dtype not in ('auto', *DTYPES):
        raise UserError(f"dtype={dtype!r} is not a dtype name; valid: auto, {', '.join(DTYPES)}")


def pick_dtype(dtype, device):
    """(dtype name, autocast context): 'auto' is bfloat16 on CUDA where supported, else float32;
    float32 runs without autocast."""
    check_dtype(dtype)
    device_type = 'cuda' if device.startswith('cuda') else device
    if dtype == 'auto':
        dtype = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    ptdtype = DTYPES[dtype]
    return dtype, nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=device_type, dtype=ptdtype)


def synchronize(device):
    """Wait for the device to finish its queued work (CUDA runs ahead of the host; CPU does not)."""
    if device.startswith('cuda'):
        torch.cuda.synchronize(device)


def to_host(t):
    """Start copying a small device tensor to the host; returns a function that waits for
    the copy (only for it, not for later work) and gives the values as a list."""
    if t.device.type != 'cuda':
        return t.tolist
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return lambda: copied.synchronize() or buf.tolist()


def to_device(device, *tensors):
    """Host tensors (a batch) onto the device; to CUDA through pinned memory, without waiting."""
    if device.startswith('cuda'):
        return tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)
    return tuple(t.to(device) for t in tensors)
