"""
Benchmark the attention variants: speed, peak memory and achieved FLOP/s.

    python bench.py                          # default sweep, CPU: a few minutes
    python bench.py --quick                  # seconds, for a test
    python bench.py --block_sizes 128,512 --device cuda --out results/bench.json
    python bench.py --device cuda --gpt2 only     # the GPT-2-small training steps alone
    python bench.py --device cuda --kernels_only --out results/kernels.json   # the kernel rows alone
    python bench.py --table --threads 1       # docs/attention.md's table: every variant at the CPU size
    python bench.py --rounds 7 --step_times --config config/compare_cpu.py --out grids/main --variants sa,hfa ...
                                              # a compare.py grid's seconds per step (tools/cpu_grids.py)
    python bench.py --memory --out results/memory_cpu.json   # activation checkpointing, DDP and FSDP on CPU
    python bench.py --shards --out results/shards.json       # training windows from 2,000 shards vs one file
    python bench.py --lm_eval --out results/lm_eval_bench/results.json   # lm-eval requests/s, scoring memory
    python bench.py --stop_save --out results/stop_save.json # a stop's seconds to a finished save (torchrun, 2 processes)

Rows (variant):
    sa, linear, hfa_v1, hfa_v2, ha, ha_win    the model's variants (ha_win: windows w1, w2)
    ha_ref                                    HA on its materialising reference, kernel='reference' (O(L^3) memory)
    hfa_v1_kron, hfa_v1_explicit              HFA forced onto either path (the model picks one)
    sdpa_min                                  a minimal self-contained SDPA GPT of the same size
Modes:
    attention    forward + backward of one attention layer (projections included)
    train_step   forward + backward + AdamW step of the whole GPT
    sample       tokens/s generating 512 new tokens with and without the KV cache
    gpt2_step    (CUDA by default, --gpt2) a whole training step of GPT-2 small as train.py takes
                 it: 12 x 768, T = 1024, bf16 autocast, fused AdamW, gradient clipping, with
                 torch.compile on and off; tokens/s and MFU against hardware.py's dense bf16 peak.
                 Variants: sa, linear, hfa_v1, hfa_v2, ha (config/ha.py: every 4th layer, windows
                 512 x 32), ha_r64 (config/ia_table.py: every layer, windows 64 x 64), sdpa_min
    kernel_fwd, kernel_bwd, kernel_fwd_bwd
                 one attention kernel alone (attention_kernels/, on CUDA by default): bf16, batch x heads
                 x T x dh at T in --kernel_seq_lens, dh in --kernel_head_dims, beside SDPA
                 (flash) at the same shape; TFLOP/s and the fraction of the device's dense bf16
                 peak (hardware.py). Rows: sdpa, linear, linear_norm, hfa_A1..A3, ha_win (windows
                 512, 32), ha_win_shared, ha (full; T <= 1024 only, O(T^3)).
    table        (--table) parameters, training FLOPs per token and CPU training tokens/s of
                 every variant and option at the CPU configs' size (4 x 128, T = 128, batch 8):
                 the best of --table_steps steps after two warm-up steps, as a markdown table
    memory       (--memory) peak memory per process and seconds per training step of one GPT
                 (--memory_model, default 8 x 512, vocab 8192, T 256, batch 4 per process), fp32 on
                 CPU: one process, and 2 processes (torchrun, gloo) under DDP and FSDP, each with
                 and without activation checkpointing. `held_bytes`: RSS when the first step starts
                 (parameters, and AdamW's state once allocated by a warm-up step); `peak_bytes`: the
                 RSS high-water mark over the timed steps; `step_bytes` the difference (activations,
                 gradients, gathered parameters); the largest over the processes
    shards       (--shards) windows per second that train.py draws (data.windows: random offsets,
                 batch 12 x 1024 tokens) from --shard_count shards in llm.c's format vs the same
                 tokens in one train.bin, taking turns batch by batch (a load that comes and goes
                 slows both alike), from the median seconds per batch; the resident memory (VmRSS)
                 that opening the shards and the file adds, and that reading every window from both
                 adds (windows are read, not mapped: nothing stays resident); the files left open
    lm_eval      (--lm_eval) requests per second of lm_eval_model.py's loglikelihood (128 multiple-choice-like
                 requests: contexts of 30-200 tokens, answers of 1-8) and generate_until (32 prompts of
                 10-100 tokens, 32 new tokens each: in batches of 16, one at a time, and the loop this project
                 had before), on a GPT of --n_layer x --n_embd with GPT-2's vocabulary, T = 256, the
                 fastest of 3 rounds over the cases; and the peak memory (RSS high-water mark, a fresh
                 process each) of scoring every position of a --lm_eval_size batch, before (every
                 position's logits through the model's loss, then their log-softmax) and now
                 (NanoHFA.score: one float32 buffer, normalised in place)
    stop_save    (--stop_save) seconds from a stop to the finished save of a 2-process run (torchrun,
                 gloo, CPU; --stop_sizes models): the local launcher's (SIGTERM to compare.py) and,
                 where a SLURM cluster answers (sinfo), SLURM's warning (scancel --signal=USR2 to
                 the job, as sbatch --signal sends it); to ckpt.pt's last write (`stop_to_save_s`)
                 and to the end of the stop (`stop_to_exit_s`: compare.py's exit; SLURM: the job's
                 record of the stop, once train.py has exited and the job is requeued), with the
                 checkpoint's size
    step_times   (--step_times, then a compare.py grid's arguments) seconds per training step
                 of every variant of the grid as train.py takes it, one thread, in rounds that
                 visit the variants in turn (a load that comes and goes hits each alike); the
                 median over --rounds rounds goes to OUT/step_times.json, which compare.py
                 and tools/grid_report.py read to put runs on a common time axis

Every (variant, mode, block size) runs in a fresh Python process. `peak_mem_bytes` is the
memory the step itself needs (activations, gradients, optimizer state) beyond what is held
just before the first step (model, optimizer shell, inputs). On CPU: the kernel's RSS
high-water mark is reset (/proc/self/clear_refs) just before the first step and read after
the last (VmHWM), so peak and baseline come from one counter (to within the few pages the
reading touches; within one process, --quick or --in_process, a case may reuse memory an
earlier one freed and need ~0 new pages). (getrusage's lifetime peak minus
an RSS read earlier, used before, could come out negative: the kernel updates its high-water
mark lazily, not when the allocator hands pages back with madvise, so it could sit below the
earlier reading.) On CUDA: torch.cuda.max_memory_allocated after a reset minus the memory
allocated before, and `peak_mem_total_bytes` the whole peak. FLOPs are counted analytically
(GPT.flops_per_token, Attention.mix_flops) and `frac_of_matmul_peak` = achieved FLOP/s /
FLOP/s of a large fp32 matmul measured in the same run, on the same device and thread count
(hardware.measured_matmul_flops, the best of its calls, at the start and at the end).

On CPU the default is ONE thread (--threads): on a shared machine, two OpenMP threads
competing with other work run many small kernels 10-30x slower, and ratios stop meaning
anything.
"""

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from nanohfa import devices
from nanohfa import hardware
from model import GPT, GPTConfig, make_attention

VARIANTS = ['sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha', 'ha_win']
REFERENCES = ['ha_ref', 'hfa_v1_kron', 'hfa_v1_explicit']


def bench_config(variant, T, args):
    """The GPT config of a row; all rows share the width, depth and vocabulary."""
    base = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=args.vocab,
                block_size=T, bias=True, dropout=0.0)
    if variant in ('sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha', 'sdpa_min'):
        return GPTConfig(**base, attention='sa' if variant == 'sdpa_min' else variant)
    if variant == 'ha_win':  # Roy et al. use (512, 32) at long context; scaled to our lengths
        return GPTConfig(**base, attention='ha', ha_window1=min(args.window1, T), ha_window2=min(args.window2, T))
    if variant == 'ha_ref':
        return GPTConfig(**base, attention='ha', kernel='reference')
    if variant in ('hfa_v1_kron', 'hfa_v1_explicit'):
        return GPTConfig(**base, attention='hfa_v1', hfa_kron='on' if variant.endswith('kron') else 'off')
    raise ValueError(variant)


# -----------------------------------------------------------------------------
# the minimal baseline: nanoGPT with SDPA and nothing else

