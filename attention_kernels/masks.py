"""
Which key positions a query position may read: the one masking rule of every kernel.

Query i of a call sits at absolute position offset + i, key j at j (offset > 0 when the
queries continue a KV cache). Causal: j <= offset + i; a window w > 0 also requires
offset + i - j < w (the last w positions). Without causality every key is visible and
windows do not apply (a window is a causal notion here).
"""

import torch


def visible(n_q, n_k, offset, causal, window, device):
    """Bool (n_q, n_k): may query i read key j."""
    if not causal:
        return torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    i = torch.arange(n_q, device=device)[:, None] + offset
    j = torch.arange(n_k, device=device)[None, :]
    m = j <= i
    if window:
        m = m & (i - j < window)
    return m


def mean_visible(T, causal, window=0):
    """Number of keys a query sees, averaged over the T positions of a sequence."""
    if not causal:
        return float(T)
    return sum(min(i + 1, window or T) for i in range(T)) / T
