"""nanoGPT's checkpoints work here: our GPT built from one gives nanoGPT's logits, and train.py
resumes one (model, optimizer, iteration), starts a new run from its weights, and sample.py
samples from it, with the tokenizer of its data given by --meta (a nanoGPT checkpoint carries
none). tests/fixtures/nanogpt_ckpt.pt was written by nanoGPT's own model code in its train.py's
format (tests/fixtures/make_nanogpt_checkpoint.py). The runs start together.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nanohfa import checkpoint

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
NANO = Path(__file__).resolve().parent / 'fixtures' / 'nanogpt_ckpt.pt'
ON_CPU = ['--device=cpu', '--dtype=float32', '--compile=False']  # the fixture was trained on a GPU
SAMPLE = ['--device=cpu', '--max_new_tokens=12', '--start=abc']


def test_nanogpt_checkpoint_gives_nanogpt_logits():
    """Parameter names with '_orig_mod.' and nanoGPT's attn.c_attn map onto ours: the same logits,
    and its optimizer state loads (the same parameter order and shapes)."""
    ckpt = checkpoint.load_checkpoint(NANO)
    expected = torch.load(NANO.parent / 'nanogpt_logits.pt', weights_only=True)
    model = checkpoint.model_from_checkpoint(ckpt, 'nanogpt_ckpt.pt').eval()
    with torch.no_grad():
        logits, _ = model(expected['idx'], expected['idx'])
    torch.testing.assert_close(logits, expected['logits'], rtol=0, atol=1e-6)
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.99), 'cpu')
    optimizer.load_state_dict(ckpt['optimizer'])


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """train.py and sample.py on the fixture, every run started at once: {name: (rc, stdout, stderr)}."""
    tmp = tmp_path_factory.mktemp('nanogpt')
    chars = tmp / 'chars'  # the fixture's data: 16 characters
    chars.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 16, 3000).astype(np.uint16).tofile(chars / 'train.bin')
    rng.integers(0, 16, 1500).astype(np.uint16).tofile(chars / 'val.bin')
    (chars / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16,
                                                 'itos': list('abcdefghijklmnop')}))
    (tmp / 'resume').mkdir()  # nanoGPT's out_dir: its ckpt.pt alone
    shutil.copy(NANO, tmp / 'resume' / 'ckpt.pt')
    ckpt = torch.load(NANO, weights_only=True)
    ckpt['config']['dataset'] = str(chars)  # nanoGPT's sample.py reads data/<dataset>/meta.pkl
    torch.save(ckpt, tmp / 'with_dataset.pt')
    commands = {
        'resume': ['train.py', f'--out_dir={tmp / "resume"}', '--init_from=resume', f'--data_dir={chars}',
                   '--max_iters=5', '--eval_interval=5', '--eval_iters=2', '--always_save_checkpoint=True', *ON_CPU],
        'new_run': ['train.py', f'--init_from={NANO}', f'--out_dir={tmp / "new_run"}', f'--data_dir={chars}',
                    '--max_iters=2', '--eval_interval=2', '--eval_iters=2', '--batch_size=4', '--block_size=16',
                    '--gradient_accumulation_steps=1', *ON_CPU],
        'sample': ['sample.py', f'--init_from={tmp / "with_dataset.pt"}', *SAMPLE],
        'sample_meta': ['sample.py', f'--init_from={NANO}', f'--meta={chars}', *SAMPLE],
        'sample_meta_file': ['sample.py', f'--init_from={NANO}', f'--meta={chars / "meta.json"}', *SAMPLE],
    }
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = {name: subprocess.Popen([PY, *cmd], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE) for name, cmd in commands.items()}
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        out[name] = (p.returncode, stdout, stderr)
    return {'dir': tmp, **out}


def sampled_text(stdout):
    return stdout.split('---------------')[0].strip().splitlines()[-1]


@pytest.mark.slow
def test_nanogpt_checkpoint_resumes(runs):
    rc, stdout, stderr = runs['resume']
    assert rc == 0, stderr
    assert 'a nanoGPT checkpoint: model, optimizer and iteration continue' in stdout
    log = [json.loads(l) for l in (runs['dir'] / 'resume' / 'train_log.jsonl').read_text().splitlines() if l.strip()]
    assert [s['iter'] for s in log] == [3, 4]
    assert torch.load(runs['dir'] / 'resume' / 'ckpt.pt', weights_only=True)['iter_num'] == 5


@pytest.mark.slow
def test_nanogpt_checkpoint_starts_a_new_run(runs):
    rc, stdout, stderr = runs['new_run']
    assert rc == 0, stderr
    log = [json.loads(l) for l in (runs['dir'] / 'new_run' / 'train_log.jsonl').read_text().splitlines() if l.strip()]
    assert [s['iter'] for s in log] == [0, 1]
    assert torch.load(runs['dir'] / 'new_run' / 'ckpt.pt', weights_only=True)['model_args']['n_layer'] == 2


@pytest.mark.slow
@pytest.mark.parametrize('run', ['sample', 'sample_meta', 'sample_meta_file'])
def test_nanogpt_checkpoint_samples(runs, run):
    """With its dataset's meta found as nanoGPT's sample.py finds it (data/<dataset>), or given by
    --meta (the dataset folder or its meta file) for a dataset not there (or another corpus of
    the same name: refused, tests/test_bad_inputs.py)."""
    rc, stdout, stderr = runs[run]
    assert rc == 0 and not stderr, stderr
    text = sampled_text(stdout)
    assert text.startswith('abc') and len(text) == 15 and set(text) <= set('abcdefghijklmnop')