class MinimalGPT(nn.Module):
    """Token + position embeddings, n_layer pre-LN blocks of causal SDPA and a GELU MLP,
    tied lm_head: the SA model of model.py without its variant machinery."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.block_size, c.n_embd)
        self.blocks = nn.ModuleList([nn.ModuleDict(dict(
            ln1=nn.LayerNorm(c.n_embd), qkv=nn.Linear(c.n_embd, 3 * c.n_embd), proj=nn.Linear(c.n_embd, c.n_embd),
            ln2=nn.LayerNorm(c.n_embd), fc=nn.Linear(c.n_embd, 4 * c.n_embd), fc2=nn.Linear(4 * c.n_embd, c.n_embd),
        )) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            q, k, v = b.qkv(b.ln1(x)).view(B, T, 3, self.c.n_head, -1).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + b.proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + b.fc2(F.gelu(b.fc(b.ln2(x))))
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# -----------------------------------------------------------------------------
# one case, in its own process

def proc_status(key):
    """A memory figure of /proc/self/status (VmRSS, VmHWM), in bytes."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class StepMemory:
    """Memory a step needs beyond what is held when it starts: CUDA's allocator peak after a
    reset, or on CPU the RSS high-water mark reset just before the step (Linux); elsewhere
    getrusage's lifetime peak minus the RSS before (None if that comes out negative)."""

    def __init__(self, device):
        self.device = device
        if device == 'cuda':
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return
        try:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')  # reset VmHWM to the current RSS
            self.reset = True
            self.base = proc_status('VmHWM')
        except OSError:
            self.reset = False
            self.base = proc_status('VmRSS')

    def peak(self):
        """(bytes the step needed, whole peak or None)"""
        if self.device == 'cuda':
            total = torch.cuda.max_memory_allocated()
            return total - self.base, total
        if self.reset:  # the reading itself touches a few pages: 0 means nothing new to within them
            return max(0, proc_status('VmHWM') - self.base), None
        used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base
        return (used if used >= 0 else None), None


def sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def timed(step, device, min_time, min_iters, warmup=1, best=False):
    """Seconds per call of step(): `warmup` untimed calls, then at least min_iters calls and
    min_time seconds; the mean, or with best=True the fastest call (robust to a shared machine)."""
    for _ in range(warmup):
        step()
        sync(device)
    times, t_end = [], time.perf_counter() + min_time
    while len(times) < min_iters or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times) if best else sum(times) / len(times)


def train_step(model, opt, x, y, accum=1, grad_clip=None, ctx=None, forward=None):
    """One optimizer step as train.py takes it: `accum` micro-batches forward (under ctx) and
    backward, the gradient norm clipped (grad_clip; 0: measured, not clipped, as train.py;
    None: skipped), the optimizer step. forward: a compiled model, else the model itself."""
    forward, ctx = forward or model, ctx or contextlib.nullcontext()

    def step():
        for _ in range(accum):
            with ctx:
                _, loss = forward(x, y)
            (loss / accum).backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float('inf'))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def random_batch(vocab, B, T, device='cpu'):
    idx = torch.randint(vocab, (B, T + 1), device=device)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def run_case(case):
    torch.set_num_threads(case['threads'])
    torch.manual_seed(0)
    dev, T, B, variant, mode = case['device'], case['block_size'], case['batch_size'], case['variant'], case['mode']
    args = argparse.Namespace(**case['model'])
    cfg = bench_config(variant, T, args)
    rec = dict(variant=variant, mode=mode, block_size=T, batch_size=B, device=dev, threads=case['threads'])
    if mode == 'attention':
        layer = make_attention(cfg).to(dev)
        x = torch.randn(B, T, cfg.n_embd, device=dev, requires_grad=True)
        n_w = sum(m.weight.numel() for m in layer.modules() if isinstance(m, nn.Linear))
        flops_per_token = 3 * (2 * n_w + layer.mix_flops(T))

        def step():
            layer(x).sum().backward()
    else:
        model = (MinimalGPT(cfg) if variant == 'sdpa_min' else GPT(cfg)).to(dev)
        flops_per_token = model_flops_per_token(bench_config('sa' if variant == 'sdpa_min' else variant, T, args))
        step = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-4), *random_batch(cfg.vocab_size, B, T, dev))
    memory = StepMemory(dev)
    dt = timed(step, dev, case['min_time'], case['min_iters'])
    used, total = memory.peak()
    rec.update(seconds_per_step=dt, tokens_per_s=B * T / dt, peak_mem_bytes=used, peak_mem_total_bytes=total,
               flops_per_token=float(flops_per_token), flops_per_s=B * T * flops_per_token / dt)
    return rec


def release_freed_memory():
    """Hand the pages free()d by the allocator back to the system (glibc), so RSS reads what
    is held: after FSDP shards a model built whole, the whole copy is gone from RSS too."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run_memory_case(case):
    """One process of a --memory case (under torchrun when case['nproc'] > 1): a few training
    steps of a GPT, as train.py takes them; the memory and time of the process that needs the most."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(case['threads'])
    n_layer, n_embd, vocab, T, B = case['memory_model']
    world = int(os.environ.get('WORLD_SIZE', 1))
    if world > 1:
        dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=n_embd // 64, n_embd=n_embd, vocab_size=vocab, block_size=T,
                          bias=False, attention=case['variant']))
    model.activation_checkpointing = case['activation_checkpointing']
    forward = model
    if case['parallel'] == 'fsdp':
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    elif world > 1:
        forward = DDP(model)
    opt = model.configure_optimizers(0.1, 1e-4, (0.9, 0.95), 'cpu')
    step = train_step(model, opt, *random_batch(vocab, B, T), grad_clip=1.0, forward=forward)
    step()  # AdamW's state is allocated here: it is held memory, not the step's
    release_freed_memory()
    memory = StepMemory('cpu')
    held = proc_status('VmRSS')
    dt = timed(step, 'cpu', 0, case['steps'], warmup=0, best=True)  # as many steps on every process (collectives)
    used, _ = memory.peak()
    mine = dict(held_bytes=held, peak_bytes=held + used, step_bytes=used, seconds_per_step=dt)
    ranks = [mine]
    if world > 1:
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
        dist.barrier()  # every process past the gather before any exits
    rec = dict(variant=case['variant'], mode='memory', parallel=case['parallel'] if world > 1 else 'one process',
               processes=world, activation_checkpointing=case['activation_checkpointing'],
               n_layer=n_layer, n_embd=n_embd, vocab=vocab, block_size=T, batch_size=B, threads=case['threads'],
               params=model.get_num_params(non_embedding=False),
               **{k: max(r[k] for r in ranks) for k in mine})
    rec['tokens_per_s'] = world * B * T / rec['seconds_per_step']
    return rec


def memory_rows(args):
    """--memory: every case in fresh processes (torchrun for 2), the table on stdout."""
    n_layer, n_embd, vocab, T, B = (int(x) for x in args.memory_model.split(','))
    rows = []
    for nproc, parallel in ((1, 'ddp'), (2, 'ddp'), (2, 'fsdp')):
        for ac in (False, True):
            case = dict(mode='memory', variant=args.memory_variant, parallel=parallel, activation_checkpointing=ac,
                        threads=args.threads, memory_model=[n_layer, n_embd, vocab, T, B], nproc=nproc,
                        steps=args.memory_steps)
            launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run',
                                                             '--standalone', f'--nproc_per_node={nproc}']
            print(f"memory: {nproc} process{'es' * (nproc > 1)}{f', {parallel}' * (nproc > 1)}"
                  f"{', activation checkpointing' * ac}", file=sys.stderr, flush=True)
            p = subprocess.Popen([*launcher, os.path.abspath(__file__), '--case', json.dumps(case)], text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                 env={**os.environ, 'OMP_NUM_THREADS': str(args.threads)})
            try:
                out, err = p.communicate(timeout=args.memory_timeout)
            except subprocess.TimeoutExpired:  # the result may be out already: a process that hangs on exit
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
            line = [x for x in out.splitlines() if x.startswith('RESULT ')]
            if not line:
                rows.append(dict(case, processes=nproc, error=(err.strip().splitlines() or ['no result'])[-1][:200]))
                continue
            rows += json.loads(line[0][len('RESULT '):])
    mib = lambda b: f"{b / 2 ** 20:9.0f}"
    print(f"{'setup':<44}{'held MiB':>9}{'peak MiB':>9}{'step MiB':>9}{'s/step':>8}{'tokens/s':>10}")
    for r in rows:
        name = (f"{r['processes']} process{'es' * (r['processes'] > 1)}" + (f", {r['parallel']}" * (r['processes'] > 1))
                + (', activation checkpointing' if r['activation_checkpointing'] else ''))
        if r.get('error'):
            print(f"{name:<44}FAILED: {r['error']}")
            continue
        print(f"{name:<44}{mib(r['held_bytes'])}{mib(r['peak_bytes'])}{mib(r['step_bytes'])}"
              f"{r['seconds_per_step']:8.2f}{r['tokens_per_s']:10.0f}")
    return rows


