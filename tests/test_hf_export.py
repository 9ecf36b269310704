"""Hugging Face folders (export_hf.py, hf_folder.py, hf_model.py), offline, transformers' module
cache in the session's temporary folder (conftest's HF_HOME; HF_MODULES_CACHE for the scripts):
- every model.py configuration exports and opens with AutoModelForCausalLM, with model.py's logits;
  an SA model of GPT-2's shape as transformers' own GPT2LMHeadModel;
- the carried code is the project's files, only their imports made relative (and the custom ops'
  namespace), and opens where the project cannot be imported; transformers copies every file;
- `generate` is sample.py's decoding (greedy and seeded sampling, past block_size);
- the tokenizers encode as ours (GPT-2's BPE as tiktoken, the characters as CharTokenizer);
- init_from reads a folder back to the same weights and settings, and training from it continues
  with the losses of training from the checkpoint;
- lm-eval's own `hf` model on a folder gives eval.py's metrics on the checkpoint (and its CLI);
- bad input, a full disk, a second export into the same folder, an unusable module cache, a
  truncated folder: one line each, and nothing lost."""

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from nanohfa import checkpoint
import export_hf
from nanohfa import hf_folder
from nanohfa import tokenizer as tok
from nanohfa.errors import UserError
from model import GPT, GPTConfig
from lm_eval_fixture import ENC, GEN, MC, TASKS, TEXT, fixture_texts

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures('one_thread')

# every kind of model model.py builds: its attention variants, their options, mixed heads and layers
VARIANTS = {
    'sa': dict(attention='sa'),  # GPT-2's shape (no biases: zeros in the folder): GPT2LMHeadModel
    'sa_gpt2': dict(attention='sa', bias=True, gelu='tanh'),  # GPT-2's own choices: GPT2LMHeadModel
    'sa_window': dict(attention='sa', attn_window=8),
    'sa_head_dim': dict(attention='sa', head_dim=4),
    'linear': dict(attention='linear', linear_norm=True),
    'linear_window': dict(attention='linear', attn_window=8),
    'hfa_v1': dict(attention='hfa_v1', hfa_order=3, hfa_kron='off'),
    'hfa_v2': dict(attention='hfa_v2', attn_window=8),
    'hfa_mixed_heads': dict(attention='hfa_v2', n_hfa_head=1),  # an SA head beside an HFA head in a layer
    'hfa_no_softmax': dict(attention='hfa_v1', softmax=False),
    'ha': dict(attention='ha'),
    'ha_shared_windows': dict(attention='ha', ha_share_kv=True, ha_window1=4, ha_window2=6),
    'ha_no_softmax': dict(attention='ha', softmax=False),
    'ha_order4': dict(attention='ha', ha_order=4, block_size=16),
    'layers': dict(attn_layers='sa,hfa_v1,ha', n_layer=3),
    'non_causal': dict(attention='hfa_v1', causal=False),
}
GPT2_SHAPED = {'sa', 'sa_gpt2'}


def tiny(name, seed=0, vocab_size=None):
    """A tiny model whose 2-D weights are scaled up, so its logits and greedy text vary."""
    torch.manual_seed(seed)
    cfg = dict(block_size=32, vocab_size=vocab_size or ENC.vocab_size, n_layer=2, n_head=2, n_embd=16, bias=False)
    model = GPT(GPTConfig(**{**cfg, **VARIANTS.get(name, {})})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() == 2 else 1.0)
    return model


