"""sample.py on a checkpoint of ours: --temperature=0 decodes greedily (the seed plays no part),
and nanoGPT's dtype and compile keys are accepted (compile with a note: sampling runs eagerly).
A tiny run on a random character dataset, then the samples started together. (nanoGPT's
checkpoints: tests/test_nanogpt_checkpoints.py; the cached and uncached decoding agree:
tests/test_attention.py.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # train.py and sample.py in subprocesses

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SAMPLE = ['sample.py', '--device=cpu', '--max_new_tokens=12', '--start=abc']


@pytest.fixture(scope='module')
def samples(tmp_path_factory):
    """{name: (rc, stdout, stderr)} of sample.py runs on one tiny trained checkpoint."""
    tmp = tmp_path_factory.mktemp('sample')
    rng = np.random.default_rng(0)
    rng.integers(0, 16, 3000).astype(np.uint16).tofile(tmp / 'train.bin')
    rng.integers(0, 16, 600).astype(np.uint16).tofile(tmp / 'val.bin')
    (tmp / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16,
                                               'itos': list('abcdefghijklmnop')}))
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    out = tmp / 'run'
    r = subprocess.run([PY, 'train.py', '--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=32',
                        '--block_size=16', '--batch_size=4', '--gradient_accumulation_steps=1', '--eval_iters=2',
                        '--eval_interval=4', '--max_iters=4', '--lr_decay_iters=4', '--warmup_iters=1',
                        f'--data_dir={tmp}', f'--out_dir={out}'],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    commands = {'greedy1': ['--temperature=0', '--seed=1'], 'greedy2': ['--temperature=0', '--seed=2'],
                'nanogpt_keys': ['--dtype=bfloat16', '--compile=True']}
    procs = {name: subprocess.Popen([PY, *SAMPLE, f'--out_dir={out}', *args], cwd=ROOT, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, args in commands.items()}
    result = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        result[name] = (p.returncode, stdout, stderr)
    return result


def test_temperature_zero_is_greedy(samples):
    (rc1, a, err1), (rc2, b, err2) = samples['greedy1'], samples['greedy2']
    assert rc1 == 0 and rc2 == 0, (err1, err2)
    text = lambda out: out.split("Overriding: seed = ")[1].split('\n', 1)[1]
    assert text(a) == text(b) and text(a).startswith('abc')  # no sampling: the seed plays no part


def test_sample_accepts_nanogpts_dtype_and_compile(samples):
    rc, stdout, stderr = samples['nanogpt_keys']
    assert rc == 0, stderr
    assert stderr.strip() == "note: compile=True is accepted for nanoGPT's command lines; sampling runs eagerly"
    assert stdout.split('---------------')[0].strip().splitlines()[-1].startswith('abc')
