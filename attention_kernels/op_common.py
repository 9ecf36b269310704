"""
Pieces the custom ops of every family share (<family>/ops.py).

Each kernel is a torch.library custom op: a forward op, a backward op, autograd that links
them and a fake (meta) implementation giving output shapes and dtypes, so that
torch.compile(fullgraph=True) traces a model through them without a graph break (the
compiler sees one opaque op where the kernel's Python loop or Triton launch would be).
The ops take flattened heads, q (N, Tq, dh) and k, v (N, Tk, dh) with N = batch * heads;
each family's wrapper takes the model's (B, H, T, dh).
"""

import hashlib

import torch

# The namespace the custom ops are registered under. torch.library registers ops process-wide, by
# name, and registering a name again replaces the first op under the code still bound to it; so
# a copy of this code imported under another module name (a Hugging Face folder's, hf_folder.py)
# registers its ops under a namespace of its own, and never touches these.
NAMESPACE = 'nanohfa' if __name__ == 'attention_kernels.op_common' else \
    f"nanohfa_{hashlib.sha256(__name__.encode()).hexdigest()[:16]}"


def flat(t):
    """(..., T, dh) -> (N, T, dh), contiguous."""
    return t.reshape(-1, t.size(-2), t.size(-1)).contiguous()


def lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def keeps_fp32(dtype):
    """bf16/fp16 forwards also return their fp32 output: backward's D_i = dO_i . O_i from
    the rounded output would add most of the gradient error (attention_kernels/hfa/triton.py)."""
    return dtype in (torch.bfloat16, torch.float16)


def or_empty(t, like):
    return t if t is not None else like.new_empty(0, dtype=torch.float32)


def load_triton():
    """Before a Triton op imports its kernel module: triton imported once, with its interpreter
    where there is no CUDA (attention_kernels.load_triton); why not, as an error."""
    import attention_kernels
    err = attention_kernels.load_triton()
    if err:
        raise RuntimeError(err)
