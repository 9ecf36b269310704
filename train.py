"""
Train a GPT with any attention variant, on one process or many (DDP, or FSDP2 sharding).

    python train.py config/cpu_sa.py --max_iters=200
    torchrun --standalone --nproc_per_node=8 train.py config/hfa.py
    torchrun --standalone --nproc_per_node=8 train.py config/ha.py --parallel=fsdp   # sharded (FSDP2)

A straight script in nanoGPT's manner: the configuration is a set of plain variables (their
defaults in settings.py, which --help prints), changed by config files and --key=value
overrides (configurator.py; what a file or override sets is echoed). init_from='resume'
takes the checkpoint's config as the default; init_from='gpt2'...'gpt2-xl' (or a Hugging
Face folder) starts from GPT-2's weights, as nanoGPT's finetune and eval configs do, and
init_from=path/to/ckpt.pt from a checkpoint's (ours or nanoGPT's). Every evaluation appends
one JSON line to out_dir/log.jsonl; out_dir/ckpt.pt holds everything needed to resume
exactly (model, optimizer, iteration, RNG and data-sampling state), written atomically so a
crash mid-save leaves the previous checkpoint intact (checkpoint.py). An out_dir belongs to
one run (run_folder.py).
SIGTERM/SIGINT finish the current step (or abandon an evaluation), save and exit; a NaN/inf
loss or gradient stops the run (or, with skip_nonfinite=True, skips that step) without
touching the last good checkpoint.
"""

import time

T_START = time.time()  # elapsed_s counts from here: the run's wall time, startup included

import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from nanohfa import checkpoint  # noqa: E402
from nanohfa import configurator  # noqa: E402
from nanohfa import data  # noqa: E402
from nanohfa import devices  # noqa: E402
from nanohfa import hardware  # noqa: E402
from nanohfa import run_folder  # noqa: E402
from nanohfa import settings  # noqa: E402
from attention_kernels import preflight  # noqa: E402
from nanohfa.errors import UserError  # noqa: E402
from model import GPT, GPTConfig, kernel_heads  # noqa: E402

# -----------------------------------------------------------------------------
# the configuration: settings.TRAIN's defaults, a resumed checkpoint's config over them, then
# config files and --key=value overrides; every key becomes a global, as in nanoGPT
defaults = settings.defaults(settings.TRAIN)
HELP = configurator.help_text(settings.TRAIN, 'train.py', __doc__)
config, applied, ckpt, saved_config = checkpoint.train_config(defaults, sys.argv[1:], HELP)  # resume: its config
ckpt_path = Path(config['out_dir']) / 'ckpt.pt'
settings.check(settings.TRAIN, config)
globals().update(config)
set_by = {key: (arg if origin is None else origin) for key, _, arg, origin in applied}  # key -> what set it
master_env = int(os.environ.get('RANK', 0)) == 0  # before DDP starts: only the first process speaks
if ckpt is not None:
    checkpoint.refuse_architecture_changes(config, set_by, f"the checkpoint {ckpt_path}", ckpt['model_args'])
if master_env:
    if ckpt is not None:
        print(f"Resuming: the config saved in {ckpt_path} is the default")
    configurator.print_applied(applied)
    changed = [f"{k} = {config[k]!r} (was {v!r})" for k, v in saved_config.items() if config[k] != v]
    if changed:
        print(f"Changed from the checkpoint's config: {', '.join(changed)}")
# -----------------------------------------------------------------------------

start_kind = checkpoint.init_kind(init_from, ('scratch', 'resume', 'gpt2', 'file'))
if start_kind == 'gpt2' and (attention != 'sa' or attn_layers):
    raise UserError(f"init_from={init_from!r} loads GPT-2's softmax attention weights; attention must be 'sa' "
                    f"(got attention={attention!r}{f', attn_layers={attn_layers!r}' * bool(attn_layers)})")
devices.check_dtype(dtype)
device = devices.pick_device(device)
if wandb_log and master_env:
    try:
        import wandb  # only when asked for: the package is optional at run time
    except ImportError:
        raise UserError("wandb_log=True needs the wandb package: pip install wandb "
                        "(WANDB_MODE=offline logs without an account)")

ddp = int(os.environ.get('RANK', -1)) != -1  # started by torchrun: DDP or FSDP
rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE')) if ddp else (0, 0, 1)
if parallel not in ('ddp', 'fsdp'):
    raise UserError(f"parallel={parallel!r} is not a choice; valid: ddp, fsdp")