def save_run(model, out_dir, tokenizer=None):
    """A checkpoint as train.py writes it (the fields readers use)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save({'model': model.state_dict(), 'model_args': asdict(model.config), 'iter_num': 3, 'best_val_loss': 9.9,
                'config': {}, 'rng': {}, 'tokenizer': tokenizer or ENC.meta()}, out_dir / 'ckpt.pt')
    return out_dir


def load_hf(folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()


def rel_diff(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    """Every variant trained-as-saved and exported by export_hf.py (its own check included)."""
    from transformers.utils import HF_MODULES_CACHE
    assert HF_MODULES_CACHE == os.environ['HF_MODULES_CACHE']  # the session's (conftest), not the user's
    tmp = tmp_path_factory.mktemp('hf')
    out = {}
    for name in VARIANTS:
        model = tiny(name)
        run = save_run(model, tmp / 'runs' / name)
        export_hf.main([f'--out_dir={run}', f'--to={tmp / "hf" / name}'])
        out[name] = (model, run, tmp / 'hf' / name)
    return out


BPE_TEXTS = ["Hello world!  It's 2024...\n\n\ttabs  and   spaces ünïcödé 日本語 🎉", " leading space",
             "a\r\nb  ", "ROMEO: But, soft! what light through yonder window breaks?"]


@pytest.fixture(scope='module')
def exported_bpe(tmp_path_factory):
    """Two GPT-2-token models (padded vocabulary of 50,304): SA as GPT2LMHeadModel, HA with its code."""
    tmp = tmp_path_factory.mktemp('hf_bpe')
    out = {}
    for name in ('sa', 'ha'):
        model = tiny(name, vocab_size=50304)
        run = save_run(model, tmp / 'runs' / name, tokenizer={'tokenizer': 'gpt2', 'vocab_size': 50257})
        export_hf.main([f'--out_dir={run}', f'--to={tmp / name}', '--skip_check'])
        out[name] = (model, run, tmp / name)
    return out


# -----------------------------------------------------------------------------
# the folder opens in transformers as the model it was exported from

LOGITS = {}  # the numbers, for the record (printed by -s)


@pytest.mark.parametrize('name', VARIANTS)
def test_every_variant_opens_in_transformers_with_model_pys_logits(name, exported):
    model, _, folder = exported[name]
    hf = load_hf(folder)
    assert type(hf).__name__ == ('GPT2LMHeadModel' if name in GPT2_SHAPED else 'NanoHFAForCausalLM')
    assert (folder / 'modeling_nanohfa.py').exists() == (name not in GPT2_SHAPED)
    x = torch.randint(ENC.vocab_size, (3, model.config.block_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x, targets=x)[0]
        got = hf(x).logits
    LOGITS[name] = rel_diff(got, want)
    print(f"| {name} | {type(hf).__name__} | {LOGITS[name]:.1e} |")
    assert want.abs().max() > 1 and LOGITS[name] <= 1e-6  # float32: relative to the largest logit


def test_the_carried_code_is_the_projects_own(exported):
    """Each carried file is a project file under a flat name, line for line: only its import lines
    differ (made relative). The Triton kernels are stubs. Loaded, the copy's custom ops live in a
    namespace of their own: a second registration of the project's would replace its ops."""
    folder = exported['layers'][2]
    carried = {p.name: p.read_text() for p in folder.glob('*.py')}
    assert {'modeling_nanohfa.py', 'model.py', 'attention_kernels.py', 'attention_kernels_ha_pytorch.py',
            'attention_kernels_hfa_pytorch.py', 'attention_kernels_sa.py', 'attention_kernels_masks.py'} <= set(carried)
    sources = [ROOT / 'nanohfa/hf_model.py', ROOT / 'model.py', ROOT / 'nanohfa/hub.py', *(ROOT / 'attention_kernels').rglob('*.py')]
    matched = set()
    for original in sources:
        module = str(original.relative_to(ROOT).with_suffix('')).replace('/__init__', '').replace('/', '.')
        name = f'{hf_folder.flat(module)}.py'
        if name not in carried:
            continue
        matched.add(name)
        text = carried[name]
        if hf_folder.stubbed(module):
            assert 'raise ImportError("the Triton kernels are not carried' in text, name
            continue
        ours, theirs = original.read_text().splitlines(), text.splitlines()
        if name == 'modeling_nanohfa.py':  # its tail names every carried module for transformers' copy
            theirs = theirs[:len(ours)]
        assert len(ours) == len(theirs), name
        for a, b in zip(ours, theirs):
            if a != b:
                assert re.match(r'\s*(import|from) ', a), (name, a, b)
    assert matched == set(carried)  # nothing else in the folder
    assert 'attention_kernels_preflight.py' not in carried  # only what model.py reaches
    # what transformers checks is installed before it runs a file from the Hub: no module of ours
    from transformers.dynamic_module_utils import get_imports
    ours = {p.stem for p in ROOT.glob('*.py')} | {'attention_kernels', 'nanohfa'}
    assert not {m for f in carried for m in get_imports(folder / f)} & ours
    from attention_kernels.ha import ops
    package = type(load_hf(folder)).__module__.rsplit('.', 1)[0]
    theirs = sys.modules[f'{package}.attention_kernels_ha_ops'].ha3_blockwise_fwd
    assert ops.ha3_blockwise_fwd._namespace == 'nanohfa' and re.fullmatch(r'nanohfa_[0-9a-f]{16}', theirs._namespace)