def model_flops_per_token(cfg):
    """GPT.flops_per_token of a config, from a model on the meta device (no memory)."""
    with torch.device('meta'):
        return GPT(cfg).flops_per_token(cfg.block_size)


def mix_flops(cfg, T):
    """Attention.mix_flops of a config's layer: forward FLOPs per token of mixing keys into values."""
    with torch.device('meta'):
        return make_attention(cfg).mix_flops(T)


def run_sample(case):
    """Tokens/s of GPT.generate for n_new tokens from a 1-token prompt, with and without the
    KV cache, same seed; also whether both sampled the same tokens."""
    torch.set_num_threads(case['threads'])
    dev, n_new = case['device'], case['n_new']
    args = argparse.Namespace(**case['model'])
    cfg = bench_config(case['variant'], n_new + 1, args)
    torch.manual_seed(0)
    model = GPT(cfg).to(dev).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long, device=dev)
    out, rec = {}, []
    for use_cache in (True, False):
        torch.manual_seed(1)
        sync(dev)
        t0 = time.perf_counter()
        out[use_cache] = model.generate(prompt, n_new, use_cache=use_cache)
        sync(dev)
        dt = time.perf_counter() - t0
        rec.append(dict(variant=case['variant'], mode='sample_cache' if use_cache else 'sample_nocache',
                        block_size=cfg.block_size, batch_size=1, device=dev, threads=case['threads'],
                        new_tokens=n_new, seconds=dt, tokens_per_s=n_new / dt, peak_mem_bytes=None,
                        flops_per_token=None, frac_of_matmul_peak=None))
    same = bool(torch.equal(out[True], out[False]))
    for r in rec:
        r['identical_tokens'] = same
    return rec


# -----------------------------------------------------------------------------
# a whole GPT-2-small training step, as train.py takes it on a GPU

GPT2_VARIANTS = ['sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha', 'ha_r64', 'sdpa_min']


def gpt2_config(variant, shape):
    """GPT-2 small (or the given shape) with a variant's attention, as the GPU configs set it."""
    base = dict(n_layer=shape['n_layer'], n_head=shape['n_head'], n_embd=shape['n_embd'],
                vocab_size=shape['vocab'], block_size=shape['block_size'], bias=False, dropout=0.0)
    if variant == 'ha':  # config/ha.py: HA in every 4th layer, windows 512 x 32
        layers = ','.join('ha' if i % 4 == 3 else 'sa' for i in range(shape['n_layer']))
        return GPTConfig(**base, attn_layers=layers, ha_window1=512, ha_window2=32)
    if variant == 'ha_r64':  # config/ia_table.py: HA in every layer, windows 64 x 64
        return GPTConfig(**base, attention='ha', ha_window1=64, ha_window2=64)
    return GPTConfig(**base, attention='sa' if variant == 'sdpa_min' else variant)


def run_gpt2_step(case):
    """Tokens/s and MFU of train.py's step on GPT-2 small: forward and backward under
    autocast, gradient clipping, fused AdamW (on CUDA), torch.compile on or off."""
    torch.set_num_threads(case['threads'])
    torch.manual_seed(0)
    dev, variant, shape, B = case['device'], case['variant'], case['shape'], case['batch_size']
    T = shape['block_size']
    cfg = gpt2_config(variant, shape)
    model = (MinimalGPT(cfg) if variant == 'sdpa_min' else GPT(cfg)).to(dev)
    flops_per_token = model_flops_per_token(gpt2_config('sa' if variant == 'sdpa_min' else variant, shape))
    opt = GPT.configure_optimizers(model, 0.1, 6e-4, (0.9, 0.95), dev) if variant != 'sdpa_min' else \
        torch.optim.AdamW(model.parameters(), lr=6e-4, fused=dev == 'cuda')
    dtype = getattr(torch, case['dtype'])
    ctx = torch.autocast(device_type=dev, dtype=dtype) if dtype != torch.float32 else None
    step = train_step(model, opt, *random_batch(cfg.vocab_size, B, T, dev), grad_clip=1.0, ctx=ctx,
                      forward=torch.compile(model) if case['compile'] else None)

    t0 = time.perf_counter()
    step()  # compilation, autotuning, allocator warm-up
    sync(dev)
    first_s = time.perf_counter() - t0
    memory = StepMemory(dev)
    dt = timed(step, dev, case['min_time'], case['min_iters'])
    used, total = memory.peak()
    peak, source = hardware.peak_flops(dev, case.get('peak_flops', 0.0))
    tokens_per_s = B * T / dt
    return dict(variant=variant, mode='gpt2_step' + ('_compiled' if case['compile'] else ''), block_size=T,
                batch_size=B, device=dev, threads=case['threads'], dtype=case['dtype'], compile=case['compile'],
                seconds_per_step=dt, first_step_s=first_s, tokens_per_s=tokens_per_s, peak_mem_bytes=used,
                peak_mem_total_bytes=total, flops_per_token=float(flops_per_token),
                flops_per_s=tokens_per_s * flops_per_token, mfu=tokens_per_s * flops_per_token / peak,
                peak_flops=peak, peak_flops_source=source)


def gpt2_cases(args):
    shape = dict(n_layer=12, n_head=12, n_embd=768, vocab=50304, block_size=1024)
    dtype = 'bfloat16' if args.device == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    return [dict(variant=v, mode='gpt2_step', shape=shape, compile=c, dtype=dtype, batch_size=args.gpt2_batch_size,
                 peak_flops=args.peak_flops)
            for v in GPT2_VARIANTS for c in (False, True)]


# -----------------------------------------------------------------------------
# kernel rows: one attention kernel alone, forward / backward / both, beside SDPA

KERNEL_ROWS = ['sdpa', 'linear', 'linear_norm', 'hfa_A1', 'hfa_A2', 'hfa_A3', 'ha_win', 'ha_win_shared', 'ha']


def kernel_call(name, B, H, T, dh, dtype, device, window=(512, 32)):
    """(inputs, f, forward FLOPs) of one kernel row: f(*inputs) -> out (B, H, T, dh). FLOPs
    are the model's own count (Attention.mix_flops: the visible pairs only, 2 per multiply-add)
    for a layer of H heads of width dh with the row's attention."""
    from attention_kernels import dispatch
    from attention_kernels.hfa.ops import hfa_attention
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).requires_grad_()

    def flops(**kw):
        return B * T * mix_flops(GPTConfig(n_layer=1, n_head=H, n_embd=H * dh, block_size=T, **kw), T)
    scale = dh ** -0.5
    if name == 'sdpa':
        x = [rand(B, H, T, dh) for _ in range(3)]
        return x, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), flops(attention='sa')
    if name.startswith('linear'):
        x = [rand(B, H, T, dh) for _ in range(3)]
        norm = name == 'linear_norm'
        lin = dispatch('triton', 'linear', x[0], x[1])  # chunked from CHUNKED_MIN_T on, as in the model; self-checked
        return x, lambda q, k, v: lin(q, k, v, 0, True, 0, norm, 0.0), flops(attention='linear')
    if name.startswith('hfa'):
        A = int(name[-1])
        x = [rand(A, B, H, T, dh), rand(A, B, H, T, dh), rand(B, H, T, dh)]
        return x, lambda q, k, v: hfa_attention(q, k, v, 0, True, 0, scale, True, True), \
            flops(attention='hfa_v1', hfa_order=A)
    if name.startswith('ha'):
        w1, w2 = window if name.startswith('ha_win') else (0, 0)
        shared = name.endswith('shared')
        x = [rand(B, H, T, dh) for _ in range(3 if shared else 5)]
        ha = dispatch('triton' if device == 'cuda' else 'auto', 'ha', x[0], x[1][None])  # a self-check miss: an error

        def f(q, *kv):
            k1, k2, v1, v2 = (kv[0], kv[0], kv[1], kv[1]) if shared else kv
            return ha(q, [k1, k2], [v1, v2], 0, True, [w1, w2], True)
        return x, f, flops(attention='ha', ha_window1=w1, ha_window2=w2)
    raise ValueError(name)