if parallel == 'fsdp' and not ddp and 'parallel' in set_by:  # inherited from a checkpoint: one process trains it whole
    raise UserError("parallel='fsdp' shards the model over processes started by torchrun: torchrun --standalone "
                    "--nproc_per_node=N train.py ... --parallel=fsdp (one process holds the whole model: drop --parallel)")
fsdp = ddp and parallel == 'fsdp'
if gradient_accumulation_steps % world_size:  # before the process group: every process exits at once
    raise UserError(f"gradient_accumulation_steps={gradient_accumulation_steps} is not divisible by "
                    f"the {world_size} processes; make it a multiple")
if ddp and device.startswith('cuda'):
    device = f'cuda:{local_rank}'
    torch.cuda.set_device(device)
elif ddp:  # CPU processes share the cores
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get('LOCAL_WORLD_SIZE', world_size))))
if threads:
    torch.set_num_threads(threads)
master = rank == 0
accum = gradient_accumulation_steps // world_size  # micro-steps per process
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
device_type = 'cuda' if device.startswith('cuda') else device
dtype, ctx = devices.pick_dtype(dtype, device)
if fsdp and dtype == 'float16':  # float16 needs the grad scaler on sharded gradients: not supported here
    raise UserError("dtype='float16' is not supported with parallel='fsdp'; use bfloat16 (the default on CUDA) or float32")
torch.manual_seed(seed + rank)  # model init is broadcast by DDP; the offset decorrelates dropout
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
if master:
    for note in settings.notes(config, device):
        print(note)

# -----------------------------------------------------------------------------
# data: random training windows from a generator shared by all processes, so the data
# order does not depend on the number of processes; evaluation on fixed windows
data_path = data.folder_of(data_dir, dataset)
meta_file = data.read_meta(data_path)
meta = meta_file or {'tokenizer': 'gpt2', 'vocab_size': 50257}
train_data = data.open_split(data_path, 'train', block_size)
val_data = data.open_split(data_path, 'val', block_size)
vocab_note = data.check_vocabulary(data_path, meta_file)
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


def next_batches():
    """The data-sampling state before this draw (what a checkpoint saves) and the next
    iteration's micro-batch offsets: drawn one iteration ahead, for the prefetch."""
    return data_gen.get_state(), iteration_batches()


eval_sets = {'train': (train_data, fixed_offsets(train_data)), 'val': (val_data, fixed_offsets(val_data))}
to_device = lambda x, y: devices.to_device(device, x, y)  # to CUDA through pinned memory, without waiting


# -----------------------------------------------------------------------------
# the model: from scratch, the checkpoint to resume, GPT-2's weights or a checkpoint's weights

meta_for_ckpt = data.tokenizer_record(meta)
weights, model_args = checkpoint.starting_weights(start_kind, config, set_by, ckpt, ckpt_path, meta, data_path)
iter_num, best_val_loss = (ckpt['iter_num'], ckpt['best_val_loss']) if ckpt is not None else (0, 1e9)
try:
    gptconf = GPTConfig(**model_args)
except ValueError as e:
    raise UserError(str(e))
checkpoint.check_weights(weights, gptconf, ckpt_path if ckpt is not None else init_from)  # before claim and build
if block_size > gptconf.block_size:
    raise UserError(f"block_size={block_size} exceeds the model's {gptconf.block_size} "
                    f"({'the checkpoint' if weights is not None else init_from}); lower block_size")
if ckpt is not None and not eval_only and checkpoint.finished(ckpt, ckpt_path, max_iters):
    if master_env:
        print(f"the run in {out_dir} is finished (iteration {ckpt['iter_num']} = max_iters, evaluated); nothing "
              f"to do, nothing changed: give a larger --max_iters to train on")
    sys.exit(0)

# each Triton kernel the run uses runs first in a child process (local rank 0 of each node): a
# crash, hang or mismatch sends its family to PyTorch; kernel='triton' stops here, nothing written
kernel_paths = preflight.run(kernel_heads(gptconf), gptconf.kernel, device, dtype, block_size,
                             kernel_preflight_timeout, local_rank, preflight_import_timeout,
                             ddp_timeout if ddp else None, gptconf.kernel_check)