def test_transformers_copies_every_carried_file(exported):
    """transformers follows `from .x import` lines to find a model's code (in a folder, and on the
    Hub, where it downloads the files so found): every .py file of the folder is reached."""
    from transformers.dynamic_module_utils import get_relative_import_files
    folder = exported['ha_shared_windows'][2]
    found = {Path(p).name for p in get_relative_import_files(folder / 'modeling_nanohfa.py')}
    assert found == {p.name for p in folder.glob('*.py')} - {'modeling_nanohfa.py'}


@pytest.mark.slow
def test_the_folder_opens_where_the_project_cannot_be_imported(exported, tmp_path):
    """A fresh process (python -I, in an empty folder, its own module cache): no project module is
    importable there, so the carried code alone builds the model."""
    names = ['layers', 'ha_shared_windows', 'sa']
    x = torch.randint(ENC.vocab_size, (2, 32), generator=torch.Generator().manual_seed(2))
    want = {}
    with torch.no_grad():
        for n in names:
            want[n] = exported[n][0](x, targets=x)[0]
    torch.save({'x': x, 'folders': {n: str(exported[n][2]) for n in names}}, tmp_path / 'job.pt')
    script = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
job = torch.load(sys.argv[1])
out = {}
for n, folder in job['folders'].items():
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    with torch.no_grad():
        out[n] = model(job['x']).logits
    ids = tokenizer('ROMEO:', return_tensors='pt')
    out[n + ' text'] = tokenizer.decode(model.generate(**ids, max_new_tokens=8, do_sample=False)[0])
own = ('model', 'nanohfa', 'attention_kernels')
out['project modules'] = sorted(m for m in sys.modules if m.split('.')[0] in own)
torch.save(out, sys.argv[2])
"""
    (tmp_path / 'work').mkdir()
    env = {**os.environ, 'HF_MODULES_CACHE': str(tmp_path / 'modules'), 'PYTHONPATH': str(ROOT)}
    r = subprocess.run([sys.executable, '-I', '-c', script, str(tmp_path / 'job.pt'), str(tmp_path / 'out.pt')],
                       cwd=tmp_path / 'work', capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(tmp_path / 'out.pt')
    assert got['project modules'] == []  # -I: not even PYTHONPATH reaches it
    for n in names:
        assert rel_diff(got[n], want[n]) <= 1e-6, n
        ids = torch.tensor([ENC.encode('ROMEO:')])
        assert got[n + ' text'] == ENC.decode(exported[n][0].generate(ids, 8, temperature=0)[0].tolist())
    cached = {p.name for p in (tmp_path / 'modules').rglob('*.py')}
    assert {p.name for p in exported['layers'][2].glob('*.py')} <= cached


# -----------------------------------------------------------------------------
# generation: sample.py's decoding

@pytest.mark.parametrize('name', [n for n in VARIANTS if n != 'non_causal'])
def test_generate_is_sample_pys_decoding(name, exported):
    """Greedy search is GPT.generate(temperature=0) (what sample.py runs), past block_size too (the
    context cropped, as model.py does; a GPT2LMHeadModel stops at its n_positions, as GPT-2); with
    the same seed, sampling with temperature and top_k draws the same tokens."""
    model, _, folder = exported[name]
    hf = load_hf(folder)
    prompt = torch.tensor([ENC.encode('ROMEO:\nBut')])
    n_new = model.config.block_size - prompt.size(1) if name in GPT2_SHAPED else model.config.block_size + 8
    want = model.generate(prompt, n_new, temperature=0)
    assert torch.equal(hf.generate(prompt, max_new_tokens=n_new, do_sample=False), want)
    torch.manual_seed(5)
    want = model.generate(prompt, n_new, temperature=0.8, top_k=10)
    assert len(set(want[0, prompt.size(1):].tolist())) > 3  # the text varies: a comparison of substance
    torch.manual_seed(5)
    assert torch.equal(hf.generate(prompt, max_new_tokens=n_new, do_sample=True, temperature=0.8, top_k=10), want)


@pytest.mark.slow
def test_sample_py_prints_what_generate_writes(exported):
    """sample.py on the checkpoint and on the folder (init_from) prints the text transformers'
    generate and the folder's tokenizer give."""
    from transformers import AutoTokenizer
    _, run, folder = exported['layers']
    prompt = 'ROMEO:\nBut, soft!'
    common = [f'--start={prompt}', '--temperature=0', '--max_new_tokens=40', '--device=cpu']
    runs = [subprocess.Popen([sys.executable, 'sample.py', *where, *common], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for where in ([f'--out_dir={run}'], [f'--init_from={folder}'])]
    outs = [p.communicate(timeout=300) for p in runs]
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    text = tokenizer.decode(load_hf(folder).generate(**tokenizer(prompt, return_tensors='pt'), max_new_tokens=40,
                                                     do_sample=False)[0])
    for p, (out, err) in zip(runs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.split('\n---------------')[0].endswith(text) and len(text) == len(prompt) + 40


def test_padding_is_refused_in_one_line(exported):
    hf = load_hf(exported['ha'][2])
    x = torch.tensor([[1, 2, 3], [0, 4, 5]])
    with pytest.raises(ValueError, match='no padding .* batch_size=1'):
        hf.generate(x, attention_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]), max_new_tokens=2)
    assert hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=2).shape == (2, 5)  # no zeros: fine