def kernel_case(name, B, H, T, dh, dtype, device, min_time, min_iters):
    """Seconds of forward, backward and forward + backward of one kernel row."""
    x, f, fwd_flops = kernel_call(name, B, H, T, dh, dtype, device)
    out = f(*x)
    dout = torch.randn_like(out)

    def fwd():
        with torch.no_grad():
            f(*x)

    def bwd():
        torch.autograd.grad(out, x, dout, retain_graph=True)

    def both():
        torch.autograd.grad(f(*x), x, dout)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    times = {mode: timed(step, device, min_time, min_iters)
             for mode, step in (('kernel_fwd', fwd), ('kernel_bwd', bwd), ('kernel_fwd_bwd', both))}
    peak = torch.cuda.max_memory_allocated() if device == 'cuda' else None
    # backward = 2 x forward FLOPs, the convention of FlashAttention's benchmarks (no recompute counted)
    flops = {'kernel_fwd': fwd_flops, 'kernel_bwd': 2 * fwd_flops, 'kernel_fwd_bwd': 3 * fwd_flops}
    return times, flops, peak


def emit_line(args, rec):
    """Append one record to --jsonl as soon as it is measured, so that a run killed by a
    time limit still leaves every finished case."""
    if getattr(args, 'jsonl', None):
        with open(args.jsonl, 'a') as f:
            f.write(json.dumps(rec) + '\n')


def kernel_rows(args):
    """Every kernel row at every (T, dh), SDPA first at each shape; a row that fails (no
    kernel, out of memory) is recorded with its error and the sweep goes on."""
    import attention_kernels
    attention_kernels.load_triton()  # before the first custom op call, which may import triton itself
    dev = args.device
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}[args.kernel_dtype]
    peak, peak_src = hardware.peak_flops(dev)
    name = torch.cuda.get_device_name() if dev == 'cuda' else dev
    B, H = args.kernel_batch, args.kernel_heads
    records = []
    print(f"kernels on {name}, {args.kernel_dtype}, B={B} H={H}; peak {peak / 1e12:.1f} TFLOP/s ({peak_src})")
    print(f"{'kernel':<15}{'T':>6}{'dh':>5}  {'fwd ms':>8}{'bwd ms':>8}{'f+b ms':>8}  {'TFLOP/s f+b':>11}"
          f"{'% peak':>8}{'x SDPA':>8}")
    for T in args.kernel_seq_lens:
        for dh in args.kernel_head_dims:
            base = {}
            for row in args.kernel_list:
                if row == 'ha' and T > args.kernel_ha_full_max:
                    continue  # O(T^3)
                rec0 = dict(variant=row, block_size=T, batch_size=B, heads=H, head_dim=dh, dtype=args.kernel_dtype,
                            device=dev, device_name=name, peak_flops=peak, peak_source=peak_src,
                            frac_of_matmul_peak=None, flops_per_token=None)
                try:
                    times, flops, mem = kernel_case(row, B, H, T, dh, dtype, dev, args.kernel_min_time,
                                                    args.kernel_min_iters)
                except Exception as e:  # reported, not fatal
                    err = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    records.append(dict(rec0, mode='kernel_fwd_bwd', seconds=None, tokens_per_s=None,
                                        peak_mem_bytes=None, error=err))
                    emit_line(args, records[-1])
                    print(f"{row:<15}{T:>6}{dh:>5}  FAILED: {err}", flush=True)
                    if dev == 'cuda':
                        torch.cuda.empty_cache()
                    continue
                if row == 'sdpa':
                    base = times
                for mode, dt in times.items():
                    rec = dict(rec0, mode=mode, seconds=dt, tokens_per_s=B * T / dt, peak_mem_bytes=mem,
                               flops=flops[mode], tflops_per_s=flops[mode] / dt / 1e12,
                               frac_of_peak=flops[mode] / dt / peak,
                               sdpa_seconds=base.get(mode), time_vs_sdpa=dt / base[mode] if mode in base else None)
                    records.append(rec)
                    emit_line(args, rec)
                r = records[-1]
                print(f"{row:<15}{T:>6}{dh:>5}  {times['kernel_fwd'] * 1e3:>8.3f}{times['kernel_bwd'] * 1e3:>8.3f}"
                      f"{times['kernel_fwd_bwd'] * 1e3:>8.3f}  {r['tflops_per_s']:>11.1f}{100 * r['frac_of_peak']:>7.1f}%"
                      f"{r['time_vs_sdpa'] or float('nan'):>8.2f}", flush=True)
    return records


def add_kernel_args(p):
    g = p.add_argument_group('kernel rows (default on CUDA)')
    g.add_argument('--kernels', choices=['auto', 'on', 'off'], default='auto', help='auto: on for --device cuda')
    g.add_argument('--kernels_only', action='store_true', help='only the kernel rows')
    g.add_argument('--kernel_seq_lens', default='1024,4096,8192')
    g.add_argument('--kernel_head_dims', default='64,128')
    g.add_argument('--kernel_batch', type=int, default=2)
    g.add_argument('--kernel_heads', type=int, default=8)
    g.add_argument('--kernel_dtype', default='bf16', choices=['bf16', 'fp16', 'fp32'])
    g.add_argument('--kernel_list', default=','.join(KERNEL_ROWS))
    g.add_argument('--kernel_ha_full_max', type=int, default=1024, help='longest T for the full (O(T^3)) ha row')
    g.add_argument('--kernel_min_time', type=float, default=0.2)
    g.add_argument('--kernel_min_iters', type=int, default=3)
    g.add_argument('--jsonl', default=None, help='append each kernel record to this file as it is measured')


def parse_kernel_args(args):
    args.kernel_seq_lens = [int(s) for s in str(args.kernel_seq_lens).split(',')]
    args.kernel_head_dims = [int(s) for s in str(args.kernel_head_dims).split(',')]
    args.kernel_list = [s.strip() for s in args.kernel_list.split(',')]
    unknown = set(args.kernel_list) - set(KERNEL_ROWS)
    if unknown:
        raise SystemExit(f"error: unknown kernel rows {sorted(unknown)}; valid: {', '.join(KERNEL_ROWS)}")
    return args.kernels == 'on' or args.kernels_only or (args.kernels == 'auto' and args.device == 'cuda')


# -----------------------------------------------------------------------------
# every variant at the CPU configs' size: docs/attention.md's table

TABLE_SIZE = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=65, bias=False, dropout=0.0)
TABLE_VARIANTS = {  # name -> GPTConfig overrides
    'sa': dict(attention='sa'),
    'linear': dict(attention='linear'),
    'linear (norm)': dict(attention='linear', linear_norm=True),
    'hfa_v1 A=2': dict(attention='hfa_v1', hfa_order=2),
    'hfa_v1 A=2, dh=d/(HA)': dict(attention='hfa_v1', hfa_order=2, head_dim=16),
    'hfa_v2 A=2': dict(attention='hfa_v2', hfa_order=2),
    'hfa_v2 A=3': dict(attention='hfa_v2', hfa_order=3),
    'hfa_v1 2 SA + 2 HFA': dict(attention='hfa_v1', n_hfa_head=2),
    'hfa_v1 no softmax': dict(attention='hfa_v1', softmax=False),
    'ha': dict(attention='ha'),
    'ha shared': dict(attention='ha', ha_share_kv=True),
    'ha w=32/8': dict(attention='ha', ha_window1=32, ha_window2=8),
    'ha no softmax': dict(attention='ha', softmax=False),
    'ha order 4': dict(attention='ha', ha_order=4),
    'sa sa sa ha': dict(attn_layers='sa,sa,sa,ha'),
}
TABLE_NOT_RUN = {'ha order 4'}  # its reference materialises B*H*T^4 weights: not run at T = 128