# everything the user gave has been checked: only now does the run take out_dir and write
out = Path(out_dir)
lock = run_folder.claim(out_dir, fresh=ckpt is None, overwrite=overwrite) if master and not eval_only else None
if ddp:  # ddp_backend: nanoGPT's `backend`; gloo on CPU, where NCCL does not run
    dist.init_process_group(backend=ddp_backend if device_type == 'cuda' else 'gloo',
                            timeout=timedelta(seconds=ddp_timeout))
    kernel_paths = preflight.agree(kernel_paths, gptconf.kernel, device)  # failed on any node: PyTorch on all
if master:
    print(f"tokens per iteration: {tokens_per_iter:,} ({gradient_accumulation_steps} x {batch_size} x "
          f"{block_size}, {world_size} process{'es' * (world_size > 1)}{', FSDP' * fsdp}), device {device}, {dtype}"
          + ', activation checkpointing' * activation_checkpointing)
    if vocab_note:
        print(vocab_note)
if isinstance(weights, GPT):
    model = weights
else:
    model = GPT(gptconf)
    if weights is not None:
        model.load_state_dict(weights['model'])
model.to(device)
model.activation_checkpointing = activation_checkpointing
if fsdp:
    if weights is None:  # rank 0's initial weights everywhere, as DDP broadcasts them
        for t in model.state_dict().values():
            dist.broadcast(t, 0)
    # FSDP2: every block is its own unit (its parameters gathered just before its forward and
    # backward, freed after), the root holds the rest (embeddings, tied head, final norm). On
    # bf16 the parameters are gathered and computed in bf16, gradients reduced and kept in fp32
    # (so are the sharded master weights and AdamW's state)
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if dtype == 'bfloat16' else MixedPrecisionPolicy()
    for block in model.transformer.h:
        fully_shard(block, mp_policy=mp_policy)
    fully_shard(model, mp_policy=mp_policy)
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if ckpt is not None:
    checkpoint.load_optimizer(optimizer, model, ckpt['optimizer'], fsdp)
    checkpoint.restore_rng(ckpt, data_gen, seed, rank, world_size, device)
    if 'rng' not in ckpt and master:  # nanoGPT's: the weights, the optimizer and the iteration continue
        print("a nanoGPT checkpoint: model, optimizer and iteration continue; it holds no data order or RNG "
              "state, so batches are drawn afresh (not bit-identical to an uninterrupted run)")
del weights
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
n_params = model.get_num_params()
flops_per_token = model.flops_per_token(block_size)
raw_model = model
if compile:
    model = torch.compile(model)
if ddp and not fsdp:
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)

# the MFU denominator (hardware.py), measured by the first process: the run's peak is world_size times it
mfu = hardware.MFU(flops_per_token, world_size, device, peak_flops, measure=master)
if master:
    print(f"model: {n_params / 1e6:.3f}M parameters, {flops_per_token / 1e6:.2f} MFLOPs/token, "
          f"attention {settings.attention_text(gptconf)}")
    print(f"MFU against {mfu.peak / 1e12:.3g} TFLOP/s per process ({mfu.source})")
    busy = device_type == 'cpu' and not ddp and hardware.busy_cores_notice(torch.get_num_threads())
    gpu_sized = not eval_only and hardware.gpu_sized_note(
        n_params, tokens_per_iter, flops_per_token, mfu.peak, world_size, device, eval_iters,
        f"--data_dir={data_dir}" if data_dir else f"--dataset={dataset}")
    for note in (busy, gpu_sized):
        if note:
            print(note)


# -----------------------------------------------------------------------------
# the run's logs (out_dir/log.jsonl, train_log.jsonl, run.json; wandb) and its counters,
# continued from the checkpoint on resume
wandb_run_id = ckpt.get('wandb_run_id') if ckpt else None
if not (wandb_log and master):
    wandb = None
else:  # imported above; the run id in the checkpoint continues the same wandb run on resume
    wandb_run_id = wandb.init(project=wandb_project, name=wandb_run_name, config=config,
                              id=wandb_run_id, resume='allow').id

