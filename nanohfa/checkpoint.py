"""
Checkpoints: what train.py writes (atomically, with every process's RNG state, so a resumed
run continues exactly) and what train.py, sample.py and interactions.py read back (this
project's checkpoints, nanoGPT's, the Hugging Face folders export_hf.py writes (hf_folder.py),
and GPT-2's weights), safely. What goes into a checkpoint is train.py's choice; this module
gathers, writes and reads it. Every failure is a UserError saying what is wrong and how to fix it.

ckpt.pt holds the optimizer as optimizer.state_dict() does, its state keyed by the parameter's
position in the groups; torch.distributed.checkpoint keys it by parameter name. Under FSDP
the two are converted, so one checkpoint serves DDP, FSDP, one process and sample.py.
"""

import os
import re
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from nanohfa import configurator
from nanohfa import data
from nanohfa import hf_folder
from nanohfa import hub
from nanohfa import run_folder
from nanohfa.errors import UserError
from model import GPT, GPTConfig

GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')


def init_kind(init_from, choices):
    """What init_from names: 'scratch', 'resume', 'gpt2' (a name or a Hugging Face GPT-2 folder) or
    'file' (a checkpoint to start from, or a folder export_hf.py wrote); one of `choices`, else a
    one-line refusal."""
    if init_from in ('scratch', 'resume'):
        kind = init_from
    elif init_from in GPT2_NAMES or (Path(init_from) / 'config.json').is_file():
        kind = 'file' if hf_folder.config_of(init_from) is not None else 'gpt2'
    elif Path(init_from).is_file():
        kind = 'file'
    elif not Path(init_from).exists() and ('/' in init_from or os.sep in init_from or
                                            init_from.endswith(('.pt', '.pth', '.ckpt'))):  # meant a path
        what = ('a checkpoint file (ckpt.pt), a folder written by export_hf.py or a Hugging Face GPT-2 folder'
                if 'file' in choices else 'a Hugging Face GPT-2 folder (config.json)')
        raise UserError(f"init_from {init_from!r}: file not found; give the path of {what}")
    else:
        kind = None
    if kind not in choices:
        first = ', '.join(repr(c) for c in ('scratch', 'resume') if c in choices)
        file = '; or a checkpoint file (ckpt.pt) or a folder written by export_hf.py;' if 'file' in choices else ','
        raise UserError(f"init_from must be {first}, one of {', '.join(GPT2_NAMES)} or a folder holding a Hugging "
                        f"Face GPT-2 (config.json){file} not {init_from!r}")
    return kind


# -----------------------------------------------------------------------------
# reading

