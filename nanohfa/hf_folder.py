"""
Hugging Face folders of our models: written from a checkpoint (export_hf.py) and read back
(init_from=FOLDER in train.py, sample.py, eval.py). A folder holds what `save_pretrained`
writes and `push_to_hub` uploads:

    config.json              the architecture, and `nanohfa`: the tokenizer record, the source
    generation_config.json
    model.safetensors        the weights (float32, as trained); the tied lm_head is not repeated
    tokenizer.json, tokenizer_config.json    GPT-2's BPE or the character vocabulary (AutoTokenizer)
    README.md                how to load it
and, for every model that is not GPT-2's shape, the code that builds it (trust_remote_code):
    modeling_nanohfa.py      hf_model.py: NanoHFAConfig, NanoHFAForCausalLM (auto_map names them)
    model.py, attention_kernels*.py, hub.py     model.py and what it imports, flattened
A softmax-attention model of GPT-2's shape is written as transformers' own GPT2LMHeadModel
(no code carried; biases that the model does not have are zeros).

The carried code is the project's own files, copied. transformers copies a remote-code model's
files into its module cache (HF_MODULES_CACHE) and imports them as one flat package, following
only `from .name import` lines; so each file is copied under a flat name (attention_kernels/ha/
ops.py: attention_kernels_ha_ops.py) with its imports of project modules made relative to that
name (`from attention_kernels.masks import visible` -> `from .attention_kernels_masks import
visible`; a module imported as an object -> `from . import attention_kernels_ha as ha`),
statement for statement, so line numbers match the originals. Nothing else in the files
changes (the custom ops of a copy register under a namespace of its own, op_common.NAMESPACE,
from the module's name, so that a folder never replaces the project's nanohfa:: ops, nor
another folder's, in one process). Besides:
- the Triton kernels are not carried (the dispatch picks PyTorch: attention_kernels.load_triton
  finds no kernel modules). Each is a stub that raises ImportError, as the lazy imports of ops.py
  name them and transformers wants every file it sees named;
- modeling_nanohfa.py ends with one `from .x import __name__` line per carried module: the
  modules imported as objects are otherwise invisible to transformers' copy (and to the Hub's
  download of a model's code).
"""

import ast
import json
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import torch

from nanohfa.errors import UserError
from model import GPTConfig

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the scripts, data/ and cache/ beside this package
WEIGHTS = 'model.safetensors'
WRAPPER = ('nanohfa.hf_model', 'modeling_nanohfa')  # the project module, and its name in a folder
NOT_CARRIED = ('triton', 'triton_chunked', 'triton_common')  # module names: the Triton kernels (stubs)
GPT2_CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


# -----------------------------------------------------------------------------
# the carried code

def module_file(name):
    """The file of project module `name` ('attention_kernels.ha.ops'), or None if it is not ours."""
    base = ROOT.joinpath(*name.split('.'))
    for path in (base.with_suffix('.py'), base / '__init__.py'):
        if path.is_file():
            return path
    return None


def flat(name):
    return WRAPPER[1] if name == WRAPPER[0] else name.removeprefix('nanohfa.').replace('.', '_')


def stubbed(name):
    return name.rsplit('.', 1)[-1] in NOT_CARRIED