# train_time: seconds of timed steps, over all sessions (each session's first step is untimed);
# evaluated_at_start: resumed at an evaluated iteration, whose evaluation is not repeated
elapsed_before, train_time, untimed_iters, skipped_steps, evaluated_at_start = checkpoint.counters(ckpt)
elapsed = lambda: elapsed_before + time.time() - T_START
start_iter = iter_num
saved_iter = iter_num if ckpt else None  # the iteration of the last checkpoint this run wrote or resumed
grad_norm = None  # the last step's gradient norm before clipping (read_step), for the logs
if master and not eval_only:  # evaluating only: the run's files in out_dir stay as they are
    run_folder.start_logs(out, {'config': config, 'model_args': asdict(gptconf), 'params': n_params,
                                'flops_per_token': flops_per_token, 'world_size': world_size, 'peak_flops': mfu.peak,
                                'peak_flops_source': mfu.source, 'kernels': preflight.record(
                                    kernel_paths, kernel_heads(gptconf), gptconf.kernel, device, dtype, block_size)},
                          resumed_at=iter_num if ckpt is not None else None, evaluated=evaluated_at_start)
    if ckpt is not None:
        print(f"resuming from {ckpt_path} at iteration {iter_num}")
del ckpt

# -----------------------------------------------------------------------------
# the training loop's state, and what the loop calls: host reads, evaluation, the schedule,
# MFU, checkpoints
stop_signal = None      # SIGTERM/SIGINT: finish the step (or abandon an evaluation), save, exit
unread = None           # the last step, while its numbers are still on their way to the host
stop_agreed = False     # some process got SIGTERM/SIGINT (DDP: read from the per-step all-reduce)
log_steps, log_time = 0, 0.0  # timed steps and their seconds since the last log line
eval_s = 0.0            # the last evaluation's seconds (for the ETA)
last = {}               # the last evaluation's log record
acc_dtype = torch.float32 if device_type == 'mps' else torch.float64  # MPS has no float64
data_state, batches = next_batches()  # the first iteration's batches
X, Y = to_device(*data.windows(train_data, batches[0], block_size))


def on_signal(signum, frame):
    """A second SIGINT interrupts at once."""
    global stop_signal
    if stop_signal is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt
    stop_signal = signum


@torch.no_grad()
def estimate_loss(sets=None):
    """Mean loss over the fixed evaluation windows (or `sets`), shared out over the processes;
    summed on the device and read once per split. A line every 15 s says how far a long one is.
    Returns None when a stop signal (on any process) abandons it, at the next batch."""
    model.eval()
    result, t0, shown = {}, time.time(), time.time() + 5
    sets = sets or eval_sets
    n_chunks = {s: math.ceil(math.ceil(len(o) / world_size) / batch_size) for s, (_, o) in sets.items()}
    done, total_chunks = 0, sum(n_chunks.values())
    stop_flag = torch.zeros((), dtype=acc_dtype, device=device) if ddp else None
    stop_read = None
    for split, (split_data, offsets) in sets.items():
        total = torch.zeros(2, dtype=acc_dtype, device=device)
        chunks = offsets[rank::world_size].split(batch_size)
        for i in range(n_chunks[split]):  # as many on every process: they share the stop flag
            if ddp:  # every process's flag, summed, read one batch later (the device runs ahead)
                stopping = stop_read is not None and stop_read()[0] > 0
                stop_flag.fill_(float(stop_signal is not None))
                dist.all_reduce(stop_flag)
                stop_read = devices.to_host(stop_flag.view(1))
            else:
                stopping = stop_signal is not None
            if stopping:
                model.train()
                return None
            if i < len(chunks):
                x, y = to_device(*data.windows(split_data, chunks[i], block_size))
                with ctx:
                    _, loss = raw_model(x, y)
                total[0] += loss.to(total.dtype) * len(chunks[i])
                total[1] += len(chunks[i])
            elif fsdp:  # a forward gathers parameters with every process: run one and drop its loss
                with ctx:
                    raw_model(*to_device(*data.windows(split_data, offsets[:1], block_size)))
            done += 1
            if master and time.time() > shown:
                spent = time.time() - t0
                print(f"evaluating iteration {iter_num}: {done}/{total_chunks} batches, {spent:.0f} s, "
                      f"about {spent * (total_chunks - done) / done:.0f} s to go", flush=True)
                shown = time.time() + 15
        if ddp:
            dist.all_reduce(total)
        total = total.tolist()
        result[split] = total[0] / total[1]
    model.train()
    return result


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:  # also when lr_decay_iters <= warmup_iters: no cosine to follow
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def read_step(step):
    """Read a step's [loss, non-finite, stop] (waiting for the device if needed), write its
    train_log.jsonl line and act on its flags. Returns (loss, whether any process stops)."""
    global grad_norm
    loss, bad, stop, norm = step['stats']()
    loss, grad_norm = loss / world_size, norm / world_size if math.isfinite(norm) else None  # before clipping
    if bad and not skip_nonfinite and dtype != 'float16':  # float16: the grad scaler skips such steps
        kept = (f"the last good checkpoint {ckpt_path} (iteration {saved_iter}) is untouched"
                if saved_iter is not None else "no checkpoint of this run had been saved yet")
        raise UserError(f"non-finite loss or gradient at iteration {step['iter']} (loss {loss}); {kept}; "
                        f"lower learning_rate, or set skip_nonfinite=True to skip such steps")
    if master:
        rec = {'iter': step['iter'], 'loss': loss, 'lr': step['lr'], 'grad_norm': grad_norm}
        run_folder.append_jsonl(out / 'train_log.jsonl', {**rec, 'dt_s': round(step['dt'], 4)}, saved_iter)
    return loss, stop > 0