def variant_table(args):
    """Parameters, training FLOPs per token and tokens/s of a training step (forward, backward,
    AdamW) on random tokens, every variant in one process: the fastest of --table_steps steps
    after two warm-up steps (the fastest, as the machine is shared). A markdown table."""
    names = [n.strip() for n in args.table_only.split(',')] if args.table_only else list(TABLE_VARIANTS)
    unknown = set(names) - set(TABLE_VARIANTS)
    if unknown:
        raise SystemExit(f"error: unknown table rows {sorted(unknown)}; valid: {', '.join(TABLE_VARIANTS)}")
    B, T = args.batch_size or 8, TABLE_SIZE['block_size']
    print(f"size {TABLE_SIZE}, batch {B} x {T}, fp32, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print('| variant | params (non-emb.) | train MFLOPs/token | CPU tokens/s |')
    print('|---|---:|---:|---:|')
    records = []
    for name in names:
        torch.manual_seed(0)
        model = GPT(GPTConfig(**{**TABLE_SIZE, **TABLE_VARIANTS[name]})).to(args.device)
        tps = None
        if name not in TABLE_NOT_RUN:
            opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), args.device)
            step = train_step(model, opt, *random_batch(TABLE_SIZE['vocab_size'], B, T, args.device))
            tps = B * T / timed(step, args.device, 0.0, args.table_steps, warmup=2, best=True)
        rec = dict(variant=name, mode='table', block_size=T, batch_size=B, device=args.device,
                   params=model.get_num_params(), flops_per_token=model.flops_per_token(), tokens_per_s=tps)
        records.append(rec)
        print(f"| {name} | {rec['params']:,} | {rec['flops_per_token'] / 1e6:.2f} | "
              f"{'n/a' if tps is None else f'{tps:,.0f}'} |", flush=True)
    return records


# -----------------------------------------------------------------------------
# a compare.py grid's seconds per step, for comparisons at equal training time

def grid_step(cfg, vocab):
    """A training step of one grid run (a compare.py run configuration) on random tokens, as
    train.py takes it on CPU; the data loading left out."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_dict({**cfg, 'vocab_size': vocab}))
    opt = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'], (cfg['beta1'], cfg['beta2']), 'cpu')
    for group in opt.param_groups:  # every round times the same model: repeated steps on one batch at the
        group['lr'] = 0.0           # grid's rate drift the weights into denormals (HA at width 192: 0.26 -> 1.3 s)
    return train_step(model, opt, *random_batch(vocab, cfg['batch_size'], cfg['block_size']),
                      accum=cfg['gradient_accumulation_steps'], grad_clip=cfg['grad_clip'])


def ha_fallback_rows(args):
    """What HA's PyTorch forms launch when they stand in for the Triton kernel on a GPU: per
    call of one layer's heads (forward + backward, --ha_fallback_shape), the aten ops and the
    bytes their outputs write, counted on meta tensors (shapes only: nothing is computed, so
    the [IA] table's shape is counted on any machine), each form with the chunk bound it
    would have on CUDA, and a time estimate from the bytes alone at --ha_fallback_bandwidth."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from attention_kernels.ha import pytorch as blockwise
    from attention_kernels.ha import windowed

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view or func in (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default):
                return out  # no kernel, nothing written
            self.ops += 1
            self.bytes += sum(t.nbytes for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
            return out

    N, T, dh, w1, w2 = (int(x) for x in args.ha_fallback_shape.split(','))
    dtype = getattr(torch, args.ha_fallback_dtype)
    q, k, v = (torch.empty(N, T, dh, dtype=dtype, device='meta') for _ in range(3))
    geo = (0, True, w1, w2, dh ** -0.5)
    rows = []
    bound = windowed.CHUNK_ELEMENTS
    saved = dict(bound)
    bound['meta'] = bound['cuda']
    try:
        for name, form in (('windowed', windowed), ('blockwise', blockwise)):
            if name == 'windowed' and not windowed.applies(True, w1, w2):
                continue
            with Count() as fwd:
                out, lse, out32 = form.ha3_forward(q, k, k, v, v, *geo)
            with Count() as bwd:
                form.ha3_backward(q, k, k, v, v, out if out32 is None else out32, lse, torch.empty_like(out), *geo)
            total = fwd.bytes + bwd.bytes
            rows.append(dict(kind='ha_fallback', form=name, shape=dict(N=N, T=T, dh=dh, windows=[w1, w2]),
                             dtype=args.ha_fallback_dtype, fwd_ops=fwd.ops, bwd_ops=bwd.ops, fwd_bytes=fwd.bytes,
                             bwd_bytes=bwd.bytes, bandwidth=args.ha_fallback_bandwidth,
                             seconds_estimate=2 * total / args.ha_fallback_bandwidth,  # each byte written is read once
                             note='ops and bytes counted on meta tensors; the time assumes every byte written is '
                                  'read back once at the bandwidth, no launch cost: an estimate'))
            print(f"{name}: forward {fwd.ops} ops {fwd.bytes / 1e9:.2f} GB, backward {bwd.ops} ops "
                  f"{bwd.bytes / 1e9:.2f} GB, ~{rows[-1]['seconds_estimate'] * 1e3:.1f} ms", flush=True)
    finally:
        bound.clear()
        bound.update(saved)
    return rows


def grid_step_times(compare_argv, rounds):
    """Seconds per step of every variant of the compare.py grid these arguments describe
    (its --config, --variants, --preset, overrides and --out), in one process, one thread:
    `rounds` rounds visit the variants in turn, 3 steps each after two warm-up steps; the
    median goes to OUT/step_times.json."""
    from nanohfa import grid
    from nanohfa import data
    args = grid.parse_args(compare_argv)
    variants = grid.plan(args)
    folder = data.folder_of(variants[0]['cfg']['data_dir'], variants[0]['cfg']['dataset'])
    if not (folder / 'train.bin').exists():  # else the vocabulary falls back to GPT-2's and the head dominates
        sys.exit(f"{folder / 'train.bin'} not found: prepare the grid's dataset first (README), then time its steps")
    torch.set_num_threads(1)
    vocab = grid.vocab_size(variants[0]['cfg'])
    steps = {v['variant']: grid_step(v['cfg'], vocab) for v in variants}
    for step in steps.values():  # warm-up: allocator, first-call overheads
        timed(step, 'cpu', 0.0, 1)
    times = {name: [] for name in steps}
    for r in range(rounds):
        for name, step in steps.items():
            times[name].append(timed(step, 'cpu', 0.0, 3, warmup=0))
        print(f"round {r + 1}/{rounds}: " + ', '.join(f"{n} {t[-1] * 1000:.0f} ms" for n, t in times.items()), flush=True)
    result = {'threads': 1, 'rounds': rounds, 'load_average': os.getloadavg()[0],
              'seconds_per_step': {n: statistics.median(t) for n, t in times.items()}, 'all_seconds': times}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, 'step_times.json')
    with open(path, 'w') as f:
        json.dump(result, f, indent=1)
    ref = result['seconds_per_step'].get(grid.REFERENCE)
    for n, t in result['seconds_per_step'].items():
        print(f"{n:>14}: {t * 1000:8.1f} ms/step" + (f"  ({t / ref:.2f}x {grid.REFERENCE})" if ref else ''))
    print(f"wrote {path}")
    return result


# -----------------------------------------------------------------------------
# the sweep: one subprocess per case

def plan(args):
    cases = []
    for T in args.block_sizes:
        for variant in VARIANTS + REFERENCES + ['sdpa_min']:
            if variant == 'ha_ref' and T > args.ref_max:
                continue  # O(L^3) memory and time
            if variant == 'hfa_v1_kron' and T > args.ref_max:
                continue  # width dh^2 SDPA: slow on CPU at long context (see docs/performance.md)
            for mode in ('attention', 'train_step'):
                if variant == 'sdpa_min' and mode == 'attention':
                    continue
                cases.append(dict(variant=variant, mode=mode, block_size=T))
    return cases


# -----------------------------------------------------------------------------
# lm-eval (--lm_eval): requests per second of our lm-eval model, and the memory of its scoring

def lm_eval_model(model_args, T, dev):
    """lm_eval_model.NanoHFA over a GPT of the bench's width and GPT-2's vocabulary (and tokenizer)."""
    from nanohfa import lm_eval_model
    from nanohfa import tokenizer as tok
    n_layer, n_embd = model_args
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=max(1, n_embd // 64), n_embd=n_embd, vocab_size=50304,
                          block_size=T, bias=False))
    return lm_eval_model.NanoHFA(model=model, enc=tok.GPT2Tokenizer(), device=dev, dtype='float32')


def before_log_probs(lm, x):
    """The scoring this project had before (a baseline): the model's loss forward for every
    position's logits (cross-entropy's own log-softmax beside them), then their log-softmax."""
    with lm.ctx:
        logits, _ = lm.model(x, targets=x)
    return F.log_softmax(logits.float(), dim=-1)


