"""
Peak FLOP/s of the machine a run is on: the denominator of MFU (model FLOPs utilisation).

On CUDA the peak is the device's dense bf16 tensor-core rate from its data sheet (no
sparsity), looked up by device name; train.py's `peak_flops` and bench.py's `--peak_flops`
override it. On any other device it is measured: the FLOP/s of a large fp32 matmul on the
threads this process has (the run's own), which is what a CPU run of train.py actually trains at.
train.py measures it once per machine (processor, thread count, torch version) and keeps it in
$NANOHFA_CACHE/peak_flops.json (default cache/ beside this file), so MFU compares across runs
instead of following the load of the moment; it is measured again after a week, or when a run
goes faster than it (an MFU above 100%: the peak was measured under a heavier load), and the
reported MFU never passes 100%. Delete that file to measure again.
MFU = flops_per_token * tokens/s / peak, with GPT.flops_per_token (6 per weight plus the
attention mixing), as in the PaLM paper's definition (Chowdhery et al. 2022, App. B).
"""

import json
import math
import os
import platform
import time

import torch

from nanohfa.tokenizer import CACHE

# dense bf16 tensor-core peak, FLOP/s, by a substring of torch.cuda.get_device_name();
# the first match wins, so the more specific names come first
PEAK_BF16_FLOPS = [
    ('H100 PCIe', 756e12),
    ('H100 NVL', 835e12),
    ('H100', 989e12),       # SXM, "NVIDIA H100 80GB HBM3"
    ('H200', 989e12),
    ('H800', 989e12),
    ('GH200', 989e12),
    ('B200', 2250e12),
    ('A100', 312e12),
    ('A800', 312e12),
    ('L40S', 362e12),
    ('L4', 121e12),
]


def cuda_peak(name):
    """Dense bf16 peak of a CUDA device by name, or None if the name is not in the table."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


def measured_matmul_flops(device='cpu', n=1024, seconds=0.2):
    """FLOP/s of an n x n fp32 matmul on this device and thread count (best of the calls).
    Its inputs come from a private generator: measuring never moves torch's global RNG."""
    g = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, generator=g) for _ in range(2))
    sync = torch.cuda.synchronize if str(device).startswith('cuda') else (lambda: None)
    a @ b
    sync()
    best, t_end = float('inf'), time.perf_counter() + seconds
    while time.perf_counter() < t_end or best == float('inf'):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def machine_name():
    """The processor's model name (Linux: /proc/cpuinfo), else what platform knows."""
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


PEAK_MAX_AGE_S = 7 * 24 * 3600  # a cached CPU peak older than this is measured again


def peak_key(device, threads):
    return f"{device} | {machine_name()} | {threads} thread{'s' * (threads > 1)} | torch {torch.__version__}"


def _peak_table(path):
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    return table if isinstance(table, dict) else {}


