"""
Train a GPT with any attention variant, on one process or many (DDP).

    python train.py config/cpu_sa.py --max_iters=200
    torchrun --standalone --nproc_per_node=8 train.py config/hfa.py

A straight script in nanoGPT's manner: the variables below are the configuration, a
config file or --key=value overrides change them (configurator.py; --help lists them, and
what a file or override sets is echoed). init_from='resume' takes the checkpoint's config
as the default; init_from='gpt2'...'gpt2-xl' (or a Hugging Face folder) starts from GPT-2's
weights, as nanoGPT's finetune and eval configs do. Every evaluation
appends one JSON line to out_dir/log.jsonl; out_dir/ckpt.pt holds everything needed to
resume exactly (model, optimizer, iteration, RNG and data-sampling state), written
atomically so a crash mid-save leaves the previous checkpoint intact. SIGTERM/SIGINT
finish the current step, save and exit; a NaN/inf loss or gradient stops the run (or,
with skip_nonfinite=True, skips that step) without touching the last good checkpoint.
"""

import json
import math
import os
import pickle
import re
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
import data
import hardware
import hub
from errors import UserError
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# default config values, nanoGPT's names (GPT-2 124M on OpenWebText)
# I/O
out_dir = 'out'                 # where ckpt.pt, log.jsonl, train_log.jsonl and run.json go
eval_interval = 2000            # evaluate (and maybe save) every this many iterations
log_interval = 1                # print the training loss every this many iterations
eval_iters = 200                # batches per split in each evaluation
eval_only = False               # evaluate once and exit (writes nothing to out_dir)
always_save_checkpoint = True   # else only when val loss improves
init_from = 'scratch'           # 'scratch', 'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' or a Hugging Face GPT-2 folder
keep_last = 0                   # also keep the last k checkpoints as ckpt_<iter>.pt
# wandb logging (optional; works with WANDB_MODE=offline)
wandb_log = False               # log evaluations to Weights & Biases (imported only then)
wandb_project = 'owt'           # wandb project
wandb_run_name = 'gpt2'         # wandb run name; a resumed run continues the same wandb run
# data
dataset = 'openwebtext'         # data/<dataset>/{train,val}.bin
report_split = False            # True: evaluations read the selection half of the held-out documents; the end adds report_loss (every window of the report half)
data_dir = ''                   # default: data/<dataset> beside this script
gradient_accumulation_steps = 5 * 8  # micro-steps per iteration, in total over all processes
batch_size = 12                 # per process and micro-step
block_size = 1024               # context length in tokens
# model
n_layer = 12                    # transformer blocks
n_head = 12                     # attention heads per layer
n_embd = 768                    # embedding width
dropout = 0.0                   # dropout everywhere (0 for pretraining, 0.1+ for finetuning)
bias = False                    # biases in Linear and LayerNorm layers (GPT-2 has them)
attention = 'sa'                # sa | linear | hfa_v1 | hfa_v2 | ha  (model.py)
attn_layers = ''                # per-layer override, e.g. 'sa,sa,sa,ha'
head_dim = 0                    # 0: n_embd // n_head
linear_norm = False             # linear: divide by the number of visible keys
hfa_order = 2                   # HFA: number of score factors multiplied together
n_hfa_head = -1                 # -1: all heads HFA; else that many HFA heads, the rest SA
hfa_kron = 'auto'               # HFA through SDPA on Kronecker-lifted queries/keys: auto | on | off
ha_order = 3                    # HA: n - 1 keys per score
ha_share_kv = False             # HA with K2 = K1 and V2 = V1
ha_window1 = 0                  # HA: j1 in the last w1 positions (0: full causal)
ha_window2 = 0                  # HA: j2 in the last w2 positions (0: full causal)
attn_window = 0                 # sliding window of sa, linear and hfa heads (0: full causal)
kernel = 'auto'                 # auto | triton | torch: who computes linear, hfa, ha (attention_kernels/)
# adamw optimizer
learning_rate = 6e-4            # peak learning rate
max_iters = 600000              # total training iterations
weight_decay = 1e-1             # AdamW weight decay, on 2-D weights only
beta1 = 0.9                     # AdamW beta1
beta2 = 0.95                    # AdamW beta2
grad_clip = 1.0                 # clip the gradient norm to this (0 disables clipping)
# learning rate decay: linear warmup, then cosine down to min_lr
decay_lr = True                 # False: constant learning_rate
warmup_iters = 2000             # linear warmup iterations
lr_decay_iters = 600000         # cosine decay ends here (~ max_iters, per Chinchilla)
min_lr = 6e-5                   # learning rate after the decay (~ learning_rate / 10)
# DDP
backend = 'nccl'                # on CPU gloo is used whatever this says
ddp_timeout = 600               # seconds a collective may wait for a dead peer
# system
device = 'auto'                 # 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'                  # 'auto' (bfloat16 on CUDA where supported, else float32), 'float32', 'bfloat16', 'float16'
compile = False                 # torch.compile the model
seed = 1337                     # seeds model init, data order and dropout
skip_nonfinite = False          # skip (and count) steps with a NaN/inf loss or gradient (a sync per step)
peak_flops = 0.0                # MFU denominator, FLOP/s per device; 0: hardware.py (CUDA table, else measured)
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
defaults = {k: globals()[k] for k in config_keys}
GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