def before_loglikelihood(lm, requests):
    """The loglikelihood loop this project had before: every position's log-probabilities, two host
    reads per request."""
    from lm_eval.models.utils import Collator
    order, out = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2]))), []
    for batch in order.get_batched(n=lm.batch_size):
        inputs = [(c + k)[-(lm.block_size + 1):][:-1] for _, c, k in batch]
        width = max(len(i) for i in inputs)
        with torch.no_grad():
            logp = before_log_probs(lm, torch.tensor([i + [0] * (width - len(i)) for i in inputs], device=lm.device))
        for (_, _, cont), inp, lp in zip(batch, inputs, logp):
            lp = lp[len(inp) - len(cont):len(inp)]
            target = torch.tensor(cont, device=lm.device)
            out.append((lp.gather(1, target[:, None]).sum().item(), bool((lp.argmax(-1) == target).all())))
    return order.get_original(out)


def before_generate_until(lm, requests):
    """The generation this project had before: one request at a time, always max_gen_toks tokens."""
    out = []
    for context, kw in (r.args for r in requests):
        ids = lm.tok_encode(context)[-(lm.block_size - kw['max_gen_toks']):]
        with torch.no_grad(), lm.ctx:
            y = lm.model.generate(torch.tensor([ids], device=lm.device), kw['max_gen_toks'], temperature=0.0)
        out.append(lm.tok_decode(y[0, len(ids):].tolist()))
    return out


def run_lm_eval_memory(case):
    """Peak memory of scoring every position of a B x T batch (the rolling-window case, the largest):
    'before' (before_log_probs) or 'now' (NanoHFA.score), one fresh process each."""
    torch.set_num_threads(case['threads'])
    B, T = case['batch_size'], case['block_size']
    lm = lm_eval_model((1, 64), T, 'cpu')
    x = torch.randint(50257, (B, T))
    spans = [(0, row[1:].tolist() + [0]) for row in x]  # every position predicts the next token
    memory = StepMemory('cpu')
    t0 = time.perf_counter()
    with torch.no_grad():
        before_log_probs(lm, x) if case['which'] == 'before' else lm.score(x, spans)
    dt = time.perf_counter() - t0
    used, _ = memory.peak()
    return [dict(mode='lm_eval_log_probs_memory', variant=case['which'], batch_size=B, block_size=T, vocab=50304,
                 device='cpu', threads=case['threads'], peak_mem_bytes=used, seconds=dt,
                 buffer_bytes=B * T * 50304 * 4, buffers=used / (B * T * 50304 * 4))]


def lm_eval_rows(args):
    """Requests per second of loglikelihood (multiple-choice-like: contexts of 30-200 tokens, answers of
    1-8) and of generate_until (prompts of 10-100 tokens, max_gen_toks tokens each, no stop string
    met), now and as before, the fastest of 3 rounds; then the peak memory of scoring a
    --lm_eval_size batch, before and now."""
    import random
    from types import SimpleNamespace
    torch.set_num_threads(args.threads)
    quick = args.quick
    n_layer, n_embd = (1, 64) if quick else (args.n_layer, args.n_embd)
    T, B = (64, 4) if quick else (256, 16)
    lm = lm_eval_model((n_layer, n_embd), T, args.device)
    lm.batch_size = B
    rng = random.Random(0)
    n_ll, n_gen, n_new = (8, 4, 4) if quick else (128, 32, 32)
    ll = [(None, [rng.randrange(50257) for _ in range(rng.randint(30, min(200, T - 8)))],
           [rng.randrange(50257) for _ in range(rng.randint(1, 8))]) for _ in range(n_ll)]
    prompts = [lm.tok_decode([rng.randrange(50000) for _ in range(rng.randint(10, min(100, T - n_new)))])
               for _ in range(n_gen)]
    gen = [SimpleNamespace(args=(p, {'until': [], 'max_gen_toks': n_new, 'do_sample': False})) for p in prompts]
    common = dict(device=args.device, threads=args.threads, batch_size=B, block_size=T, n_layer=n_layer,
                  n_embd=n_embd, vocab=50304)
    cases = [('lm_eval_loglikelihood', ll, B, lambda: lm._loglikelihood_tokens(ll, disable_tqdm=True), 'now'),
             ('lm_eval_loglikelihood', ll, B, lambda: before_loglikelihood(lm, ll), 'before'),
             ('lm_eval_generate_until', gen, B, lambda: lm.generate_until(gen, disable_tqdm=True),
              f'now, batches of {B}'),
             ('lm_eval_generate_until', gen, 1, lambda: lm.generate_until(gen, disable_tqdm=True),
              'now, one at a time'),
             ('lm_eval_generate_until', gen, 1, lambda: before_generate_until(lm, gen), 'before')]
    best = [float('inf')] * len(cases)
    with torch.no_grad():
        for r in range(1 if quick else 3):  # rounds over the cases: a load that comes and goes hits each alike
            for i, (_, _, batch, call, _) in enumerate(cases):
                lm.batch_size = batch
                if r == 0:
                    call()  # untimed: lazy set-up, caches warm
                sync(args.device)
                t0 = time.perf_counter()
                call()
                sync(args.device)
                best[i] = min(best[i], time.perf_counter() - t0)
    records = []
    for (name, requests, batch, _, variant), dt in zip(cases, best):
        records.append(dict(common, mode=name, variant=variant, requests=len(requests), seconds=dt,
                            requests_per_s=len(requests) / dt, **({'new_tokens': n_new} if 'generate' in name else {})))
        print(f"{name:<28}{variant:<24}{len(requests) / dt:>10.1f} requests/s", flush=True)
    mB, mT = (2, 64) if quick else [int(v) for v in args.lm_eval_size.split(',')]
    for which in ('before', 'now'):
        case = dict(mode='lm_eval_memory', which=which, batch_size=mB, block_size=mT, threads=args.threads)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), '--device=cpu', '--case', json.dumps(case)],
                           capture_output=True, text=True, timeout=1800)
        line = [s for s in r.stdout.splitlines() if s.startswith('RESULT ')]
        rec = json.loads(line[0][len('RESULT '):])[0] if line else dict(
            mode='lm_eval_log_probs_memory', variant=which, batch_size=mB, block_size=mT,
            error=(r.stderr.strip().splitlines() or ['no result'])[-1][:200])
        records.append(rec)
        print(f"{'lm_eval_log_probs_memory':<28}{which:<24}" + (f"{rec['peak_mem_bytes'] / 2 ** 30:>10.2f} GiB peak "
              f"({rec['buffers']:.2f} x the {mB} x {mT} x 50,304 float32 buffer), {rec['seconds']:.1f} s"
              if 'error' not in rec else f"  FAILED: {rec['error']}"), flush=True)
    return records