def _imports(tree):
    """Every import statement of a module, at any depth (function-level imports included)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _rewrite(node, name):
    """The statement(s) replacing one import of module `name`, and the project modules it names."""
    if isinstance(node, ast.ImportFrom) and node.level:
        raise ValueError(f"{name}: relative import 'from {'.' * node.level}{node.module or ''} import'; the project "
                         f"imports its modules absolutely, which this copy relies on")
    own = lambda mod: module_file(mod) is not None
    parts, used, others = [], [], []
    if isinstance(node, ast.Import):
        for a in node.names:
            if not own(a.name.split('.')[0]):
                others.append(a.name + (f' as {a.asname}' if a.asname else ''))
            elif a.asname or '.' not in a.name:
                parts.append(f"from . import {flat(a.name)}" + (f" as {a.asname}" if a.asname or flat(a.name) != a.name
                                                                 else ''))
                used.append(a.name)
            else:
                raise ValueError(f"{name}: 'import {a.name}' (a submodule without `as`) cannot be made relative")
        if others:
            parts.insert(0, f"import {', '.join(others)}")
    elif own(node.module.split('.')[0]):
        attrs = []
        for a in node.names:
            sub = f"{node.module}.{a.name}"
            if own(sub):  # a module, imported as an object
                parts.append(f"from . import {flat(sub)} as {a.asname or a.name}")
                used.append(sub)
            else:
                attrs.append(a.name + (f' as {a.asname}' if a.asname else ''))
        if attrs:
            parts.insert(0, f"from .{flat(node.module)} import {', '.join(attrs)}")
            used.append(node.module)
    else:
        return None, []
    return '; '.join(parts), used


def carried_sources():
    """{file name in the folder: source}: hf_model.py and every project module it reaches,
    rewritten (see the module's docstring); stubs for the Triton kernel modules."""
    out, todo, seen, stubs = {}, [WRAPPER[0]], set(), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if stubbed(name):
            stubs.add(flat(name))
            out[f'{flat(name)}.py'] = (f'"""{name.replace(".", "/")}.py, a Triton kernel: not carried in this folder, '
                                       f'which computes\nattention with PyTorch (attention_kernels.dispatch picks it '
                                       f'when no Triton kernel loads)."""\n\nraise ImportError("the Triton kernels are '
                                       f'not carried in this folder; use kernel=\'torch\' or \'auto\'")\n')
            continue
        source = module_file(name).read_text()
        lines = source.splitlines(keepends=True)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))
        edits = []
        for node in _imports(ast.parse(source)):
            new, used = _rewrite(node, name)
            if new is None:
                continue
            todo.extend(used)
            start = starts[node.lineno - 1] + node.col_offset
            end = starts[node.end_lineno - 1] + node.end_col_offset
            edits.append((start, end, new + '\n' * (node.end_lineno - node.lineno)))
        for start, end, new in sorted(edits, reverse=True):
            source = source[:start] + new + source[end:]
        out[f'{flat(name)}.py'] = source
    manifest = sorted(f[:-3] for f in out if f[:-3] != WRAPPER[1] and f[:-3] not in stubs)
    out[f'{WRAPPER[1]}.py'] += (
        "\n\n# -----------------------------------------------------------------------------\n"
        "# written by export_hf.py: every module of the code carried in this folder, named once by a\n"
        "# `from .x import` line, the only imports transformers follows to copy a remote-code model's\n"
        "# files (the modules imported as objects, `from . import x`, it would miss)\n"
        + ''.join(f"from .{m} import __name__ as _  # noqa: E402\n" for m in manifest))
    for k, v in out.items():
        compile(v, k, 'exec')  # a rewrite that broke the syntax fails here, not in the user's session
    return out


# -----------------------------------------------------------------------------
# writing a folder

def gpt2_misfit(cfg):
    """Why a GPTConfig is not GPT-2's shape (transformers' GPT2LMHeadModel), or '' if it is."""
    kinds = set(cfg.layer_attentions())
    checks = [(kinds != {'sa'} or not cfg.softmax, f"its attention is {cfg.attn_layers or cfg.attention}"
                                                   f"{', without softmax' * (not cfg.softmax)}, not softmax (sa)"),
              (bool(cfg.attn_window), f"attn_window={cfg.attn_window}"),
              (cfg.dh * cfg.n_head != cfg.n_embd, f"head_dim={cfg.head_dim}"),
              (not cfg.causal, "causal=False")]
    return '; '.join(why for bad, why in checks if bad)


