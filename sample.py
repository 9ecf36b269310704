"""
Sample text from a trained checkpoint, or from GPT-2's weights.

    python sample.py --out_dir=out-quickstart --start="ROMEO:" --num_samples=2
    python sample.py --out_dir=out --start=FILE:prompt.txt --max_new_tokens=200
    python sample.py --init_from=gpt2-xl --start="What is the answer to life?"

Decodes with the tokenizer the training data was prepared with (stored in the
checkpoint); GPT-2's weights use GPT-2's tokenizer. The same seed gives the same text.
Keys and values are cached between steps (use_cache=False recomputes the whole context
at every step).
"""

import pickle
import re
import sys
from pathlib import Path

import torch

import configurator
import hub
import tokenizer as tok
from errors import UserError
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
init_from = 'resume'    # 'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' or a Hugging Face GPT-2 folder
out_dir = 'out'         # the training run whose ckpt.pt to sample from
start = '\n'            # prompt text, or FILE:path to read it from a file
num_samples = 1         # samples to draw
max_new_tokens = 500    # tokens generated per sample
temperature = 0.8       # < 1 sharpens, > 1 flattens the distribution
top_k = 200             # keep only the k most likely tokens (0: all)
seed = 1337             # the same seed gives the same text
device = 'auto'         # 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
use_cache = True        # keep keys and values between steps (False: recompute the context)
# -----------------------------------------------------------------------------
defaults = {k: v for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))}
globals().update(configurator.load(defaults, sys.argv[1:], script=__file__))
GPT2_NAMES = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')

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
if temperature <= 0:
    raise UserError(f"temperature must be > 0, got {temperature}")
if init_from == 'resume':
    ckpt_path = Path(out_dir) / 'ckpt.pt'
    if not ckpt_path.exists():
        raise UserError(f"no checkpoint at {ckpt_path}; train first (python train.py ...) or set --out_dir")
    try:
        ckpt = torch.load(ckpt_path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.findall(r'GLOBAL ([\w.]+)', str(e)) or ['an object of unknown type']
        raise UserError(f"checkpoint {ckpt_path} holds objects other than tensors and plain containers "
                        f"({found[0]}); refusing to load it, since that could run code")
    except Exception as e:
        raise UserError(f"checkpoint {ckpt_path} is unreadable or truncated ({type(e).__name__}); retrain or restore it")
    model = GPT(GPTConfig(**ckpt['model_args']))
    model.load_state_dict(ckpt['model'])
    enc = tok.from_meta(ckpt['tokenizer'])
elif init_from in GPT2_NAMES or (Path(init_from) / 'config.json').is_file():
    try:
        model = GPT.from_pretrained(init_from, dict(dropout=0.0))
    except (ValueError, OSError, ImportError) as e:
        raise UserError(f"could not load GPT-2 weights {init_from!r} ({hub.first_line(e)})" + (
            "; offline: give init_from a folder saved by transformers' save_pretrained, or the name of "
            "a model already in the Hugging Face cache (HF_HOME)" if hub.offline_now() else ''))
    enc = tok.GPT2Tokenizer()
else:
    raise UserError(f"init_from must be 'resume', one of {', '.join(GPT2_NAMES)} or a folder holding a "
                    f"Hugging Face GPT-2 (config.json), not {init_from!r}")
model.eval().to(device)

if start.startswith('FILE:'):
    prompt_path = Path(start[5:])
    if not prompt_path.is_file():
        raise UserError(f"prompt file {prompt_path} not found")
    start = prompt_path.read_text(encoding='utf-8')
ids = enc.encode(start)
if not ids:
    raise UserError("the prompt is empty; give --start=TEXT")
x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]

torch.manual_seed(seed)
for k in range(num_samples):
    y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None, use_cache=use_cache)
    print(enc.decode(y[0].tolist()))
    print('---------------')