def load_checkpoint(path):
    if not path.exists():
        raise UserError(f"no checkpoint at {path} to resume from; train with init_from='scratch' first")
    try:  # tensors and plain containers only: loading never runs code
        return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.findall(r'GLOBAL ([\w.]+)', str(e)) or ['an object of unknown type']
        raise UserError(f"checkpoint {path} holds objects other than tensors and plain containers "
                        f"({found[0]}); refusing to load it, since that could run code")
    except Exception as e:
        raise UserError(f"checkpoint {path} is unreadable or truncated ({type(e).__name__}); "
                        f"restore it from a backup or start with init_from='scratch'")


config, applied = configurator.parse(defaults, sys.argv[1:], script=__file__)
ckpt_path = Path(config['out_dir']) / 'ckpt.pt'
ckpt, saved_config = None, {}
if config['init_from'] == 'resume':  # the checkpoint's config is the default for every key it holds
    ckpt = load_checkpoint(ckpt_path)
    saved_config = {k: v for k, v in ckpt.get('config', {}).items() if k in defaults and k not in ('init_from', 'out_dir')}
    config, applied = configurator.parse({**defaults, **saved_config}, sys.argv[1:], script=__file__)
globals().update(config)
set_by = {key: (arg if origin is None else origin) for key, _, arg, origin in applied}  # key -> what set it


def refuse_architecture_changes(source, source_args):
    """A config file or override that contradicts the model being loaded: one line, not ignored."""
    for k, v in source_args.items():
        if k in set_by and k in defaults and k in GPTConfig.__dataclass_fields__ and config[k] != v \
                and k not in ('dropout', 'hfa_kron', 'block_size'):  # these may change; block_size may shrink
            raise UserError(f"{k}={config[k]!r} (set by {set_by[k]}) contradicts {source}, which has {k}={v!r}; "
                            f"its architecture is fixed: drop that setting, or train a new model in another out_dir")


if ckpt is not None:
    refuse_architecture_changes(f"the checkpoint {ckpt_path}", ckpt['model_args'])
if int(os.environ.get('RANK', 0)) == 0:  # before DDP starts: only the first process speaks
    if ckpt is not None:
        print(f"Resuming: the config saved in {ckpt_path} is the default")
    configurator.print_applied(applied)
    changed = [f"{k} = {config[k]!r} (was {v!r})" for k, v in saved_config.items() if config[k] != v]
    if changed:
        print(f"Changed from the checkpoint's config: {', '.join(changed)}")
# -----------------------------------------------------------------------------

if init_from not in ('scratch', 'resume', *GPT2_NAMES) and not (Path(init_from) / 'config.json').is_file():
    raise UserError(f"init_from must be 'scratch', 'resume', one of {', '.join(GPT2_NAMES)} or a folder "
                    f"holding a Hugging Face GPT-2 (config.json), not {init_from!r}")