def load_checkpoint(path, missing='train first, or set --out_dir'):
    """A checkpoint read with weights_only=True (loading never runs code), this project's or
    nanoGPT's (whose parameter names are mapped to ours). A file that pickles code is refused
    as unsafe; one that is not a checkpoint, or is cut short, as corrupt."""
    path = Path(path)
    if path.is_dir() and hf_folder.config_of(path) is not None:
        return read_hf_folder(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; {missing}")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        found = re.findall(r'GLOBAL ([\w.]+)', str(e))
        if found:  # a valid pickle that names a function or class: it could run code
            raise UserError(f"checkpoint {path} holds objects other than tensors and plain containers "
                            f"({found[0]}); refusing to load it, since that could run code")
        raise UserError(f"checkpoint {path} is unreadable or truncated ({type(e).__name__}: not a complete "
                        f"checkpoint file); restore it from a backup, or train again")
    if not isinstance(ckpt, dict) or not {'model', 'model_args'} <= ckpt.keys():
        raise UserError(f"{path} is a torch file but not a training checkpoint (it has no model and model_args); "
                        f"give the ckpt.pt that train.py wrote")
    return ckpt if 'rng' in ckpt else from_nanogpt(ckpt)


def read_hf_folder(path):
    """A folder export_hf.py wrote, as a checkpoint (hf_folder.read); one that cannot be read, in one line."""
    from safetensors import SafetensorError
    try:
        return hf_folder.read(path)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:  # missing, truncated, not ours
        raise UserError(f"the Hugging Face folder {path} cannot be read ({hub.first_line(e, 200)}); export the "
                        f"checkpoint again (python export_hf.py --out_dir=... --to={path} --overwrite)")


def saved_iteration(path):
    """The iteration a checkpoint holds, read without loading its tensors (memory-mapped: a
    multi-GB checkpoint costs milliseconds); None where no complete checkpoint can be read."""
    try:
        return int(torch.load(path, map_location='cpu', weights_only=True, mmap=True)['iter_num'])
    except Exception:  # missing, cut short, not ours: no iteration to report
        return None


def from_nanogpt(ckpt):
    """nanoGPT's checkpoint (softmax attention, its 7 model_args) in our layout: torch.compile's
    '_orig_mod.' prefix dropped, the causal-mask buffers of its non-flash attention dropped, and
    its attn.c_attn is our attn.groups.0.c_attn (one group of heads). Parameter order and shapes
    are the same, so its AdamW state loads as it is."""
    model = {}
    for k, v in ckpt['model'].items():
        k = k.removeprefix('_orig_mod.')
        if k.endswith('.attn.bias') and v.dim() == 4:  # the mask buffer, not a weight
            continue
        model[k.replace('.attn.c_attn.', '.attn.groups.0.c_attn.')] = v
    best = ckpt.get('best_val_loss', 1e9)
    return {**ckpt, 'model': model, 'best_val_loss': float(best), 'nanogpt': True}


def model_from_checkpoint(ckpt, path, **override):
    """The GPT a checkpoint holds, its weights loaded; override: dropout, kernel (not architecture)."""
    try:
        model = GPT(GPTConfig.from_dict({**ckpt['model_args'], **override}))
        model.load_state_dict(ckpt['model'])
    except (ValueError, RuntimeError, TypeError) as e:
        raise UserError(f"checkpoint {path} does not hold a GPT this code can build ({hub.first_line(e, 200)})")
    return model


def checkpoint_meta(ckpt, path, given='', gpt2_fallback=True):
    """The tokenizer metadata a checkpoint's tokens are read with: `given` (--meta: a dataset
    folder, or its meta.json / meta.pkl), else the record the checkpoint carries (ours), else its
    dataset's meta under data/ (nanoGPT's, as nanoGPT's sample.py finds it), else GPT-2's tokens
    (None without gpt2_fallback). A vocabulary that is not the checkpoint's is refused: decoding
    with it indexes past the model's table or reads the wrong characters."""
    vocab = ckpt['model_args']['vocab_size']
    own = ckpt.get('tokenizer') or None
    dataset = ckpt.get('dataset') or ckpt.get('config', {}).get('dataset')
    if given:
        source = Path(given)
        if source.is_dir():
            meta = data.read_meta(source)
            if meta is None:
                raise UserError(f"--meta={given}: that folder holds no meta.json or meta.pkl; give the folder of "
                                f"the dataset the checkpoint was trained on, or its meta file")
        elif source.is_file():
            meta = data.read_meta_file(source)
        else:
            raise UserError(f"--meta={given} not found; give the folder of the dataset the checkpoint was trained "
                            f"on, or its meta.json / meta.pkl")
    elif own:
        return own
    else:
        folder = data.DATA / dataset if dataset else None
        source = folder and next((folder / n for n in ('meta.json', 'meta.pkl') if (folder / n).exists()), None)
        meta = source and data.read_meta(folder)
        if meta is None:
            if not gpt2_fallback:
                return None
            meta = {'tokenizer': 'gpt2', 'vocab_size': 50257}
            source = (f"GPT-2's tokenizer (the default, since {folder} holds no meta.json or meta.pkl)" if folder
                      else "GPT-2's tokenizer (the default, since the checkpoint names no dataset)")
    kind, size = meta.get('tokenizer'), meta['vocab_size']
    fits = vocab >= size if kind == 'gpt2' else vocab == size
    if own and own.get('tokenizer') != kind:
        have = f"the {kind!r} tokenizer, not the {own.get('tokenizer')!r} one it was trained with"
    elif own and own.get('itos') and own['itos'] != data.tok_itos(meta):
        have = f"other characters than the {len(own['itos'])} it was trained on"
    elif not fits:
        have = f"{size:,} {'characters' if kind == 'char' else 'tokens'}"
    else:
        return meta
    dataset_name = Path(str(dataset)).name if dataset else 'its dataset'
    raise UserError(f"checkpoint {path} has a vocabulary of {vocab:,} tokens but {source} has {have}: not the data "
                    f"it was trained on; give that data's meta: --meta=path/to/{dataset_name} (the dataset folder) "
                    f"or --meta=path/to/meta.pkl")


def train_config(defaults, argv, help_text):
    """train.py's configuration: (config, what set each key, the checkpoint or None, its saved
    config). With init_from='resume' the checkpoint in out_dir is read first, and its config is
    the default for every key it holds (except init_from and out_dir); config files and
    --key=value overrides go over it."""
    config, applied = configurator.parse(defaults, argv, help_text)
    if config['init_from'] != 'resume':
        return config, applied, None, {}
    ckpt = load_checkpoint(Path(config['out_dir']) / 'ckpt.pt', "nothing to resume; train with init_from='scratch' first")
    saved = {k: v for k, v in ckpt.get('config', {}).items() if k in defaults and k not in ('init_from', 'out_dir')}
    config, applied = configurator.parse({**defaults, **saved}, argv, help_text)
    return config, applied, ckpt, saved


def refuse_architecture_changes(config, set_by, source, source_args):
    """A config file or override (set_by: key -> what set it) that contradicts the model being
    loaded from `source`, whose model arguments are source_args: one line, not ignored."""
    for k, v in source_args.items():
        if k in set_by and k in config and k in GPTConfig.__dataclass_fields__ and config[k] != v \
                and k not in ('dropout', 'hfa_kron', 'ha_form', 'block_size', 'kernel_check'):  # these may change; block_size may shrink
            raise UserError(f"{k}={config[k]!r} (set by {set_by[k]}) contradicts {source}, which has {k}={v!r}; "
                            f"its architecture is fixed: drop that setting, or train a new model in another out_dir")


def check_weights(weights, cfg, source):
    """Weights that will not load into the model `cfg` describes, refused in one line before
    anything is claimed, moved aside or allocated: the layers the weights hold must be the
    config's n_layer (counted from the names first, so that a config claiming a million layers
    over a few MB is refused without building them), and every tensor's name and shape that of
    the model, read from a model built on the meta device (no memory). weights: a checkpoint
    dict, a built GPT (GPT-2's, already checked) or None (from scratch)."""
    if not isinstance(weights, dict):
        return
    state = weights['model']
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise UserError(f"{source} holds no state dict of tensors under 'model'; give a checkpoint train.py wrote")
    layers = {k.split('.')[2] for k in state if k.startswith('transformer.h.') and k.count('.') >= 3}
    if layers != {str(i) for i in range(cfg.n_layer)}:
        raise UserError(f"{source} holds weights for {len(layers)} layer{'s' * (len(layers) != 1)} but its model "
                        f"arguments say n_layer={cfg.n_layer}; the file is damaged or not one model's")
    with torch.device('meta'):
        want = {k: tuple(t.shape) for k, t in GPT(cfg).state_dict().items()}
    for k in sorted(want.keys() | state.keys()):
        got = tuple(state[k].shape) if k in state else None
        if got != want.get(k):
            what = (f"has no {k}" if got is None else f"holds {k}, which the model has not" if k not in want
                    else f"holds {k} of shape {got} where its model arguments give {want[k]}")
            raise UserError(f"{source} {what}; the file is damaged or not one model's: give the checkpoint that "
                            f"train.py wrote for this model")
    for key in ('iter_num',) if 'rng' in weights else ():
        if not isinstance(weights.get(key), int) or weights[key] < 0:
            raise UserError(f"{source} records {key}={weights.get(key)!r}, not a count of iterations; the file is "
                            f"damaged: restore it from a backup")


def starting_weights(kind, config, set_by, ckpt, ckpt_path, meta, data_path):
    """(weights, model_args) of a run that starts as `kind` (init_kind's): the checkpoint it
    resumes (ckpt), another run's checkpoint (ours or nanoGPT's), GPT-2's weights (a GPT) or
    none (from scratch: the config's model). Every source is checked against the data's tokens
    and the user's architecture settings; the settings that may change (dropout, hfa_kron,
    ha_form, kernel, kernel_check) are the config's."""
    c = config
    model_args = {k: c[k] for k in c if k in GPTConfig.__dataclass_fields__}
    model_args['vocab_size'] = data.model_vocab_size(meta)
    source, weights = ckpt_path, ckpt
    if kind == 'file':  # another run's weights (ours or nanoGPT's): a new run starts from them
        source = Path(c['init_from'])
        weights = load_checkpoint(source)
        refuse_architecture_changes(c, set_by, f"the checkpoint {source}", weights['model_args'])
    if weights is not None:
        data.check_tokens_fit(weights, source, meta, data_path)
        model_args = {**weights['model_args'], 'dropout': c['dropout'], 'hfa_kron': c['hfa_kron'],
                      'ha_form': c['ha_form'], 'kernel': c['kernel'],
                      'kernel_check': c['kernel_check']}
        model_args = {k: v for k, v in model_args.items() if k in GPTConfig.__dataclass_fields__}
    elif kind == 'gpt2':  # GPT-2 weights (nanoGPT's finetune and eval configs)
        data.check_gpt2_tokens(c['init_from'], meta, data_path)
        weights = load_gpt2(c['init_from'], c['dropout'])
        refuse_architecture_changes(c, set_by, f"the GPT-2 weights {c['init_from']!r}", asdict(weights.config))
        model_args = asdict(weights.config)
    return weights, model_args


def counters(ckpt):
    """What a run counts over its sessions, where the checkpoint (None: from scratch) left it:
    (elapsed seconds, seconds of timed steps, untimed iterations (each session's first step,
    not in the timed seconds), skipped steps, whether its iteration was evaluated)."""
    if not ckpt:
        return 0.0, 0.0, 0, 0, False
    return (ckpt.get('elapsed_s', 0.0), ckpt.get('train_time_s', 0.0), ckpt.get('untimed_iters', 0),
            ckpt.get('skipped_steps', 0), ckpt.get('evaluated', True))


def load_gpt2(name, dropout=0.0):
    """GPT-2's weights by name (Hub or its cache) or from a save_pretrained folder."""
    try:
        return GPT.from_pretrained(name, dict(dropout=dropout))
    except (ValueError, OSError, ImportError) as e:
        raise UserError(f"could not load GPT-2 weights {name!r} ({hub.first_line(e)})" + (
            "; offline: give init_from a folder saved by transformers' save_pretrained, or the name of "
            "a model already in the Hugging Face cache (HF_HOME)" if hub.offline_now() else ''))


def finished(ckpt, path, max_iters):
    """Whether a run resumed from `ckpt` (read from `path`) with max_iters has nothing left to
    do: at max_iters with that iteration evaluated. Past max_iters is refused: the user meant
    to continue it (a larger max_iters) or to evaluate it."""
    if max_iters < ckpt['iter_num']:
        raise UserError(f"the checkpoint {path} is at iteration {ckpt['iter_num']}, past max_iters={max_iters}: "
                        f"nothing to train, and nothing was changed; give a larger --max_iters to continue the run, "
                        f"or --eval_only=True to evaluate it")
    return max_iters == ckpt['iter_num'] and ckpt.get('evaluated', True)


def load_optimizer(optimizer, model, state, fsdp):
    """The optimizer state a checkpoint holds; under FSDP each process keeps its own shard of it."""
    if not fsdp:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict  # seconds to import
    set_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True),
                             optim_state_dict=optimizer_state_by_name(state, model, optimizer))