def _store_peak(path, key, flops):
    """Write one entry (FLOP/s and when it was measured) into the cache; returns the entry."""
    entry = {'flops': flops, 'measured_at': time.time()}
    table = _peak_table(path)
    table[key] = entry
    try:  # a temporary name and a rename: two runs starting together never read half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
        tmp.write_text(json.dumps(table, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: measured again next time
    return entry


def _peak_source(device, threads, entry, path, why=''):
    day = time.strftime('%Y-%m-%d', time.localtime(entry['measured_at']))
    return (f"{device}: fp32 matmul measured{why} on this machine on {day}, with this run's {threads} "
            f"thread{'s' * (threads > 1)} ({path})")


def cached_peak(device):
    """(FLOP/s, source) of a non-CUDA device with the threads this process has (the run's own):
    a longer, best-of measurement, kept in CACHE/peak_flops.json under this machine, thread count
    and torch version, and measured again once older than PEAK_MAX_AGE_S (an entry of an older
    cache, a bare number, counts as old)."""
    path = CACHE / 'peak_flops.json'
    threads = torch.get_num_threads()
    key = peak_key(device, threads)
    entry = _peak_table(path).get(key)
    fresh = isinstance(entry, dict) and time.time() - entry.get('measured_at', 0) < PEAK_MAX_AGE_S
    if not fresh:
        entry = _store_peak(path, key, measured_matmul_flops(device, seconds=1.0))
    return entry['flops'], _peak_source(device, threads, entry, path)


def remeasured_peak(device, achieved):
    """(FLOP/s, source) after a run reached `achieved` FLOP/s, above the cached peak: that peak was
    measured under a heavier load, so it is measured again; the new peak is at least what the run
    achieved (so MFU stays at most 100%), and it replaces the cached one."""
    path = CACHE / 'peak_flops.json'
    threads = torch.get_num_threads()
    entry = _store_peak(path, peak_key(device, threads), max(measured_matmul_flops(device, seconds=1.0), achieved))
    return entry['flops'], _peak_source(device, threads, entry, path, ' again (an MFU above 100% was seen)')


def busy_cores_notice(threads):
    """A note when this run's threads exceed the cores other jobs leave free (load average): threads
    that wait for cores run far slower than fewer threads (measured on a loaded 2-core machine: 2
    threads at 2,337 tokens/s, 1 thread at 30,903). None when they fit, or where there is no load average."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    free = max(1, math.floor(cores - load + 0.5))
    if threads <= free:
        return None
    return (f"note: {threads} threads on {cores} cores with a load average of {load:.1f} (about {free} free): threads "
            f"waiting for busy cores can run many times slower; run with fewer, OMP_NUM_THREADS=1 or --threads={free}")


def peak_flops(device, override=0.0, cached=False):
    """(peak FLOP/s, where it comes from) for MFU on this device; cached: a non-CUDA device's
    measurement is taken once per machine (cached_peak)."""
    if override:
        return float(override), 'given'
    device = str(device)
    if device.startswith('cuda'):
        name = torch.cuda.get_device_name(torch.device(device))
        flops = cuda_peak(name)
        if flops:
            return flops, f'{name} dense bf16 peak'
        return measured_matmul_flops(device, n=4096), f'{name}: not in the table, measured fp32 matmul'
    if cached:
        return cached_peak(device)
    return measured_matmul_flops(device), f"{device}: measured fp32 matmul, {torch.get_num_threads()} thread{'s' * (torch.get_num_threads() > 1)}"


class MFU:
    """A run's model FLOPs utilisation, never above 100%: flops_per_token x tokens/s against
    world_size times the peak per process (peak_flops(); measure=False: none, and no MFU, as
    on every process but the first). Past 100%, a measured peak was measured under a heavier
    load than now: it is measured again (and cached); a given or tabled one is clamped."""

    def __init__(self, flops_per_token, world_size, device, given=0.0, measure=True):
        self.flops_per_token, self.world_size, self.device, self.given = flops_per_token, world_size, device, given
        self.peak, self.source = peak_flops(device, given, cached=True) if measure else (None, None)
        self.clamped = False  # the note on a clamped MFU is printed once

    def __call__(self, tokens_per_s):
        value = self.flops_per_token * tokens_per_s / (self.peak * self.world_size) \
            if self.peak and tokens_per_s else None
        if value is not None and value > 1:
            if not self.device.startswith('cuda') and not self.given:  # cached_peak's measurement
                self.peak, self.source = remeasured_peak(self.device, self.flops_per_token * tokens_per_s / self.world_size)
                print(f"note: MFU {value:.0%} against the cached peak; MFU now against {self.peak / 1e12:.3g} "
                      f"TFLOP/s ({self.source})")
            elif not self.clamped:
                print(f"note: MFU {value:.0%} against {self.peak / 1e12:.3g} TFLOP/s ({self.source}): that peak is "
                      f"too low; MFU is shown as at most 100%")
                self.clamped = True
            value = min(1.0, self.flops_per_token * tokens_per_s / (self.peak * self.world_size))
        return value


def gpu_sized_note(n_params, tokens_per_iter, flops_per_token, peak, world_size, device, eval_iters, data_flag):
    """A note when one iteration would take over 10 s on this non-CUDA device even at 100% MFU
    against `peak` per process: a GPU-sized config; data_flag is the run's --dataset= or
    --data_dir= for the CPU config it suggests. None otherwise."""
    step_s = flops_per_token * tokens_per_iter / (peak * world_size)  # at 100% MFU: a lower bound
    if device.startswith('cuda') or step_s <= 10:
        return None
    return (f"note: {n_params / 1e6:.0f}M parameters x {tokens_per_iter:,} tokens per iteration is a GPU-sized run: "
            f"at least {step_s:,.0f} s per iteration on this {device} ({peak / 1e12:.3g} TFLOP/s), and an evaluation "
            f"reads {2 * eval_iters} batches; a CPU config trains in minutes: python train.py config/cpu_sa.py {data_flag}")


def training_memory(params, n_layer, n_embd, vocab_size, block_size, batch_size, world_size=8, parallel='ddp',
                    activation_checkpointing=False, accum=1, ha_layers=0):
    """Bytes per GPU of a bf16-autocast training step with AdamW, by part: the arithmetic
    behind config/scaling_xl.py's table. An estimate (CUDA context, NCCL buffers and allocator
    fragmentation are left out: keep ~10% of the GPU free for them).
    - states: fp32 parameters (4 bytes each), gradients (4) and AdamW's two moments (8); DDP
      keeps all of them on every GPU plus its gradient buckets (4, a second copy of the
      gradients) and autocast's bf16 copy of the weights (2); FSDP shards the 16 over the GPUs
      and gathers bf16 parameters only for the units in flight (the root: embeddings and head;
      two blocks: the current one and the prefetched one). With gradient accumulation (accum >
      1 micro-steps per GPU) FSDP adds up gradients unsharded, in fp32 (4), until the last one.
    - activations of one micro-batch (B x T tokens, width d, bf16): 34 B T d bytes per layer
      (Korthikanti et al. 2022, Sec. 4.1; the T^2 attention term is absent, since the fused
      attention kernels keep no score matrix); an HA layer adds its second keys and values
      (4 B T d); with checkpointing only each block's input is kept (4 B T d, the fp32 residual
      stream), plus one block's activations while it is recomputed.
    - logits: B T V in bf16 and the fp32 log-softmax of the loss (6 bytes), and as much again
      for their gradient in the backward."""
    tokens = batch_size * block_size
    root = (vocab_size + block_size) * n_embd  # the root unit: token and position embeddings (the head is tied)
    block = (params - root) / n_layer  # one block's parameters, on average
    if parallel == 'ddp':
        states = {'parameters': 4 * params, 'gradients': 4 * params + 4 * params, 'optimizer': 8 * params,
                  'bf16 weights': 2 * params}
    else:
        states = {'parameters': 4 * params / world_size, 'gradients': 4 * params / world_size
                  + (4 * params if accum > 1 else 0), 'optimizer': 8 * params / world_size,
                  'bf16 weights': 2 * root + 2 * 2 * block}
    per_layer = 34 * tokens * n_embd
    activations = n_layer * per_layer + ha_layers * 4 * tokens * n_embd
    if activation_checkpointing:
        activations = n_layer * 4 * tokens * n_embd + per_layer + 4 * tokens * n_embd * (ha_layers > 0)
    parts = {**states, 'activations': activations, 'logits': 2 * 6 * tokens * vocab_size}
    return {**parts, 'total': sum(parts.values())}