if init_from not in ('scratch', 'resume') and (attention != 'sa' or attn_layers):
    raise UserError(f"init_from={init_from!r} loads GPT-2's softmax attention weights; attention must be 'sa' "
                    f"(got attention={attention!r}{f', attn_layers={attn_layers!r}' * bool(attn_layers)})")
if dtype not in ('auto', *DTYPES):
    raise UserError(f"dtype={dtype!r} is not a dtype name; valid: auto, {', '.join(DTYPES)}")
if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'mps' if torch.backends.mps.is_available() else 'cpu'
if not re.fullmatch(r'cpu|mps|cuda(:\d+)?', device):
    raise UserError(f"device={device!r} is not a device name; valid: auto, cpu, cuda, cuda:N, mps")
if device.startswith('cuda') and not torch.cuda.is_available():
    raise UserError(f"device={device!r} but CUDA is not available here; use --device=cpu (or auto)")
if device.startswith('cuda:') and int(device[5:]) >= torch.cuda.device_count():
    raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
if device == 'mps' and not torch.backends.mps.is_available():
    raise UserError("device='mps' but MPS (Apple GPU) is not available here; use --device=cpu (or auto)")
if wandb_log and int(os.environ.get('RANK', 0)) == 0:
    try:
        import wandb  # only when asked for: the package is optional at run time
    except ImportError:
        raise UserError("wandb_log=True needs the wandb package: pip install wandb "
                        "(WANDB_MODE=offline logs without an account)")

ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
    if gradient_accumulation_steps % world_size:  # before the process group: every process exits at once
        raise UserError(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by "
                        f"the {world_size} processes; make it a multiple")
    if device.startswith('cuda'):
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    else:  # CPU processes share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get('LOCAL_WORLD_SIZE', world_size))))
    dist.init_process_group(backend=backend if device.startswith('cuda') else 'gloo',
                            timeout=timedelta(seconds=ddp_timeout))
else:
    rank, local_rank, world_size = 0, 0, 1
master = rank == 0
accum = gradient_accumulation_steps // world_size  # micro-steps per process
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
device_type = 'cuda' if device.startswith('cuda') else device
if dtype == 'auto':
    dtype = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
ptdtype = DTYPES[dtype]
ctx = nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=device_type, dtype=ptdtype)
torch.manual_seed(seed + rank)  # model init is broadcast by DDP; the offset decorrelates dropout
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
out = Path(out_dir)
if master:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / '.write_test'
        probe.write_text('ok')
        probe.unlink()
    except OSError as e:
        raise UserError(f"out_dir {out_dir!r} cannot be written ({e.strerror}); choose another --out_dir")
    print(f"tokens per iteration: {tokens_per_iter:,} ({gradient_accumulation_steps} x {batch_size} x "
          f"{block_size}, {world_size} process{'es' * (world_size > 1)}), device {device}, {dtype}")

# -----------------------------------------------------------------------------
# data: random training windows from a generator shared by all processes, so the data
# order does not depend on the number of processes; evaluation on fixed windows
data_path = Path(data_dir) if data_dir else Path(__file__).resolve().parent / 'data' / dataset
meta = data.read_meta(data_path) or {'tokenizer': 'gpt2', 'vocab_size': 50257}
train_data = data.open_split(data_path, 'train', block_size)
val_data = data.open_split(data_path, 'val', block_size)
report_data = None
if report_split:  # choices see only the selection half; the report half is read once, at the end
    val_data, report_data = data.heldout_halves(data_path, meta, block_size)
data_gen = torch.Generator().manual_seed(seed)


def iteration_batches():
    """This process's micro-batch offsets for one iteration: (accum, batch_size)."""
    offsets = torch.randint(len(train_data) - block_size, (gradient_accumulation_steps, batch_size), generator=data_gen)
    return offsets[rank::world_size]