def tokenizer_files(record, block_size, folder):
    """The tokenizer of a checkpoint's record, written as AutoTokenizer reads it (tokenizer.json,
    tokenizer_config.json): GPT-2's BPE built from tiktoken's ranks by transformers' own
    converter, or the characters (one token each: a BPE of the characters with no merges). A
    character model has no end-of-text token: the newline stands in (eos), as in lm_eval_model.py.
    Returns (eos_token_id, bos_token_id): GPT-2's end-of-text, or (None, None) for characters,
    whose newline must not stop generation."""
    from transformers import GPT2TokenizerFast, PreTrainedTokenizerFast
    if record.get('tokenizer') == 'gpt2':
        from nanohfa import tokenizer as tok
        from transformers.convert_slow_tokenizer import TikTokenConverter
        enc = tok.GPT2Tokenizer()
        bpe = TikTokenConverter(vocab_file=str(tok.ensure_gpt2_ranks()), pattern=enc.enc._pat_str,
                                extra_special_tokens={'<|endoftext|>': enc.eot}).converted()
        eot = '<|endoftext|>'
        GPT2TokenizerFast(tokenizer_object=bpe, bos_token=eot, eos_token=eot, unk_token=eot,
                          model_max_length=block_size).save_pretrained(folder)
        return enc.eot, enc.eot
    if record.get('tokenizer', 'char') != 'char' or not record.get('itos'):
        raise UserError(f"this checkpoint's tokenizer is {record.get('tokenizer')!r}; export_hf.py writes GPT-2's BPE "
                        f"or a character vocabulary (a nanoGPT checkpoint: give its dataset with --meta)")
    from tokenizers import Tokenizer, decoders, models
    itos = record['itos']
    chars = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(itos)}, merges=[]))
    chars.decoder = decoders.Fuse()  # characters joined as they are (no spaces between tokens)
    eos = '\n' if '\n' in itos else itos[0]
    PreTrainedTokenizerFast(tokenizer_object=chars, eos_token=eos, model_max_length=block_size,
                            clean_up_tokenization_spaces=False).save_pretrained(folder)
    path = Path(folder) / 'tokenizer_config.json'
    config = json.loads(path.read_text())
    config['tokenizer_class'] = 'PreTrainedTokenizerFast'  # the name every transformers version knows
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + '\n')
    return None, None


def gpt2_weights(model):
    """Our GPT's weights under GPT2LMHeadModel's names and layout (Conv1D: (in, out)); a model
    without biases gets zero biases (the same function)."""
    out = {}
    for k, v in model.state_dict().items():
        if k == 'lm_head.weight':
            continue  # tied to the token embedding
        k = k.replace('.attn.groups.0.c_attn.', '.attn.c_attn.')
        out[k] = v.t().contiguous() if k.endswith(GPT2_CONV1D) else v.contiguous()
    if not model.config.bias:
        for name, m in model.named_modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)) and name != 'lm_head':
                out[f"{name.replace('.attn.groups.0.c_attn', '.attn.c_attn')}.bias"] = torch.zeros(
                    m.weight.shape[0] if isinstance(m, torch.nn.Linear) else m.weight.shape[-1], dtype=m.weight.dtype)
    return out