def run_any(case):
    if case['mode'] == 'lm_eval_memory':
        return run_lm_eval_memory(case)
    if case['mode'] == 'memory':
        rec = run_memory_case(case)
        return [rec] if int(os.environ.get('RANK', 0)) == 0 else []
    if case['mode'] == 'sample':
        return run_sample(case)
    return [run_gpt2_step(case) if case['mode'] == 'gpt2_step' else run_case(case)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--block_sizes', default=None, help='comma list; CPU default 64,256,1024')
    p.add_argument('--batch_size', type=int, default=None, help='default 1 on CPU, 8 on CUDA and for --table')
    p.add_argument('--quick', action='store_true', help='tiny sweep that runs in seconds')
    p.add_argument('--threads', type=int, default=1, help='CPU threads per case (see docstring)')
    p.add_argument('--n_layer', type=int, default=2)
    p.add_argument('--n_head', type=int, default=2)
    p.add_argument('--n_embd', type=int, default=64)
    p.add_argument('--vocab', type=int, default=256)
    p.add_argument('--window1', type=int, default=128)
    p.add_argument('--window2', type=int, default=32)
    p.add_argument('--ref_max', type=int, default=256, help='largest block size for the O(L^3) rows')
    p.add_argument('--sample_tokens', type=int, default=512)
    p.add_argument('--gpt2', choices=('auto', 'on', 'off', 'only'), default='auto',
                   help='GPT-2-small training-step rows (auto: on CUDA only; only: nothing else)')
    p.add_argument('--gpt2_batch_size', type=int, default=8, help='micro-batch of the GPT-2-small rows')
    p.add_argument('--peak_flops', type=float, default=0.0, help="MFU denominator (0: hardware.py's)")
    p.add_argument('--in_process', action='store_true', help='no subprocess per case (implied by --quick)')
    p.add_argument('--out', default=None, help='write the records as JSON')
    p.add_argument('--case', default=None, help=argparse.SUPPRESS)  # internal: run one case
    p.add_argument('--table', action='store_true', help="only docs/attention.md's table of every variant")
    p.add_argument('--table_only', default='', help='comma list of table rows (default: all)')
    p.add_argument('--table_steps', type=int, default=5, help='timed steps per table row (the fastest counts)')
    p.add_argument('--rounds', type=int, default=5, help='--step_times: rounds over the variants')
    p.add_argument('--step_times', nargs=argparse.REMAINDER, metavar='COMPARE_ARGS',
                   help="last: the rest are a compare.py grid's arguments; writes its OUT/step_times.json")
    g = p.add_argument_group('--memory: activation checkpointing, DDP and FSDP on CPU')
    g.add_argument('--memory', action='store_true', help='only the memory rows (peak RSS per process, s/step)')
    g.add_argument('--memory_model', default='8,512,8192,256,4',
                   help='n_layer,n_embd,vocab,block_size,batch_size (heads of 64; batch per process)')
    g.add_argument('--memory_variant', default='sa')
    g.add_argument('--memory_steps', type=int, default=3, help='timed steps per case (the fastest counts)')
    g.add_argument('--memory_timeout', type=float, default=600, help='seconds per case')
    g = p.add_argument_group('--stop_save: from a stop to a finished save')
    g.add_argument('--stop_save', action='store_true', help='only the stop-to-save rows (local, and SLURM if reachable)')
    g.add_argument('--stop_sizes', default='4x256,8x512', help='models, n_layer x n_embd (heads of 64)')
    g = p.add_argument_group('--shards: training windows from shards vs one file')
    g.add_argument('--shards', action='store_true', help='only the shard rows (windows/s, resident memory)')
    g.add_argument('--shard_count', type=int, default=2000, help="shards (FineWeb-100B's are 1,000+)")
    g.add_argument('--shard_tokens', type=int, default=100_000, help='tokens per shard')
    g.add_argument('--shard_batches', type=int, default=300, help='batches of 12 windows per timed round')
    g = p.add_argument_group('--lm_eval: our lm-eval model (lm_eval_model.py)')
    g.add_argument('--lm_eval', action='store_true',
                   help='only the lm-eval rows: loglikelihood and generate_until requests/s, scoring memory')
    g.add_argument('--lm_eval_size', default='16,1024',
                   help='batch,block_size of the scoring-memory rows (vocabulary 50,304; the old path needs ~2 GB '
                        'per 1,000 x 50,304 positions)')
    g = p.add_argument_group("--ha_fallback: HA's PyTorch forms as a GPU fallback (ops and bytes, meta tensors)")
    g.add_argument('--ha_fallback', action='store_true', help='only the HA fallback rows')
    g.add_argument('--ha_fallback_shape', default='144,1024,64,64,64',
                   help="N (batch x heads of one layer's call),T,dh,w1,w2; default: the [IA] table's HA")
    g.add_argument('--ha_fallback_dtype', default='bfloat16')
    g.add_argument('--ha_fallback_bandwidth', type=float, default=3.35e12, help='bytes/s (H100 SXM HBM3)')
    add_kernel_args(p)
    args = p.parse_args()

    if args.device != 'cpu':  # a device this machine lacks: one line (errors.py), not an assertion deep in torch
        devices.pick_device(args.device)
    if args.case:
        result = run_any(json.loads(args.case))
        if int(os.environ.get('RANK', 0)) == 0:  # under torchrun: one line, from the first process
            print('RESULT ' + json.dumps(result))
        return
    if args.memory:
        write_records(memory_rows(args), args.out)
        return
    if args.shards:
        write_records(shard_rows(args), args.out)
        return
    if args.lm_eval:
        write_records(lm_eval_rows(args), args.out)
        return
    if args.stop_save:
        write_records(stop_save_rows(args), args.out)
        return
    if args.step_times is not None:
        grid_step_times(args.step_times, args.rounds)
        return
    if args.ha_fallback:
        write_records(ha_fallback_rows(args), args.out)
        return
    with_kernels = parse_kernel_args(args)
    if args.kernels_only:
        write_records(kernel_rows(args), args.out)
        return
    cpu = args.device == 'cpu'
    if cpu:
        torch.set_num_threads(args.threads)
    if args.table:
        write_records(variant_table(args), args.out)
        return
    if args.block_sizes:
        args.block_sizes = [int(s) for s in args.block_sizes.split(',')]
    else:
        args.block_sizes = [32] if args.quick else ([64, 256, 1024] if cpu else [64, 128, 256, 512, 1024])
    if args.quick:
        args.ref_max, args.sample_tokens = min(args.ref_max, max(args.block_sizes)), 16
    B = args.batch_size or (1 if cpu else 8)
    model_args = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab=args.vocab,
                      window1=args.window1, window2=args.window2)
    common = dict(device=args.device, threads=args.threads, batch_size=B, model=model_args,
                  min_time=0.05 if args.quick else 1.0, min_iters=1 if args.quick else 2)

    peak0 = hardware.measured_matmul_flops(args.device, 256 if args.quick else 1024, 0.1 if args.quick else 0.5)
    print(f"device {args.device}, threads {args.threads}, batch {B}, model n_layer={args.n_layer} "
          f"n_head={args.n_head} n_embd={args.n_embd} vocab={args.vocab}")

    cases = []
    if args.gpt2 != 'only':
        cases = [dict(common, **c) for c in plan(args)]
        cases += [dict(common, variant='sa', mode='sample', n_new=args.sample_tokens)]
    if args.gpt2 in ('on', 'only') or (args.gpt2 == 'auto' and not cpu):
        cases += [dict(common, **c, min_time=2.0, min_iters=10) for c in gpt2_cases(args)]
    records = []
    t_start = time.time()
    for i, case in enumerate(cases):  # progress on stderr; the table once, at the end
        print(f"[{i + 1}/{len(cases)}] {case['variant']} {case['mode']}{' compiled' * bool(case.get('compile'))} "
              f"{case.get('block_size') or ''}", file=sys.stderr, flush=True)
        if args.in_process or args.quick:  # one process for every case
            records += run_any(case)
            continue
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), '--case', json.dumps(case)],
                               capture_output=True, text=True, timeout=args_timeout(args))
            line = [s for s in r.stdout.splitlines() if s.startswith('RESULT ')]
            if not line:
                raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'no result')
            records += json.loads(line[0][len('RESULT '):])
        except Exception as e:  # a case that fails (OOM, timeout) is reported, not fatal
            records.append(dict(variant=case['variant'], mode=case['mode'], block_size=case.get('block_size'),
                                batch_size=case['batch_size'], tokens_per_s=None, peak_mem_bytes=None,
                                flops_per_token=None, frac_of_matmul_peak=None, error=str(e)[:200]))
    peak1 = hardware.measured_matmul_flops(args.device, 256 if args.quick else 1024, 0.1 if args.quick else 0.5)
    peak = max(peak0, peak1)
    for rec in records:
        if rec.get('flops_per_s'):
            rec['frac_of_matmul_peak'] = rec['flops_per_s'] / peak
            rec['matmul_flops_per_s'] = peak
    print(f"matmul peak (fp32 1024^3, same threads): {peak / 1e9:.1f} GFLOP/s "
          f"(start {peak0 / 1e9:.1f}, end {peak1 / 1e9:.1f}); % mm column = achieved / peak; "
          f"MFU column (gpt2_step rows) = achieved / dense bf16 peak (hardware.py)\n")
    print(f"{'variant':<16}{'mode':<19}{'L':>5}{'B':>3}{'tokens/s':>11}{'peak MiB':>10}{'GFLOP/tok':>11}"
          f"{'GFLOP/s':>9}{'% mm':>7}{'MFU %':>7}")
    for rec in records:
        print_row(rec)
    print(f"total {time.time() - t_start:.0f} s")
    if with_kernels:
        records += kernel_rows(args)
    write_records(records, args.out)