def fixed_offsets(split_data):
    """Evaluation windows: the same for every run, variant, seed and world size."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(len(split_data) - block_size, (eval_iters * batch_size,), generator=g)


eval_sets = {'train': (train_data, fixed_offsets(train_data)), 'val': (val_data, fixed_offsets(val_data))}


def to_device(x, y):
    if device_type == 'cuda':
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# -----------------------------------------------------------------------------
# model, optimizer, and the checkpoint to resume from (or the GPT-2 weights to start from)

meta_for_ckpt = {k: meta[k] for k in ('tokenizer', 'vocab_size', 'itos') if k in meta}
if isinstance(meta_for_ckpt.get('itos'), dict):  # nanoGPT meta.pkl stores {int: str}
    meta_for_ckpt['itos'] = [meta_for_ckpt['itos'][i] for i in range(len(meta_for_ckpt['itos']))]
model_keys = [k for k in config if k in GPTConfig.__dataclass_fields__]
model_args = {k: config[k] for k in model_keys}
model_args['vocab_size'] = meta['vocab_size'] if 'vocab_size' in meta else 50304
if meta.get('tokenizer') == 'gpt2' and model_args['vocab_size'] == 50257:
    model_args['vocab_size'] = 50304  # nanoGPT: pad GPT-2's vocabulary to a multiple of 64
iter_num, best_val_loss, pretrained = 0, 1e9, None
if init_from == 'resume':
    ckpt_tok = ckpt.get('tokenizer', {})
    other_chars = 'itos' in ckpt_tok and ckpt_tok['itos'] != meta_for_ckpt.get('itos')  # same size, other characters
    if ckpt_tok.get('tokenizer') != meta.get('tokenizer') or \
            ckpt['model_args']['vocab_size'] < meta['vocab_size'] or other_chars:
        raise UserError(f"checkpoint {ckpt_path} was trained with tokenizer {ckpt_tok.get('tokenizer')!r} "
                        f"(vocab {ckpt['model_args']['vocab_size']}) but {data_path} uses {meta.get('tokenizer')!r} "
                        f"(vocab {meta['vocab_size']}{', other characters' * (ckpt['model_args']['vocab_size'] == meta['vocab_size'])}); "
                        f"use the dataset the checkpoint was trained on")
    model_args = dict(ckpt['model_args'])  # the architecture is the checkpoint's; dropout may change
    model_args.update({k: config[k] for k in ('dropout', 'hfa_kron') if k in model_args})
    model_args['kernel'] = kernel  # not architecture: this run's choice
    iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
elif init_from != 'scratch':  # GPT-2 weights (nanoGPT's finetune and eval configs)
    if meta.get('tokenizer') != 'gpt2':
        raise UserError(f"init_from={init_from!r} needs GPT-2 tokens, but {data_path} was prepared with the "
                        f"{meta.get('tokenizer')!r} tokenizer; prepare it with --tokenizer=gpt2")
    try:
        pretrained = GPT.from_pretrained(init_from, dict(dropout=dropout))
    except (ValueError, OSError, ImportError) as e:
        raise UserError(f"could not load GPT-2 weights {init_from!r} ({hub.first_line(e)})" + (
            "; offline: give init_from a folder saved by transformers' save_pretrained, or the name of "
            "a model already in the Hugging Face cache (HF_HOME)" if hub.offline_now() else ''))
    refuse_architecture_changes(f"the GPT-2 weights {init_from!r}", asdict(pretrained.config))
    model_args = asdict(pretrained.config)
try:
    gptconf = GPTConfig(**model_args)
except ValueError as e:
    raise UserError(str(e))
if block_size > gptconf.block_size:
    raise UserError(f"block_size={block_size} exceeds the model's {gptconf.block_size} "
                    f"({'the checkpoint' if ckpt else init_from}); lower block_size")
model = pretrained or GPT(gptconf)
if ckpt is not None:
    model.load_state_dict(ckpt['model'])
model.to(device)
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if ckpt is not None:
    optimizer.load_state_dict(ckpt['optimizer'])
    data_gen.set_state(ckpt['rng']['data'])
    ranks_rng = ckpt['rng'].get('ranks') or []  # each process's own dropout RNG state
    own_rng = ranks_rng[rank] if len(ranks_rng) == world_size else ckpt['rng'] if rank == 0 else None
    if own_rng is None:  # saved with another number of processes: a fresh stream, not a copy of rank 0's
        torch.manual_seed(seed + rank + 1000003 * iter_num)
    else:
        torch.set_rng_state(own_rng['torch'])
        if device_type == 'cuda' and own_rng.get('cuda') is not None:
            torch.cuda.set_rng_state(own_rng['cuda'], device)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
n_params = model.get_num_params()
flops_per_token = model.flops_per_token(block_size)
raw_model = model
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)
if master:
    print(f"model: {n_params / 1e6:.3f}M parameters, {flops_per_token / 1e6:.2f} MFLOPs/token, "
          f"attention {','.join(sorted(set(gptconf.layer_attentions())))}")


@torch.no_grad()
def estimate_loss(sets=None):
    """Mean loss over the fixed evaluation windows (or `sets`), shared out over the processes;
    summed on the device and read once per split."""
    model.eval()
    result = {}
    for split, (split_data, offsets) in (sets or eval_sets).items():
        total = torch.zeros(2, dtype=torch.float32 if device_type == 'mps' else torch.float64, device=device)
        for chunk in offsets[rank::world_size].split(batch_size):
            x, y = to_device(*data.windows(split_data, chunk, block_size))
            with ctx:
                _, loss = raw_model(x, y)
            total[0] += loss.to(total.dtype) * len(chunk)
            total[1] += len(chunk)
        if ddp:
            dist.all_reduce(total)
        total = total.tolist()
        result[split] = total[0] / total[1]
    model.train()
    return result


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def save_checkpoint():
    """Called by every process (DDP gathers each one's RNG state); rank 0 writes to a temporary
    file, flushes it to disk, then renames it: never a half-written ckpt.pt."""
    own_rng = {'torch': torch.get_rng_state(),
               'cuda': torch.cuda.get_rng_state(device) if device_type == 'cuda' else None}
    ranks_rng = [own_rng]
    if ddp:
        ranks_rng = [None] * world_size
        dist.all_gather_object(ranks_rng, own_rng)
    if not master:
        return
    state = {
        'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
        'model_args': asdict(gptconf), 'config': config, 'iter_num': iter_num,
        'best_val_loss': best_val_loss, 'tokenizer': meta_for_ckpt, 'dataset': dataset,
        'rng': {**own_rng, 'data': data_state, 'ranks': ranks_rng},  # data_state: before the prefetch's draw
        'elapsed_s': elapsed(), 'train_time_s': train_time, 'untimed_iters': untimed_iters,
        'skipped_steps': skipped_steps,
        'evaluated': last.get('iter') == iter_num,  # False when a signal stopped the run before this eval
        'wandb_run_id': wandb_run_id,  # a resumed run logs on into the same wandb run
    }
    tmp = out / 'ckpt.pt.tmp'
    with open(tmp, 'wb') as f:
        torch.save(state, f)
        f.flush()
        if test_fault('save'):  # a crash halfway through writing the checkpoint
            f.truncate(f.tell() // 2)
            os.kill(os.getpid(), signal.SIGKILL)
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_path)
    try:  # make the rename itself durable
        dir_fd = os.open(out, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)
    except OSError:
        pass
    if keep_last > 0:
        kept = out / f'ckpt_{iter_num:07d}.pt'
        os.link(ckpt_path, kept) if not kept.exists() else None
        for old in sorted(out.glob('ckpt_*.pt'))[:-keep_last]:
            old.unlink()
    print(f"checkpoint saved to {ckpt_path} (iteration {iter_num})")


# fault injection, for tests/test_reliability.py only: NANOHFA_TEST_DIE_AT=ITER[:RANK[:WHERE]] makes
# process RANK (default 0) SIGKILL itself at the start of iteration ITER (WHERE=step, the default),
# halfway through writing that iteration's checkpoint (save), or send itself SIGTERM (term)
_fault = (os.environ.get('NANOHFA_TEST_DIE_AT', '').split(':') + ['', ''])[:3]


def test_fault(where):
    if _fault[0] and int(_fault[0]) == iter_num and int(_fault[1] or 0) == rank and (_fault[2] or 'step') == where:
        if where == 'term':
            os.kill(os.getpid(), signal.SIGTERM)
            return False
        return True


def append_jsonl(path, record):
    with open(path, 'a') as f:
        f.write(json.dumps(record) + '\n')


def trim_jsonl(path, keep):
    """On resume, drop log lines written after the checkpoint (they will be redone)."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l.strip() and keep(json.loads(l))]
        path.write_text(''.join(l + '\n' for l in lines))


# SIGTERM / SIGINT: finish the step, save, exit (a second SIGINT interrupts at once)
stop_signal = None


def on_signal(signum, frame):
    global stop_signal
    if stop_signal is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt
    stop_signal = signum


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)