def restore_rng(ckpt, data_gen, seed, rank, world_size, device):
    """The data order and this process's RNG (dropout) where the checkpoint left them. A
    nanoGPT checkpoint holds neither, and one saved with another number of processes holds no
    stream for this one: a fresh stream is seeded from the iteration instead (not a copy of
    rank 0's)."""
    iter_num = ckpt['iter_num']
    if 'rng' in ckpt:
        data_gen.set_state(ckpt['rng']['data'])
    else:
        data_gen.manual_seed(seed + 1000003 * iter_num)
    ranks_rng = ckpt.get('rng', {}).get('ranks') or []  # each process's own dropout RNG state
    own_rng = ranks_rng[rank] if len(ranks_rng) == world_size else ckpt.get('rng') if rank == 0 else None
    if own_rng is None:
        torch.manual_seed(seed + rank + 1000003 * iter_num)
    else:
        torch.set_rng_state(own_rng['torch'])
        if device.startswith('cuda') and own_rng.get('cuda') is not None:
            torch.cuda.set_rng_state(own_rng['cuda'], device)


# -----------------------------------------------------------------------------
# writing

def gather(model, optimizer, device, ddp, fsdp, master):
    """(model state, optimizer state, RNG state) to save. Every process calls it: DDP gathers
    each one's RNG state, FSDP each one's shards; the states are complete on rank 0 only.
    The RNG state is this process's (torch, cuda) with every process's under 'ranks'."""
    own_rng = {'torch': torch.get_rng_state(),
               'cuda': torch.cuda.get_rng_state(device) if device.startswith('cuda') else None}
    ranks_rng = [own_rng]
    if ddp:
        ranks_rng = [None] * dist.get_world_size()
        dist.all_gather_object(ranks_rng, own_rng)
    if fsdp:  # every process sends its shards; rank 0 gets the full tensors, in host memory
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)  # seconds to import
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(model, options=options)
        optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
        if master:
            optimizer_state = optimizer_state_by_position(optimizer_state)
    else:
        model_state, optimizer_state = model.state_dict(), optimizer.state_dict()
    return model_state, optimizer_state, {**own_rng, 'ranks': ranks_rng}