def test_labels_give_model_pys_loss_and_gradients(exported):
    """transformers' convention (labels shifted inside, -100 not scored) is model.py's loss, and
    the carried custom ops differentiate as the project's (HA's blockwise kernel is one)."""
    model, _, folder = exported['ha']
    hf = load_hf(folder).train()
    x = torch.randint(ENC.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    labels = x.clone()
    labels[:, 5] = -100
    targets = torch.cat([x[:, 1:], torch.full((2, 1), -1)], 1)
    targets[:, 4] = -1
    model.train().zero_grad()
    want = model(x, targets=targets)[1]
    want.backward()
    got = hf(x, labels=labels).loss
    got.backward()
    model.eval()
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    grads = dict(hf.named_parameters())
    for k, p in model.named_parameters():
        assert rel_diff(grads[f'gpt.{k}'].grad, p.grad) <= 1e-5, k


# -----------------------------------------------------------------------------
# the tokenizers

def test_the_character_tokenizer_encodes_as_ours(exported):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(exported['ha'][2], trust_remote_code=True)
    assert type(hf).__name__ in ('PreTrainedTokenizerFast', 'TokenizersBackend')
    texts = fixture_texts() + ['  two  spaces\n\nand lines\n']
    for t in texts:
        assert hf.encode(t) == ENC.encode(t)
        assert hf.decode(hf.encode(t)) == t
    assert hf.eos_token == '\n' and hf.bos_token is None  # the newline stands in for end-of-text, as in eval.py
    assert hf.encode('a\u00e9b') == ENC.encode('ab')  # a character the model never saw: dropped
    gpt2_shaped = AutoTokenizer.from_pretrained(exported['sa'][2])  # no code in that folder: nothing to trust
    assert gpt2_shaped.encode(texts[0]) == ENC.encode(texts[0])


def test_gpt2_bpe_encodes_as_tiktoken(exported_bpe):
    from transformers import AutoTokenizer
    enc = tok.GPT2Tokenizer()
    for name in ('sa', 'ha'):
        hf = AutoTokenizer.from_pretrained(exported_bpe[name][2], trust_remote_code=True)
        assert hf.eos_token_id == hf.bos_token_id == enc.eot and hf.model_max_length == 32
        for t in BPE_TEXTS + fixture_texts():
            assert hf.encode(t) == enc.encode(t), t
            assert hf.decode(hf.encode(t)) == t
    config = json.loads((exported_bpe['sa'][2] / 'config.json').read_text())
    assert config['model_type'] == 'gpt2' and config['vocab_size'] == 50304 and config['eos_token_id'] == enc.eot
    x = torch.tensor([enc.encode(BPE_TEXTS[-1])[:32]])
    for name in ('sa', 'ha'):
        model, _, folder = exported_bpe[name]
        with torch.no_grad():
            assert rel_diff(load_hf(folder)(x).logits, model(x, targets=x)[0]) <= 1e-6, name


# -----------------------------------------------------------------------------
# back into this codebase: init_from

@pytest.mark.parametrize('name', VARIANTS)
def test_init_from_reads_the_folder_back(name, exported):
    """The same weights, bit for bit, and the same model settings (the checkpoint's kernel setting
    too: the folder computes with PyTorch); the tokenizer record, so the data check still works."""
    _, run, folder = exported[name]
    assert checkpoint.init_kind(str(folder), ('scratch', 'resume', 'gpt2', 'file')) == 'file'
    a, b = checkpoint.load_checkpoint(run / 'ckpt.pt'), checkpoint.load_checkpoint(folder)
    assert GPTConfig(**b['model_args']) == GPTConfig(**a['model_args'])
    assert set(b['model']) == set(a['model'])
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])
    assert b['tokenizer'] == a['tokenizer'] and b['iter_num'] == a['iter_num']