wandb_run_id = ckpt.get('wandb_run_id') if ckpt else None
if not (wandb_log and master):
    wandb = None
else:  # imported above; the run id in the checkpoint continues the same wandb run on resume
    wandb_run_id = wandb.init(project=wandb_project, name=wandb_run_name, config=config,
                              id=wandb_run_id, resume='allow').id


def wandb_record(rec):
    """An evaluation under nanoGPT's wandb keys (iter, train/loss, val/loss, lr, mfu in percent),
    with val/ppl, tokens and tokens_per_s beside them."""
    keys = {'iter': 'iter', 'train_loss': 'train/loss', 'val_loss': 'val/loss', 'val_ppl': 'val/ppl',
            'lr': 'lr', 'tokens': 'tokens', 'tokens_per_s': 'tokens_per_s'}
    logged = {name: rec[k] for k, name in keys.items() if rec.get(k) is not None}
    if rec.get('mfu') is not None:
        logged['mfu'] = 100 * rec['mfu']
    return logged


# -----------------------------------------------------------------------------
# training loop
#
# The host never waits for the device inside a step. The loss is summed on the device; one
# small tensor per step, [loss, non-finite, stop signal], is all-reduced under DDP (the only
# collective besides DDP's own) and copied to the host in the background; it is read during
# the next step's first forward, or at once at a log line, before an evaluation or a save,
# and at the end, where the host waits for the device as nanoGPT's does at its log lines.
# So on a GPU a non-finite step, or a stop signal under DDP, takes effect at the latest one
# step later, and never after a save. On CPU every step is read at once (it costs nothing).
elapsed_before = ckpt['elapsed_s'] if ckpt else 0.0
train_time = ckpt['train_time_s'] if ckpt else 0.0  # seconds of timed steps, over all sessions
untimed_iters = ckpt.get('untimed_iters', 0) if ckpt else 0  # each session's first step: not in train_time
skipped_steps = ckpt['skipped_steps'] if ckpt else 0
session_start = time.time()
elapsed = lambda: elapsed_before + time.time() - session_start
start_iter = iter_num
saved_iter = iter_num if ckpt else None  # the iteration of the last checkpoint this run wrote or resumed
evaluated_at_start = ckpt.get('evaluated', True) if ckpt else False  # resume: skip a repeat of that eval
peak = peak_source = None
if master:  # the MFU denominator (hardware.py), per process: the run's peak is world_size times it
    peak, peak_source = hardware.peak_flops(device, peak_flops)
    print(f"MFU against {peak / 1e12:.3g} TFLOP/s per process ({peak_source})")
