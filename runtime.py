"""
What train.py and sample.py both need before a model runs: the device and the dtype, a
checkpoint read safely (this project's or nanoGPT's), GPT-2's weights, and the model a
checkpoint holds. Every failure is a UserError saying what is wrong and how to fix it.
"""

import os
import re
from contextlib import nullcontext
from pathlib import Path

import torch

import hub
from errors import UserError
from model import GPT, GPTConfig

GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')
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


# -----------------------------------------------------------------------------
# checkpoints

def load_checkpoint(path, missing='train first, or set --out_dir'):
    """A checkpoint read with weights_only=True (loading never runs code), this project's or
    nanoGPT's (whose parameter names are mapped to ours). A file that pickles code is refused
    as unsafe; one that is not a checkpoint, or is cut short, as corrupt."""
    path = Path(path)
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
    import data
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
    elif own and own.get('itos') and own['itos'] != tok_itos(meta):
        have = f"other characters than the {len(own['itos'])} it was trained on"
    elif not fits:
        have = f"{size:,} {'characters' if kind == 'char' else 'tokens'}"
    else:
        return meta
    dataset_name = Path(str(dataset)).name if dataset else 'its dataset'
    raise UserError(f"checkpoint {path} has a vocabulary of {vocab:,} tokens but {source} has {have}: not the data "
                    f"it was trained on; give that data's meta: --meta=path/to/{dataset_name} (the dataset folder) "
                    f"or --meta=path/to/meta.pkl")


def tok_itos(meta):
    """A character vocabulary as a list (nanoGPT's meta.pkl stores {int: str})."""
    itos = meta.get('itos')
    return [itos[i] for i in range(len(itos))] if isinstance(itos, dict) else itos


def load_gpt2(name, dropout=0.0):
    """GPT-2's weights by name (Hub or its cache) or from a save_pretrained folder."""
    try:
        return GPT.from_pretrained(name, dict(dropout=dropout))
    except (ValueError, OSError, ImportError) as e:
        raise UserError(f"could not load GPT-2 weights {name!r} ({hub.first_line(e)})" + (
            "; offline: give init_from a folder saved by transformers' save_pretrained, or the name of "
            "a model already in the Hugging Face cache (HF_HOME)" if hub.offline_now() else ''))


def init_kind(init_from, choices):
    """What init_from names: 'scratch', 'resume', 'gpt2' (a name or a Hugging Face folder) or
    'file' (a checkpoint to start from); one of `choices`, else a one-line refusal."""
    if init_from in ('scratch', 'resume'):
        kind = init_from
    elif init_from in GPT2_NAMES or (Path(init_from) / 'config.json').is_file():
        kind = 'gpt2'
    elif Path(init_from).is_file():
        kind = 'file'
    elif not Path(init_from).exists() and ('/' in init_from or os.sep in init_from or
                                            init_from.endswith(('.pt', '.pth', '.ckpt'))):  # meant a path
        what = 'a checkpoint file (ckpt.pt) or a Hugging Face GPT-2 folder' if 'file' in choices else \
            'a Hugging Face GPT-2 folder (config.json)'
        raise UserError(f"init_from {init_from!r}: file not found; give the path of {what}")
    else:
        kind = None
    if kind not in choices:
        first = ', '.join(repr(c) for c in ('scratch', 'resume') if c in choices)
        file = ', or a checkpoint file (ckpt.pt)' if 'file' in choices else ''
        raise UserError(f"init_from must be {first}, one of {', '.join(GPT2_NAMES)} or a folder holding a Hugging "
                        f"Face GPT-2 (config.json){file}, not {init_from!r}")
    return kind