def shard_rows(args):
    """Windows per second from shards vs one file of the same tokens, and the resident memory
    of opening each and of reading from both."""
    import shutil
    import tempfile
    from pathlib import Path
    import numpy as np
    from nanohfa import data
    from nanohfa import shards
    n, k, T, B = args.shard_tokens, args.shard_count, 1024, 12
    tmp = tempfile.mkdtemp(prefix='bench-shards-')
    try:
        one, sh = os.path.join(tmp, 'one'), os.path.join(tmp, 'shards')
        os.makedirs(one)
        os.makedirs(sh)
        tokens = np.random.default_rng(0).integers(0, 50257, n * k, dtype=np.uint16)
        tokens.tofile(os.path.join(one, 'train.bin'))
        for i in range(k):
            path = os.path.join(sh, f'train_{i:06d}.bin')
            os.replace(shards.write_shard(Path(path), [tokens[i * n:(i + 1) * n]], n), path)
        del tokens
        rss0 = proc_status('VmRSS')
        opened = data.split_tokens(sh, 'train', T)
        rss1 = proc_status('VmRSS')
        single = data.split_tokens(one, 'train', T)
        rss2 = proc_status('VmRSS')
        g = torch.Generator().manual_seed(0)
        offsets = [torch.randint(len(single) - T, (B,), generator=g) for _ in range(args.shard_batches)]
        for o in offsets:  # the same batches from both (and the page cache warm for both)
            assert all(torch.equal(a, b) for a, b in zip(data.windows(opened, o, T), data.windows(single, o, T)))
        rss3 = proc_status('VmRSS')
        spent = {'shards': [], 'one_file': []}  # seconds per batch
        for r in range(args.rounds):  # the two take turns batch by batch: a load that comes and goes hits both
            for j, o in enumerate(offsets):
                for name, split in (('shards', opened), ('one_file', single))[::1 - 2 * ((r + j) % 2)]:
                    t0 = time.perf_counter()
                    data.windows(split, o, T)
                    spent[name].append(time.perf_counter() - t0)
        rss4 = proc_status('VmRSS')
        med = {name: B / statistics.median(s) for name, s in spent.items()}
        ratio = med['shards'] / med['one_file']
        rec = dict(mode='shards', shard_count=k, shard_tokens=n, block_size=T, batch_size=B, rounds=args.rounds,
                   windows_per_s_shards=round(med['shards']), windows_per_s_one_file=round(med['one_file']),
                   ratio=round(ratio, 3), open_rss_bytes=rss1 - rss0, open_rss_bytes_one_file=rss2 - rss1,
                   read_rss_bytes=rss4 - rss2, first_read_rss_bytes=rss3 - rss2,
                   windows_read=2 * B * len(offsets) * (args.rounds + 1), files_open=len(shards.OPEN),
                   files_open_limit=shards.OPEN.limit(), data_bytes=2 * n * k)
        print(f"{k} shards of {n:,} tokens vs one file: {rec['windows_per_s_shards']:,} vs "
              f"{rec['windows_per_s_one_file']:,} windows/s (ratio {rec['ratio']}); resident memory: opening the "
              f"shards {rec['open_rss_bytes'] / 2 ** 10:.0f} KiB, the file {rec['open_rss_bytes_one_file'] / 2 ** 10:.0f}"
              f" KiB, reading {rec['windows_read']:,} windows from both {rec['read_rss_bytes'] / 2 ** 10:.0f} KiB, "
              f"for {rec['data_bytes'] / 2 ** 20:.0f} MiB of tokens; {rec['files_open']} files open "
              f"(limit {rec['files_open_limit']})")
        return [rec]
    finally:
        shards.OPEN.close_all()
        shutil.rmtree(tmp)


def stop_save_rows(args):
    """Seconds from a stop to the finished save of a 2-process run, through each launcher."""
    import shutil
    import tempfile
    import numpy as np
    from nanohfa import grid_runs
    from nanohfa import slurm
    tmp = tempfile.mkdtemp(prefix='bench-stop-')
    data = os.path.join(tmp, 'data')
    os.makedirs(data)
    rng = np.random.default_rng(0)
    rng.integers(0, 64, 200_000, dtype=np.uint16).tofile(os.path.join(data, 'train.bin'))
    rng.integers(0, 64, 20_000, dtype=np.uint16).tofile(os.path.join(data, 'val.bin'))
    with open(os.path.join(data, 'meta.json'), 'w') as f:
        json.dump({'tokenizer': 'char', 'vocab_size': 64, 'itos': [chr(48 + i) for i in range(64)]}, f)
    has_slurm = shutil.which('sinfo') and subprocess.run(['sinfo', '-h'], capture_output=True).returncode == 0
    records = []
    try:
        for size in args.stop_sizes.split(','):
            n_layer, n_embd = (int(x) for x in size.split('x'))
            for launcher in ['local'] + ['slurm'] * bool(has_slurm):
                out = os.path.join(tmp, f'{launcher}-{size}')
                cmd = [sys.executable, 'compare.py', '--variants', 'sa', '--seeds', '1', '--out', out, '--nproc', '2',
                       '--threads', '1', '--preset', 'sa', 'attention=sa', f'n_layer={n_layer}', f'n_embd={n_embd}',
                       f'n_head={n_embd // 64}', f'--data_dir={data}', '--device=cpu', '--compile=False',
                       '--block_size=64', '--batch_size=4', '--gradient_accumulation_steps=2', '--max_iters=1000000',
                       '--eval_interval=1000000', '--log_interval=1000000', '--eval_iters=1']
                run = os.path.join(out, 'runs', 'sa', 'seed0')
                ckpt, steps = os.path.join(run, 'ckpt.pt'), os.path.join(run, 'train_log.jsonl')
                if launcher == 'slurm':
                    cmd += ['--launcher=slurm', '--slurm_signal_s=600', '--slurm_time=60']
                    subprocess.run(cmd, cwd=os.path.dirname(os.path.abspath(__file__)), check=True, capture_output=True)
                    proc = None
                else:
                    proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.abspath(__file__)),
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                deadline = time.time() + 600
                while not (os.path.exists(steps) and len(open(steps).readlines()) >= 3):
                    assert time.time() < deadline and (proc is None or proc.poll() is None), f"{launcher} {size}: no steps"
                    time.sleep(0.2)
                t0 = time.time()
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=900)
                    exited = time.time()
                else:
                    job = slurm.read_record(run)['job_id']
                    subprocess.run(['scancel', '--signal=USR2', job], check=True)
                    while not any(s.get('stop') for s in (slurm.read_record(run) or {}).get('segments', [])):
                        assert time.time() < t0 + 900, 'no segment recorded'
                        time.sleep(0.2)
                    exited = time.time()  # the segment is recorded once train.py has exited
                    subprocess.run(['scancel', job])
                rec = dict(mode='stop_save', launcher=launcher, nproc=2, backend='gloo', n_layer=n_layer, n_embd=n_embd,
                           ckpt_bytes=os.path.getsize(ckpt), saved_iter=grid_runs.saved_iteration(run),
                           stop_to_save_s=round(os.path.getmtime(ckpt) - t0, 3), stop_to_exit_s=round(exited - t0, 3))
                print(f"{launcher:>5} {size:>7}: {rec['ckpt_bytes'] / 2 ** 20:7.1f} MiB checkpoint, saved "
                      f"{rec['stop_to_save_s']:.2f} s after the stop, the stop over after {rec['stop_to_exit_s']:.2f} s",
                      flush=True)
                records.append(rec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return records


def write_records(records, path):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(records, f, indent=1)
        print(f"wrote {len(records)} records to {path}")


def args_timeout(args):
    return 60 if args.quick else 600


def print_row(r):
    def fmt(v, scale, w, d):
        return f"{v / scale:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"
    if r.get('error'):
        print(f"{r['variant']:<16}{r['mode']:<19}{r['block_size'] or '':>5}  FAILED: {r['error']}", flush=True)
        return
    extra = f"  identical tokens: {r['identical_tokens']}" if 'identical_tokens' in r else ''
    print(f"{r['variant']:<16}{r['mode']:<19}{r['block_size']:>5}{r['batch_size']:>3}"
          f"{fmt(r['tokens_per_s'], 1, 11, 1)}{fmt(r['peak_mem_bytes'], 2 ** 20, 10, 1)}"
          f"{fmt(r['flops_per_token'], 1e9, 11, 4)}{fmt(r.get('flops_per_s'), 1e9, 9, 2)}"
          f"{fmt(r.get('frac_of_matmul_peak'), 0.01, 7, 1)}{fmt(r.get('mfu'), 0.01, 7, 1)}{extra}", flush=True)


if __name__ == '__main__':
    main()