if master and not eval_only:  # evaluating only: the run's files in out_dir stay as they are
    if ckpt is not None:
        trim_jsonl(out / 'log.jsonl', lambda r: r['iter'] < iter_num + evaluated_at_start)
        trim_jsonl(out / 'train_log.jsonl', lambda r: r['iter'] < iter_num)
        print(f"resuming from {ckpt_path} at iteration {iter_num}")
    else:
        for name in ('log.jsonl', 'train_log.jsonl'):
            (out / name).unlink(missing_ok=True)
    (out / 'run.json').write_text(json.dumps({'config': config, 'model_args': asdict(gptconf), 'params': n_params,
                                              'flops_per_token': flops_per_token, 'world_size': world_size,
                                              'peak_flops': peak, 'peak_flops_source': peak_source}, indent=1))
del ckpt


def mfu(tokens_per_s):
    return flops_per_token * tokens_per_s / (peak * world_size) if peak and tokens_per_s else None


def sync():
    if device_type == 'cuda':
        torch.cuda.synchronize(device)


def to_host(t):
    """Start copying a small device tensor to the host; returns a function that waits for
    the copy (only for it, not for later work) and gives the values as a list."""
    if device_type != 'cuda':
        return t.tolist
    buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return lambda: copied.synchronize() or buf.tolist()