def duration(s):
    return f"{s // 3600:.0f}h{s % 3600 // 60:02.0f}m" if s >= 3600 else f"{s // 60:.0f}m{s % 60:02.0f}s" if s >= 60 \
        else f"{s:.0f}s"


def eta(step_s):
    """Seconds to the end: the remaining steps at this step time, and the remaining evaluations
    at the last one's duration."""
    evals_left = max_iters // eval_interval - iter_num // eval_interval + (max_iters % eval_interval != 0)
    return (max_iters - iter_num) * step_s + evals_left * eval_s


def save_checkpoint():
    """Every process calls it (DDP gathers each one's RNG state, FSDP the shards); rank 0 writes
    ckpt.pt atomically (checkpoint.py): all a resumed run needs to continue exactly."""
    model_state, optimizer_state, rng = checkpoint.gather(raw_model, optimizer, device, ddp, fsdp, master)
    if not master:
        return
    checkpoint.save_checkpoint({
        'model': model_state, 'optimizer': optimizer_state,
        'model_args': asdict(gptconf), 'config': config, 'iter_num': iter_num,
        'best_val_loss': best_val_loss, 'tokenizer': meta_for_ckpt, 'dataset': dataset,
        'rng': {**rng, 'data': data_state},  # data_state: before the prefetch's draw
        'elapsed_s': elapsed(), 'train_time_s': train_time, 'untimed_iters': untimed_iters,
        'skipped_steps': skipped_steps,
        'evaluated': last.get('iter') == iter_num,  # False when a signal stopped the run before this eval
        'wandb_run_id': wandb_run_id,  # a resumed run logs on into the same wandb run
    }, out, keep_last, saved_iter)
    print(f"checkpoint saved to {ckpt_path} (iteration {iter_num})")


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
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group['lr'] = lr

    # evaluate (not again at the iteration just resumed from: its line is already logged)
    if (iter_num % eval_interval == 0 or iter_num >= max_iters or eval_only) and (iter_num != start_iter or not evaluated_at_start or eval_only):
        t_eval = time.time()
        losses = estimate_loss()
        if losses is not None and report_data is not None and (iter_num >= max_iters or eval_only):
            report = estimate_loss({'report': (report_data, data.tiling_offsets(len(report_data), block_size))})
            losses = losses and report and {**losses, **report}
        if losses is None:  # a stop signal: the evaluation is abandoned, the step below saved
            stop_agreed = True
        else:
            eval_s = time.time() - t_eval
            timed_tokens = (iter_num - untimed_iters) * tokens_per_iter
            last = {'iter': iter_num, 'train_loss': losses['train'], 'val_loss': losses['val'],
                    'val_ppl': math.exp(min(losses['val'], 50)), 'lr': lr, 'tokens': iter_num * tokens_per_iter,
                    'elapsed_s': round(elapsed(), 3),
                    'tokens_per_s': round(timed_tokens / train_time, 1) if train_time else None,
                    'params': n_params, 'flops_per_token': flops_per_token, 'skipped_steps': skipped_steps}
            last['mfu'] = mfu(last['tokens_per_s']) and round(mfu(last['tokens_per_s']), 4)
            if 'report' in losses:  # the whole report half
                last.update(report_loss=losses['report'], report_ppl=math.exp(min(losses['report'], 50)),
                            report_tokens=len(data.tiling_offsets(len(report_data), block_size)) * block_size)
            if master:
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                      f"val ppl {last['val_ppl']:.2f}" + (f", report loss {last['report_loss']:.4f} "
                                                          f"({last['report_tokens']:,} tokens)" if 'report_loss' in last else ''))
                if not eval_only:
                    run_folder.append_jsonl(out / 'log.jsonl', last, saved_iter)
                if wandb:
                    wandb.log(run_folder.wandb_record({**last, 'grad_norm': grad_norm}))
            if losses['val'] < best_val_loss or always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses['val'])
                if iter_num > start_iter:
                    save_checkpoint()
                    saved_iter = iter_num
    if eval_only or iter_num >= max_iters or stop_agreed:
        break

    # one optimisation step: accum micro-batches per process, gradients averaged by DDP
    first = iter_num == start_iter  # compilation, autotuning, allocator warm-up: timed apart
    if first and compile and master:
        print("compiling the model: the first step takes a while (it is not counted in tokens/s)")
    t0 = time.time()
    loss_sum = torch.zeros((), dtype=acc_dtype, device=device)
    for micro in range(accum):
        if fsdp:  # reduce-scatter on the last micro-step only; before it, gradients add up unsharded (fp32)
            raw_model.set_requires_gradient_sync(micro == accum - 1)
        elif ddp:  # synchronise gradients on the last micro-step only
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
        if micro == 0 and unread:
            stop_agreed |= read_step(unread)[1]
            unread = None
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip if grad_clip > 0 else float('inf'))
    if isinstance(norm, DTensor):  # FSDP: the norm over every shard, the same on every process
        norm = norm.full_tensor()
    stats = torch.zeros(4, dtype=acc_dtype, device=device)
    stats[0], stats[3] = loss_sum, norm  # the norm is the same on every process: averaged back in read_step
    stats[1] = ~(torch.isfinite(loss_sum) & torch.isfinite(norm))
    stats[2] = float(stop_signal is not None)
    if ddp:  # the loss summed over all processes, and one decision for all of them
        dist.all_reduce(stats)
    step = {'iter': iter_num, 'lr': lr, 'stats': devices.to_host(stats)}
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
    stop = stop_agreed or not ddp and stop_signal is not None
    read_now = device_type == 'cpu' or first or log_now or stop or iter_num % eval_interval == 0 or iter_num >= max_iters
    if read_now:
        devices.synchronize(device)
    step['dt'] = time.time() - t0
    if read_now:
        loss, stopped = read_step(step)
        stop = stop or stopped
    else:
        unread = step
    if first:
        untimed_iters += 1
    else:
        train_time += step['dt']
        log_time, log_steps = log_time + step['dt'], log_steps + 1
    if log_now and master:
        progress = f"iter {iter_num - 1}/{max_iters} ({100 * iter_num / max_iters:.0f}%): loss {loss:.4f}"
        if log_steps:
            tps = log_steps * tokens_per_iter / log_time
            print(f"{progress}, time {log_time / log_steps * 1000:.0f}ms, {tps:,.0f} tokens/s, mfu {mfu(tps):.2%}, "
                  f"eta {duration(eta(log_time / log_steps))}")
        else:
            print(f"{progress}, time {step['dt'] * 1000:.0f}ms (first step, not counted in tokens/s)")
    if log_now:
        log_steps, log_time = 0, 0.0
    stop_agreed = stop

    if stop:  # all processes stop at the same step
        break

if stop_agreed:  # the last completed step is saved (unless no step was completed)
    if iter_num > start_iter and iter_num != saved_iter:
        save_checkpoint()
        saved_iter = iter_num
    if master:
        print(f"stopped by signal at iteration {iter_num}; "
              + (f"checkpoint saved to {ckpt_path}; continue with --init_from=resume" if saved_iter is not None
                 else "no training step had finished, so there is nothing to save"))
elif master and last:
    print(f"final: iter {last['iter']}, val loss {last['val_loss']:.4f}, val ppl {last['val_ppl']:.2f}"
          + ('' if eval_only else f", {last['tokens_per_s'] or 0:,.0f} tokens/s"
             + (f", mfu {last['mfu']:.2%}" if last.get('mfu') else '')))
if wandb:
    wandb.finish()
if ddp:
    dist.barrier()  # every process past its last collective before the group is torn down
    dist.destroy_process_group()
    # The run is complete and saved. Interpreter teardown under gloo has aborted a finished
    # process ("terminate called without an active exception", twice in a few hundred CPU runs),
    # which torchrun then reports as a failure: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
