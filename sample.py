"""
Sample text from a trained checkpoint.

    python sample.py --out_dir=out-quickstart --start="ROMEO:" --num_samples=2
    python sample.py --out_dir=out --start=FILE:prompt.txt --max_new_tokens=200

Decodes with the tokenizer the training data was prepared with (stored in the
checkpoint). The same seed gives the same text. Keys and values are cached between
steps (use_cache=False recomputes the whole context at every step).
"""

import pickle
import re
import sys
from pathlib import Path

import torch

import configurator
import tokenizer as tok
from errors import UserError
from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
out_dir = 'out'
start = '\n'            # prompt text, or FILE:path to read it from a file
num_samples = 1
max_new_tokens = 500
temperature = 0.8       # < 1 sharpens, > 1 flattens the distribution
top_k = 200             # keep only the k most likely tokens (0: all)
seed = 1337
device = 'auto'
use_cache = True
# -----------------------------------------------------------------------------
defaults = {k: v for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))}
globals().update(configurator.load(defaults, sys.argv[1:]))

if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
if temperature <= 0:
    raise UserError(f"temperature must be > 0, got {temperature}")
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
model.eval().to(device)
enc = tok.from_meta(ckpt['tokenizer'])

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
