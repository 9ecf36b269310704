"""
Sample text from a trained checkpoint, or from GPT-2's weights.

    python sample.py --out_dir=out-quickstart --start="ROMEO:" --num_samples=2
    python sample.py --out_dir=out --start=FILE:prompt.txt --max_new_tokens=200
    python sample.py --init_from=gpt2-xl --start="What is the answer to life?"

Decodes with the tokenizer the training data was prepared with (stored in the
checkpoint; for a nanoGPT checkpoint, --meta=path/to/dataset or its meta.pkl, else its
dataset's meta under data/, else GPT-2's); a meta whose vocabulary is not the checkpoint's
is refused. GPT-2's weights use GPT-2's tokenizer.

    python sample.py --init_from=nanoGPT/out-shakespeare-char/ckpt.pt --meta=nanoGPT/data/shakespeare_char

The same seed gives the same text; temperature=0 decodes greedily. Keys and values are
cached between steps (use_cache=False recomputes the whole context at every step).
"""

import sys
from pathlib import Path

import torch

from nanohfa import checkpoint
from nanohfa import configurator
from nanohfa import devices
from nanohfa import settings
from nanohfa import tokenizer as tok
from nanohfa.errors import UserError

# -----------------------------------------------------------------------------
# the configuration: settings.SAMPLE's defaults (--help lists them), config files, --key=value
config = configurator.load(settings.defaults(settings.SAMPLE), sys.argv[1:],
                           configurator.help_text(settings.SAMPLE, 'sample.py', __doc__))
settings.check(settings.SAMPLE, config)
globals().update(config)
# -----------------------------------------------------------------------------

device = devices.pick_device(device)
dtype, ctx = devices.pick_dtype(dtype, device)
kind = checkpoint.init_kind(init_from, ('resume', 'gpt2', 'file'))
if kind == 'gpt2':
    model = checkpoint.load_gpt2(init_from)
    enc = tok.GPT2Tokenizer()
else:
    ckpt_path = Path(out_dir) / 'ckpt.pt' if kind == 'resume' else Path(init_from)
    ckpt = checkpoint.load_checkpoint(ckpt_path, "train first (python train.py ...) or set --out_dir")
    model = checkpoint.model_from_checkpoint(ckpt, ckpt_path, dropout=0.0)
    # ours carries its tokenizer; nanoGPT's is read with --meta, else its dataset's meta under
    # data/, else GPT-2's tokens, as nanoGPT's sample.py does; checked against its vocabulary
    enc = tok.from_meta(checkpoint.checkpoint_meta(ckpt, ckpt_path, meta))
model.eval().to(device)
if compile:
    print("note: compile=True is accepted for nanoGPT's command lines; sampling runs eagerly", file=sys.stderr)

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
    with ctx:
        y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k or None, use_cache=use_cache)
    print(enc.decode(y[0].tolist()))
    print('---------------')