def test_a_gpt2_folder_trained_in_transformers_keeps_its_biases(exported, tmp_path):
    """A GPT-2-shaped export of a model without biases holds zero biases; once transformers has
    trained them (save_pretrained again), init_from reads a model with biases, transformers' logits."""
    import shutil
    folder = tmp_path / 'tuned'
    shutil.copytree(exported['sa'][2], folder)
    hf = load_hf(folder)
    with torch.no_grad():
        hf.transformer.h[0].mlp.c_fc.bias.fill_(0.5)
    hf.save_pretrained(folder)
    ckpt = checkpoint.load_checkpoint(folder)
    assert ckpt['model_args']['bias'] is True
    model = checkpoint.model_from_checkpoint(ckpt, folder)
    x = torch.randint(ENC.vocab_size, (2, 32), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert rel_diff(model(x, targets=x)[0], hf(x).logits) <= 1e-6
    assert not checkpoint.load_checkpoint(exported['sa'][2])['model_args']['bias']  # untouched: none, as trained


def test_a_folder_saved_again_by_transformers_reads_back(exported, tmp_path):
    """A folder with code, loaded, changed (as fine-tuning would) and saved again by transformers
    (save_pretrained copies the carried code along): it opens again, and init_from reads the
    changed weights."""
    hf = load_hf(exported['layers'][2])
    with torch.no_grad():
        hf.gpt.transformer.h[2].attn.groups[0].c_attn.weight.mul_(0.5)
    hf.save_pretrained(tmp_path / 'again')
    assert {p.name for p in exported['layers'][2].glob('*.py')} <= {p.name for p in (tmp_path / 'again').glob('*.py')}
    x = torch.randint(ENC.vocab_size, (2, 32), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert rel_diff(load_hf(tmp_path / 'again')(x).logits, hf(x).logits) == 0
    ckpt = checkpoint.load_checkpoint(tmp_path / 'again')
    model = checkpoint.model_from_checkpoint(ckpt, tmp_path / 'again')
    with torch.no_grad():
        assert rel_diff(model(x, targets=x)[0], hf(x).logits) <= 1e-6
    assert ckpt['model_args']['attn_layers'] == 'sa,hfa_v1,ha' and ckpt['tokenizer'] == ENC.meta()


@pytest.fixture(scope='module')
def char_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp('hf_data')
    ids = np.array(ENC.encode('\n\n'.join(fixture_texts()) * 6), dtype=np.uint16)
    ids.tofile(folder / 'train.bin')
    ids[:1500].tofile(folder / 'val.bin')
    (folder / 'meta.json').write_text(json.dumps(ENC.meta()))
    return folder


TRAIN = ['--batch_size=4', '--block_size=32', '--device=cpu', '--gradient_accumulation_steps=1', '--eval_iters=2',
         '--eval_interval=3', '--log_interval=1', '--learning_rate=1e-2', '--warmup_iters=1', '--lr_decay_iters=6',
         '--dropout=0.1']  # the architecture is the checkpoint's


def train(data, out, *args):
    return subprocess.Popen([sys.executable, 'train.py', *TRAIN, f'--data_dir={data}', f'--out_dir={out}', *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, 'OMP_NUM_THREADS': '1'})


def finish(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return out


def losses(out_dir):
    return [(r['iter'], r['loss']) for r in map(json.loads, (out_dir / 'train_log.jsonl').read_text().splitlines())]


@pytest.mark.slow
def test_training_from_the_folder_continues_with_the_checkpoints_losses(char_data, tmp_path):
    """A checkpoint (HA: its code carried; SA: a GPT2LMHeadModel without its biases), exported, then
    trained on by train.py from the folder and from the checkpoint file: the same losses, step for
    step (dropout on, so its random stream is compared too)."""
    for v in ('ha_shared_windows', 'sa'):
        save_run(tiny(v), tmp_path / v / 'first')
        export_hf.main([f'--out_dir={tmp_path / v / "first"}', f'--to={tmp_path / v / "hf"}', '--skip_check'])
    assert (tmp_path / 'ha_shared_windows' / 'hf' / 'modeling_nanohfa.py').exists()
    assert not (tmp_path / 'sa' / 'hf' / 'modeling_nanohfa.py').exists()
    runs = {(v, src): train(char_data, tmp_path / v / src, '--max_iters=6', '--seed=7',
                            f'--init_from={tmp_path / v / ("hf" if src == "folder" else "first/ckpt.pt")}')
            for v in ('ha_shared_windows', 'sa') for src in ('folder', 'file')}
    for p in runs.values():
        finish(p)
    for v in ('ha_shared_windows', 'sa'):
        a, b = losses(tmp_path / v / 'folder'), losses(tmp_path / v / 'file')
        assert len(a) == 6 and a == b, v
        print(f"| {v} | {' '.join(f'{loss:.6f}' for _, loss in a)} |")


# -----------------------------------------------------------------------------
# lm-eval's own hf model on the folder: eval.py's metrics on the checkpoint

def metrics(results, task):
    return {k: v for k, v in results['results'][task].items() if isinstance(v, float) and 'stderr' not in k}


EVAL_NUMBERS = {}  # for the record (printed by -s)


@pytest.mark.parametrize('name', [n for n in VARIANTS if n != 'non_causal'])  # eval.py refuses non-causal models
def test_lm_evals_hf_model_on_the_folder_gives_eval_pys_metrics(name, exported):
    """lm-eval's `hf` model (what `lm_eval --model hf` runs) on the folder, and our `nanohfa` model
    on the checkpoint (what eval.py runs), over the local tasks: the same metrics, the same
    log-likelihood of every request and the same generated texts (the contexts are longer than
    block_size: both cut them from the left)."""
    from nanohfa import lm_eval_model  # first: it imports lm-eval and takes back the environment variables lm-eval sets
    from nanohfa import lm_eval_tasks
    import lm_eval
    _, run, folder = exported[name]
    names, manager = lm_eval_tasks.task_list([MC, TEXT, GEN], TASKS)
    run_tasks = lambda model, **kw: lm_eval.simple_evaluate(model=model, tasks=names, task_manager=manager,
                                                            verbosity='ERROR', log_samples=True, **kw)
    ours = run_tasks(lm_eval_model.NanoHFA(path=str(run), device='cpu', batch_size=4))
    theirs = run_tasks('hf', model_args=f'pretrained={folder},trust_remote_code=True,dtype=float32', device='cpu',
                       batch_size=1)
    worst = 0.0
    for task in names:
        a, b = metrics(ours, task), metrics(theirs, task)
        assert a.keys() == b.keys() and a, task
        for k in a:
            EVAL_NUMBERS[f'{name} {task} {k}'] = (a[k], b[k])
            assert b[k] == (a[k] if k.startswith(('acc', 'exact')) else pytest.approx(a[k], rel=1e-5)), (task, k)
        for sa, sb in zip(ours['samples'][task], theirs['samples'][task], strict=True):
            assert sa['arguments'] == sb['arguments']
            if task == GEN:
                assert sa['resps'] == sb['resps']  # the same text, cut at the same stop strings
            else:
                flat = lambda s: [float(x) for r in s['resps'] for x in (r[0] if isinstance(r[0], tuple) else r)]
                assert flat(sb) == pytest.approx(flat(sa), rel=1e-5, abs=1e-6)
                worst = max([worst] + [abs(x - y) / max(abs(x), 1e-9) for x, y in zip(flat(sa), flat(sb))])
    assert all(s['resps'][0][0] for s in theirs['samples'][GEN])  # generated text, not empty strings, compared
    print('\n'.join(f"| {k} | {a:.10g} | {b:.10g} |" for k, (a, b) in EVAL_NUMBERS.items() if k.startswith(name)))
    print(f"| {name} per-request log-likelihoods, largest relative difference | {worst:.1e} |")


@pytest.mark.slow
def test_lm_evals_cli_runs_on_the_folder(exported, tmp_path):
    """The command a user types, offline, with the local task YAMLs: eval.py's numbers."""
    from nanohfa import lm_eval_model  # noqa: F401  first: it takes back the environment variables lm-eval sets
    from nanohfa import lm_eval_tasks
    _, run, folder = exported['ha_shared_windows']
    env = {**os.environ, 'HF_MODULES_CACHE': str(tmp_path / 'modules')}
    r = subprocess.run([str(Path(sys.executable).parent / 'lm_eval'), '--model', 'hf', '--model_args',
                        f'pretrained={folder},trust_remote_code=True', '--tasks', f'{MC},{TEXT},{GEN}',
                        '--include_path', str(TASKS), '--device', 'cpu', '--output_path', str(tmp_path / 'out')],
                       cwd=tmp_path, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    cli = json.loads(next((tmp_path / 'out').rglob('results_*.json')).read_text())
    ours = lm_eval_tasks.evaluate(run, [MC, TEXT, GEN], TASKS, bar=False, device='cpu')
    for task in (MC, TEXT, GEN):
        a, b = metrics(ours, task), metrics(cli, task)
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == (a[k] if k.startswith(('acc', 'exact')) else pytest.approx(a[k], rel=1e-5)), (task, k)
    assert f'|{MC}' in r.stdout


# -----------------------------------------------------------------------------
# unhappy paths: one line, exit status 2, nothing lost

def test_export_refuses_bad_input_in_one_line(exported, tmp_path):
    _, run, folder = exported['ha']
    with pytest.raises(UserError, match=r'already exists; give another --to, or --overwrite'):
        export_hf.main([f'--out_dir={run}', f'--to={folder}'])
    (tmp_path / 'mine').mkdir()
    (tmp_path / 'mine' / 'notes.txt').write_text('keep me')
    with pytest.raises(UserError, match=r'--overwrite replaces only a folder export_hf.py wrote'):
        export_hf.main([f'--out_dir={run}', f'--to={tmp_path / "mine"}', '--overwrite'])
    assert (tmp_path / 'mine' / 'notes.txt').read_text() == 'keep me'
    with pytest.raises(UserError, match=r"--format=gpt2: this model is not GPT-2's shape \(its attention is ha"):
        export_hf.main([f'--out_dir={run}', f'--to={tmp_path / "x"}', '--format=gpt2'])
    with pytest.raises(UserError, match=r'no checkpoint at .*nothing/ckpt.pt; train first'):
        export_hf.main([f'--out_dir={tmp_path / "nothing"}', f'--to={tmp_path / "y"}'])
    with pytest.raises(UserError, match=r'give the checkpoint: --out_dir=RUN or --init_from=ckpt.pt \(one of them\)'):
        export_hf.main([f'--to={tmp_path / "z"}'])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['mine']  # no folder, no leftover work folder


def test_overwrite_replaces_an_earlier_export(exported, tmp_path):
    import shutil
    _, run, folder = exported['hfa_v2']
    to = tmp_path / 'again'
    shutil.copytree(exported['ha'][2], to)
    export_hf.main([f'--out_dir={run}', f'--to={to}', '--overwrite', '--skip_check'])
    assert json.loads((to / 'config.json').read_text())['attention'] == 'hfa_v2'
    assert (to / 'model.safetensors').read_bytes() == (folder / 'model.safetensors').read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['again']


def test_a_truncated_folder_is_refused_in_one_line(exported, tmp_path):
    import shutil
    folder = tmp_path / 'cut'
    shutil.copytree(exported['ha'][2], folder)
    weights = folder / 'model.safetensors'
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(UserError, match=r'the Hugging Face folder .*cut cannot be read \(SafetensorError.*export the '
                                        r'checkpoint again'):
        checkpoint.load_checkpoint(folder)
    weights.unlink()
    with pytest.raises(UserError, match=r'cannot be read \(FileNotFoundError'):
        checkpoint.load_checkpoint(folder)


def test_the_weights_have_the_permissions_of_the_folders_other_files(exported):
    folder = exported['ha'][2]
    assert (folder / 'model.safetensors').stat().st_mode == (folder / 'config.json').stat().st_mode


@pytest.mark.parametrize('where', ['absolute', 'parent'])
def test_an_index_that_names_a_file_outside_its_folder_is_refused_in_one_line(exported, tmp_path, where):
    """A sharded folder's index may only name shards beside it: weights elsewhere on the machine
    are never read as this model's."""
    import shutil
    folder = tmp_path / 'sharded'
    shutil.copytree(exported['ha'][2], folder)
    outside = tmp_path / 'elsewhere.safetensors'
    (folder / 'model.safetensors').rename(outside)
    name = str(outside) if where == 'absolute' else '../elsewhere.safetensors'
    from safetensors.torch import load_file
    (folder / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': {k: name for k in load_file(outside)}}))
    with pytest.raises(UserError, match=r"model.safetensors.index.json names '.*elsewhere.safetensors', which is not a "
                                        r"file of its folder"):
        checkpoint.load_checkpoint(folder)


def export_cmd(run, to, *extra):
    return [sys.executable, 'export_hf.py', f'--out_dir={run}', f'--to={to}', *extra]


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir())}


@pytest.mark.slow
def test_faults_leave_the_earlier_export_as_it_was(exported, tmp_path):
    """Real faults, each in its own process, all at once: the disk full while the weights are written
    (a file size limit, `ulimit -f`: EFBIG), transformers' module cache unusable for the check
    (HF_MODULES_CACHE under a file), and two exports into one new folder. Each failure is one line
    and exit 2; the earlier export stays byte for byte, and no work folder is left behind."""
    with torch.no_grad():  # weights of about 1 MB, past the size limit; the code files are not
        big = GPT(GPTConfig(**{**asdict(tiny('ha').config), 'n_embd': 128, 'n_head': 4}))
    run = save_run(big, tmp_path / 'run')
    to = tmp_path / 'hf'
    export_hf.main([f'--out_dir={run}', f'--to={to}', '--skip_check'])
    before = digest(to)
    (tmp_path / 'a_file').write_text('')
    start = lambda cmd, **env: subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                text=True, env={**os.environ, **env})
    faults = {
        'disk': start(['bash', '-c', 'ulimit -f 300; exec "$@"', 'bash', *export_cmd(run, to, '--overwrite')]),
        'cache': start(export_cmd(run, to, '--overwrite'), HF_MODULES_CACHE=str(tmp_path / 'a_file' / 'modules')),
    }
    shared = tmp_path / 'shared'
    race = [start(export_cmd(exported[n][1], shared, '--skip_check')) for n in ('ha', 'hfa_v1')]
    want = {'disk': r'^error: could not write .*hf \(File too large.*\); nothing was changed there',
            'cache': r'^error: transformers could not load the folder it was given .*HF_MODULES_CACHE=.*a_file/modules '
                     r'must be a writable folder'}
    for k, p in faults.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 2, (k, err[-2000:])
        assert re.search(want[k], err) and err.count('\n') == 1, (k, err)
        assert digest(to) == before, k
    # the two exports into one new folder: one writes it, the other says so (it saw the folder at its
    # start, or only when it came to move its own into place)
    results = [(p.wait(timeout=300), *p.communicate()) for p in race]
    assert sorted(r[0] for r in results) == [0, 2], results
    loser = next(r for r in results if r[0] == 2)
    assert re.search(r'^error: --to=.*shared (already exists|was created by another process while this export ran)',
                     loser[2]) and loser[2].count('\n') == 1, loser[2]
    winner = 'ha' if results[0][0] == 0 else 'hfa_v1'
    assert json.loads((shared / 'config.json').read_text())['attention'] == winner
    assert (shared / 'model.safetensors').read_bytes() == (exported[winner][2] / 'model.safetensors').read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a_file', 'hf', 'run', 'shared']