def save_checkpoint(state, out, keep_last, saved_iter):
    """Write state to out/ckpt.pt: to a temporary file, flushed to disk, then renamed, so there
    is never a half-written ckpt.pt; a failed write (a full disk) removes the temporary file
    and leaves the last checkpoint (of iteration saved_iter) as it was. keep_last > 0 also
    keeps the last that many as ckpt_<iter>.pt (hard links)."""
    out = Path(out)
    path, tmp, iter_num = out / 'ckpt.pt', out / 'ckpt.pt.tmp', state['iter_num']
    try:
        tmp.unlink(missing_ok=True)  # a stale one, or a link planted there: O_EXCL creates the file anew
        with os.fdopen(run_folder.open_in_place(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), 'wb') as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # RuntimeError: torch's zip writer, after the failed write
        if not isinstance(e, OSError) and not isinstance(e.__context__, OSError) and 'inline_container' not in str(e):
            raise
        tmp.unlink(missing_ok=True)
        raise run_folder.write_failed(e, f"the checkpoint of iteration {iter_num} to {tmp}", out, saved_iter)
    try:  # make the rename itself durable
        dir_fd = os.open(out, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)
    except OSError:
        pass
    if keep_last > 0:
        kept = out / f'ckpt_{iter_num:07d}.pt'
        os.link(path, kept) if not kept.exists() else None
        for old in sorted(out.glob('ckpt_*.pt'))[:-keep_last]:
            old.unlink()


def optimizer_state_by_name(state, model, optimizer):
    """ckpt.pt's optimizer state (keyed by position) keyed by parameter name, for FSDP."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g['params']]
    groups, i = [], 0
    for g in state['param_groups']:
        groups.append({**g, 'params': order[i:i + len(g['params'])]})
        i += len(g['params'])
    return {'state': {order[k]: v for k, v in state['state'].items()}, 'param_groups': groups}


def optimizer_state_by_position(state):
    """FSDP's optimizer state (keyed by parameter name) keyed by position, as ckpt.pt holds it."""
    order = [n for g in state['param_groups'] for n in g['params']]
    groups, i = [], 0
    for g in state['param_groups']:
        groups.append({**g, 'params': list(range(i, i + len(g['params'])))})
        i += len(g['params'])
    return {'state': {order.index(n): v for n, v in state['state'].items()}, 'param_groups': groups}