def write(model, record, to, source, fmt='auto', kernel='auto'):
    """Write `model` (a GPT of model.py) with its tokenizer record into the folder `to` (which
    must not exist: the caller moves it into place). fmt: 'gpt2' (refused for a model that is not
    GPT-2's shape), 'nanohfa' (the carried code), 'auto' (gpt2 where it fits). kernel: the
    checkpoint's setting, which init_from gets back (the folder computes with PyTorch).
    Returns the format."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    cfg = model.config
    misfit = gpt2_misfit(cfg)
    if fmt == 'gpt2' and misfit:
        raise UserError(f"--format=gpt2: this model is not GPT-2's shape ({misfit}); use --format=auto or nanohfa, "
                        f"which carries the model's code")
    fmt = 'nanohfa' if fmt == 'nanohfa' or misfit else 'gpt2'
    to = Path(to)
    to.mkdir(parents=True)
    eos, bos = tokenizer_files(record, cfg.block_size, to)
    # what init_from reads back: the tokenizer, the kernel settings the checkpoint ran with (the folder
    # computes with PyTorch), where it came from
    ours = {'format': fmt, 'tokenizer': record, 'kernel': kernel, 'kernel_check': cfg.kernel_check, 'source': source}
    if fmt == 'gpt2':
        from transformers import GPT2Config
        config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                            n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
                            attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5, bos_token_id=bos, eos_token_id=eos,
                            activation_function='gelu' if cfg.gelu == 'exact' else 'gelu_pytorch_tanh',
                            architectures=['GPT2LMHeadModel'])
        ours['bias'] = cfg.bias
        weights = gpt2_weights(model)
    else:
        from nanohfa.hf_model import NanoHFAConfig
        config = NanoHFAConfig(**{**asdict(cfg), 'kernel': 'torch'}, bos_token_id=bos, eos_token_id=eos,
                               architectures=['NanoHFAForCausalLM'],
                               auto_map={'AutoConfig': f'{WRAPPER[1]}.NanoHFAConfig',
                                         'AutoModelForCausalLM': f'{WRAPPER[1]}.NanoHFAForCausalLM'})
        weights = {f'gpt.{k}': v.contiguous() for k, v in model.state_dict().items() if k != 'lm_head.weight'}
        for name, text in carried_sources().items():
            (to / name).write_text(text)
    config.nanohfa = ours
    config.save_pretrained(to)
    GenerationConfig(bos_token_id=bos, eos_token_id=eos).save_pretrained(to)
    save_file(weights, to / WEIGHTS, metadata={'format': 'pt'})
    (to / 'README.md').write_text(model_card(cfg, fmt, record, source))
    shutil.copymode(to / 'README.md', to / WEIGHTS)  # safetensors writes 0600; the folder's other files are 0644 (umask)
    return fmt


def check(folder, model):
    """Load the folder as a user does (AutoModelForCausalLM, trust_remote_code) and compare its
    logits with the model's on two fixed random sequences of up to 64 tokens: the largest
    difference over the largest logit. More than 1e-5 (float32) is refused: the folder is wrong."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    except OSError as e:  # its module cache: transformers copies the model's code there to import it
        from transformers.utils import HF_MODULES_CACHE
        raise UserError(f"transformers could not load the folder it was given ({e.strerror or e}); its module cache "
                        f"HF_MODULES_CACHE={HF_MODULES_CACHE} must be a writable folder (or skip this check: "
                        f"--skip_check); nothing was written") from None
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(model.config.vocab_size, (2, min(model.config.block_size, 64)), generator=g)
    with torch.no_grad():
        want = model.float()(x, targets=x)[0]
        got = hf(x).logits
    worst = ((got - want).abs().max() / want.abs().max()).item()
    if not worst <= 1e-5:
        raise UserError(f"the folder written for {folder.name} does not reproduce the checkpoint's logits in "
                        f"transformers (difference {worst:.1e} of the largest logit); nothing was written")
    return worst


def model_card(cfg, fmt, record, source):
    kinds = cfg.attn_layers or cfg.attention
    remote = ", trust_remote_code=True" if fmt == 'nanohfa' else ''
    return f"""---
library_name: transformers
tags: [nanohfa, {kinds.replace(',', ', ')}]
---
# A nanohfa GPT ({kinds} attention)

{cfg.n_layer} layers, {cfg.n_head} heads, {cfg.n_embd} wide, context {cfg.block_size}, vocabulary {cfg.vocab_size}
({'GPT-2 BPE' if record.get('tokenizer') == 'gpt2' else f"{len(record.get('itos', []))} characters"}); exported by
export_hf.py from {source.get('checkpoint', 'a checkpoint')} (iteration {source.get('iter_num', '?')}).
{'transformers GPT2LMHeadModel: no remote code.' if fmt == 'gpt2' else
 'The model code (model.py and its attention code) is in this folder: trust_remote_code=True runs it.'}

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(FOLDER{remote})
tokenizer = AutoTokenizer.from_pretrained(FOLDER)
out = model.generate(**tokenizer("ROMEO:", return_tensors="pt"), max_new_tokens=100, do_sample=False)
print(tokenizer.decode(out[0]))
```

`lm_eval --model hf --model_args pretrained=FOLDER{remote.replace(', ', ',')} --tasks ...`
(batch_size 1 for generation tasks: the model takes no padding). In the nanohfa codebase:
`python train.py --init_from=FOLDER ...`, `python sample.py --init_from=FOLDER`.
"""