def next_batches():
    """The data-sampling state before this draw (what a checkpoint saves) and the next
    iteration's micro-batch offsets: drawn one iteration ahead, for the prefetch."""
    return data_gen.get_state(), iteration_batches()


def read_pending():
    """Read the steps not yet read (waiting for the device if needed), write their
    train_log.jsonl lines and act on their flags. Returns the last step's loss."""
    global stop_agreed
    loss = None
    while pending:
        step = pending.pop(0)
        loss, bad, stop = step['stats']()
        loss /= world_size
        if bad and not skip_nonfinite and dtype != 'float16':  # float16: the grad scaler skips such steps
            kept = (f"the last good checkpoint {ckpt_path} (iteration {saved_iter}) is untouched"
                    if saved_iter is not None else "no checkpoint of this run had been saved yet")
            raise UserError(f"non-finite loss or gradient at iteration {step['iter']} (loss {loss}); {kept}; "
                            f"lower learning_rate, or set skip_nonfinite=True to skip such steps")
        stop_agreed = stop_agreed or stop > 0
        if master:
            append_jsonl(out / 'train_log.jsonl', {'iter': step['iter'], 'loss': loss, 'lr': step['lr'],
                                                   'dt_s': round(step['dt'], 4)})
    return loss


acc_dtype = torch.float32 if device_type == 'mps' else torch.float64  # MPS has no float64
pending = []            # steps whose numbers are still on their way to the host
stop_agreed = False     # DDP: some process got SIGTERM/SIGINT (read from the per-step all-reduce)
log_steps, log_time = 0, 0.0  # timed steps and their seconds since the last log line
last = {}
data_state, batches = next_batches()
X, Y = to_device(*data.windows(train_data, batches[0], block_size))
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group['lr'] = lr

    # evaluate (not again at the iteration just resumed from: its line is already logged)
    if (iter_num % eval_interval == 0 or iter_num >= max_iters or eval_only) and (iter_num != start_iter or not evaluated_at_start or eval_only):
        losses = estimate_loss()
        timed_tokens = (iter_num - untimed_iters) * tokens_per_iter
        last = {'iter': iter_num, 'train_loss': losses['train'], 'val_loss': losses['val'],
                'val_ppl': math.exp(min(losses['val'], 50)), 'lr': lr, 'tokens': iter_num * tokens_per_iter,
                'elapsed_s': round(elapsed(), 3),
                'tokens_per_s': round(timed_tokens / train_time, 1) if train_time else None,
                'params': n_params, 'flops_per_token': flops_per_token, 'skipped_steps': skipped_steps}
        last['mfu'] = mfu(last['tokens_per_s']) and round(mfu(last['tokens_per_s']), 4)
        if report_data is not None and (iter_num >= max_iters or eval_only):  # the whole report half
            report = estimate_loss({'report': (report_data, data.tiling_offsets(len(report_data), block_size))})
            last.update(report_loss=report['report'], report_ppl=math.exp(min(report['report'], 50)),
                        report_tokens=len(data.tiling_offsets(len(report_data), block_size)) * block_size)
        if master:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                  f"val ppl {last['val_ppl']:.2f}" + (f", report loss {last['report_loss']:.4f} "
                                                      f"({last['report_tokens']:,} tokens)" if 'report_loss' in last else ''))
            if not eval_only:
                append_jsonl(out / 'log.jsonl', last)
            if wandb:
                wandb.log(wandb_record(last))
        if losses['val'] < best_val_loss or always_save_checkpoint:
            best_val_loss = min(best_val_loss, losses['val'])
            if iter_num > start_iter:
                save_checkpoint()
                saved_iter = iter_num
    if eval_only or iter_num >= max_iters:
        break

    # one optimisation step: accum micro-batches per process, gradients averaged by DDP
    if test_fault('step'):
        os.kill(os.getpid(), signal.SIGKILL)
    test_fault('term')
    first = iter_num == start_iter  # compilation, autotuning, allocator warm-up: timed apart
    if first and compile and master:
        print("compiling the model: the first step takes a while (it is not counted in tokens/s)")
    t0 = time.time()
    loss_sum = torch.zeros((), dtype=acc_dtype, device=device)
    for micro in range(accum):
        if ddp:  # synchronise gradients on the last micro-step only
            model.require_backward_grad_sync = micro == accum - 1
        with ctx:
            _, loss = model(X, Y)
            loss = loss / accum
        # while the device runs the forward: fetch the next micro-batch (after the last one,
        # the next iteration's first) and read the previous step's numbers
        if micro + 1 < accum:
            X, Y = to_device(*data.windows(train_data, batches[micro + 1], block_size))
        else:
            data_state, batches = next_batches()
            X, Y = to_device(*data.windows(train_data, batches[0], block_size))
        if micro == 0:
            read_pending()
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip if grad_clip > 0 else float('inf'))
    stats = torch.zeros(3, dtype=acc_dtype, device=device)
    stats[0] = loss_sum
    stats[1] = ~(torch.isfinite(loss_sum) & torch.isfinite(norm))
    stats[2] = float(stop_signal is not None)
    if ddp:  # the loss summed over all processes, and one decision for all of them
        dist.all_reduce(stats)
    step = {'iter': iter_num, 'lr': lr, 'stats': to_host(stats)}
    pending.append(step)
    if skip_nonfinite and dtype != 'float16' and stats[1].item():  # skip_nonfinite: a sync per step
        skipped_steps += 1
        if master:
            print(f"iter {iter_num}: non-finite loss or gradient, step skipped ({skipped_steps} so far)")
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    log_now = iter_num % log_interval == 0
    iter_num += 1

    # read the numbers (and so wait for the device) at a log line, before an evaluation or a
    # save, at the end, and after the first step, whose time is kept apart; on CPU, where
    # nothing runs ahead, after every step (so DDP on CPU stops right after the signal's step)
    stop = stop_agreed if ddp else stop_signal is not None
    if device_type == 'cpu' or first or log_now or stop or iter_num % eval_interval == 0 or iter_num >= max_iters:
        sync()
        step['dt'] = time.time() - t0
        loss = read_pending()
        stop = stop_agreed if ddp else stop
    else:
        step['dt'] = time.time() - t0
    if first:
        untimed_iters += 1
    else:
        train_time += step['dt']
        log_time, log_steps = log_time + step['dt'], log_steps + 1
    if log_now and master:
        if log_steps:
            tps = log_steps * tokens_per_iter / log_time
            print(f"iter {iter_num - 1}: loss {loss:.4f}, time {log_time / log_steps * 1000:.0f}ms, "
                  f"{tps:,.0f} tokens/s, mfu {mfu(tps):.2%}")
        else:
            print(f"iter {iter_num - 1}: loss {loss:.4f}, time {step['dt'] * 1000:.0f}ms "
                  f"(first step, not counted in tokens/s)")
    if log_now:
        log_steps, log_time = 0, 0.0

    if stop:  # all processes stop at the same step
        save_checkpoint()
        saved_iter = iter_num
        if master:
            print(f"stopped by signal at iteration {iter_num}; checkpoint saved to {ckpt_path}; "
                  f"continue with --init_from=resume")
        break

if master and last:
    print(f"final: iter {last['iter']}, val loss {last['val_loss']:.4f}, val ppl {last['val_ppl']:.2f}, "
          f"{last['tokens_per_s'] or 0:,.0f} tokens/s" + (f", mfu {last['mfu']:.2%}" if last.get('mfu') else ''))
if wandb:
    wandb.finish()
if ddp:
    dist.barrier()  # every process past its last collective before the group is torn down
    dist.destroy_process_group()