# -----------------------------------------------------------------------------
# reading a folder back (init_from)

def config_of(folder):
    """config.json of a folder written by export_hf.py (it holds `nanohfa`), else None."""
    path = Path(folder) / 'config.json'
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and isinstance(config.get('nanohfa'), dict) else None


def read_weights(folder):
    """The folder's safetensors weights: model.safetensors, or the shards its index names (a
    folder saved again by transformers' save_pretrained, after fine-tuning)."""
    from safetensors.torch import load_file
    folder = Path(folder)
    index = folder / f'{WEIGHTS}.index.json'
    files = sorted(set(json.loads(index.read_text())['weight_map'].values())) if index.is_file() else [WEIGHTS]
    for name in files:  # an index names shards of its own folder: a path elsewhere would be read as this model's
        if not isinstance(name, str) or Path(name).name != name or name in ('', '.', '..'):
            raise UserError(f"{index} names {name!r}, which is not a file of its folder {folder}; an index names the "
                            f"shard files beside it: fix the index, or save the folder again")
    weights = {}
    for name in files:
        weights.update(load_file(folder / name))
    return weights


def read(folder):
    """A folder written by export_hf.py as a checkpoint dict (checkpoint.load_checkpoint's): the
    weights under model.py's names, model_args, the tokenizer record. The architecture is
    config.json's; the kernel setting the checkpoint had (the folder computes with PyTorch)."""
    folder = Path(folder)
    config = config_of(folder)
    ours = config['nanohfa']
    weights = read_weights(folder)
    if config.get('model_type') == 'gpt2':
        act = config.get('activation_function', 'gelu_new')
        args = dict(block_size=config['n_positions'], vocab_size=config['vocab_size'], n_layer=config['n_layer'],
                    n_head=config['n_head'], n_embd=config['n_embd'], dropout=config.get('resid_pdrop', 0.0),
                    gelu='exact' if act == 'gelu' else 'tanh', attention='sa')
        biases = [v for k, v in weights.items() if k.endswith('.bias') and not k.endswith('.attn.bias')]
        # zeros the export added for a model without biases; trained since (in transformers): kept
        args['bias'] = ours.get('bias', True) or any(bool(b.any()) for b in biases)
        model = {}
        for k, v in weights.items():
            if k.endswith(('.attn.bias', '.attn.masked_bias')) or (k.endswith('.bias') and not args['bias']):
                continue
            model[k.replace('.attn.c_attn.', '.attn.groups.0.c_attn.')] = v.t() if k.endswith(GPT2_CONV1D) else v
    else:
        args = {f.name: config[f.name] for f in fields(GPTConfig) if f.name in config}
        model = {k.removeprefix('gpt.'): v for k, v in weights.items()}
    args.update({k: ours[k] for k in ('kernel', 'kernel_check') if k in ours})
    model.setdefault('lm_head.weight', model['transformer.wte.weight'])  # tied: saved once
    source = ours.get('source', {})
    return {'model': model, 'model_args': asdict(GPTConfig(**args)), 'tokenizer': ours.get('tokenizer'),
            'iter_num': source.get('iter_num', 0), 'best_val_loss': source.get('best_val_loss', 1e9),
            'dataset': source.get('dataset'), 'config': {}, 'hf_folder': str(folder)}
