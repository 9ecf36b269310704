"""
FSDP2 sharding (train.py --parallel=fsdp) and activation checkpointing (--activation_checkpointing=True).

In process (fast): activation checkpointing leaves the loss and every gradient bit for bit as
they were (dropout included: the recomputation replays the same masks) and keeps fewer
tensors for the backward.

Under torchrun (slow; 2 CPU processes, gloo, a 2-layer 32-wide GPT, OMP_NUM_THREADS=1):
- FSDP, DDP and one process train the same losses, for sa and ha (|difference| <= 1e-5, the
  tolerance of DDP against one process in test_foundation.py: the processes sum gradients in
  another order, and FSDP takes the gradient norm as a sum over shards);
- activation checkpointing changes no loss under FSDP and DDP, with dropout 0.1: bit for bit;
- torch.compile of the sharded model (ha, custom ops) trains the eager losses (within 1e-4);
  dtype=bfloat16 (mixed precision) trains near fp32's losses (within 0.02) and saves fp32;
- FSDP resume is exact: rank 1 SIGKILLs itself at iteration 10, the run resumes from the
  iteration-8 checkpoint, and every loss and evaluation equals the uninterrupted run's bit for bit;
  the same after SIGTERM (both processes finish step 5, save iteration 6 together and exit 0);
- an FSDP checkpoint is an ordinary ckpt.pt: the DDP run's tensors, the same keys; sample.py
  draws the same tokens from it as from the DDP one; interactions.py reads the same
  coefficients; one process resumes it (parallel='fsdp' inherited from the checkpoint: the
  one process trains it whole) on the same losses as the 1-process run's own checkpoint.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--device=cpu', '--eval_iters=2', '--eval_interval=4',
        '--warmup_iters=2', '--lr_decay_iters=12', '--learning_rate=1e-2', '--log_interval=1000', '--ddp_timeout=60']
EVAL_KEYS = ('iter', 'train_loss', 'val_loss', 'val_ppl', 'lr', 'tokens', 'skipped_steps', 'params')


# -----------------------------------------------------------------------------
# in process: activation checkpointing recomputes exactly

@pytest.mark.parametrize('attention', ['sa', 'ha'])
def test_activation_checkpointing_recomputes_exactly_and_keeps_less(attention):
    cfg = GPTConfig(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1, attention=attention)
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, 16, (4, 16), generator=torch.Generator().manual_seed(1))
    rng = torch.get_rng_state()
    results = {}
    for ac in (False, True):
        model.activation_checkpointing = ac
        model.zero_grad(set_to_none=True)
        saved = []
        torch.manual_seed(2)  # the same dropout masks for both
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            _, loss = model(x, x)
        loss.backward()
        results[ac] = loss.detach(), [p.grad.clone() for p in model.parameters()], sum(saved)
    torch.set_rng_state(rng)
    (loss0, grads0, kept0), (loss1, grads1, kept1) = results[False], results[True]
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1))
    assert kept1 < kept0 / 2, (kept0, kept1)  # only each block's input (and the head's) is kept
    model.activation_checkpointing = True
    model.eval()
    with torch.no_grad():  # evaluation and sampling never checkpoint (no backward to save for)
        assert torch.equal(model(x, x)[1], model.__class__.forward(model, x, x)[1])
        assert model.generate(x[:, :4], 3, temperature=0).shape == (4, 7)


# -----------------------------------------------------------------------------
# under torchrun

def make_data(folder, n_train=3000, n_val=600):
    import numpy as np
    folder.mkdir(parents=True, exist_ok=True)
    itos = list("abcdefghijklmnop")
    rng = np.random.default_rng(0)
    rng.integers(0, len(itos), n_train).astype(np.uint16).tofile(folder / 'train.bin')
    rng.integers(0, len(itos), n_val).astype(np.uint16).tofile(folder / 'val.bin')
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': len(itos), 'itos': itos}))
    return folder


def env(**extra):
    e = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1', **extra}
    if 'NANOHFA_TEST_DIE_AT' not in extra:
        e.pop('NANOHFA_TEST_DIE_AT', None)
    return e


def launch(log, args, nproc=1, script='train.py', **extra_env):
    hooks = ['tests/train_hooks.py'] if 'NANOHFA_TEST_DIE_AT' in extra_env else []
    launcher = [PY, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}'] if nproc > 1 else [PY]
    return subprocess.Popen([*launcher, *hooks, script, *map(str, args)], cwd=ROOT, env=env(**extra_env),
                            stdout=open(log, 'w'), stderr=subprocess.STDOUT, start_new_session=True)


def run_all(jobs, tmp, at_once=3):
    """Start the jobs {name: (args, nproc, script, env)} a few at a time; {name: (rc, log text)}."""
    pending, running, done, t0 = list(jobs), {}, {}, time.time()
    while pending or running:
        while pending and len(running) < at_once:
            name = pending.pop(0)
            args, nproc, script, extra = jobs[name]
            running[name] = launch(tmp / f'{name}.log', args, nproc, script, **extra)
        for name, p in list(running.items()):
            if p.poll() is None and time.time() - t0 > 900:
                os.killpg(p.pid, signal.SIGKILL)
            if p.poll() is not None:
                done[name] = (p.returncode, (tmp / f'{name}.log').read_text())
                del running[name]
        time.sleep(0.1)
    return done


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def losses(out):
    return [(r['iter'], r['loss']) for r in jsonl(out / 'train_log.jsonl')]


def evals(out):
    return [tuple(r[k] for k in EVAL_KEYS) for r in jsonl(out / 'log.jsonl')]


def load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('fsdp')
    data = make_data(tmp / 'data')
    o = lambda name: tmp / name
    train = lambda name, iters, *more: [*TINY, f'--data_dir={data}', f'--out_dir={o(name)}', f'--max_iters={iters}', *more]
    fsdp, ac, drop = '--parallel=fsdp', '--activation_checkpointing=True', '--dropout=0.1'
    jobs = {
        'sa_one': (train('sa_one', 8), 1, 'train.py', {}),
        'sa_ddp': (train('sa_ddp', 8), 2, 'train.py', {}),
        'sa_fsdp': (train('sa_fsdp', 8, fsdp), 2, 'train.py', {}),
        'ha_one': (train('ha_one', 8, '--attention=ha'), 1, 'train.py', {}),
        'ha_ddp': (train('ha_ddp', 8, '--attention=ha'), 2, 'train.py', {}),
        'ha_fsdp': (train('ha_fsdp', 8, '--attention=ha', fsdp), 2, 'train.py', {}),
        'drop_fsdp': (train('drop_fsdp', 12, drop, fsdp), 2, 'train.py', {}),
        'drop_fsdp_ac': (train('drop_fsdp_ac', 12, drop, fsdp, ac), 2, 'train.py', {}),
        'drop_ddp': (train('drop_ddp', 8, drop), 2, 'train.py', {}),
        'drop_ddp_ac': (train('drop_ddp_ac', 8, drop, ac), 2, 'train.py', {}),
        'ha_fsdp_compile': (train('ha_fsdp_compile', 4, '--attention=ha', fsdp, '--compile=True'), 2, 'train.py', {}),
        'sa_fsdp_bf16': (train('sa_fsdp_bf16', 8, fsdp, '--dtype=bfloat16', ac), 2, 'train.py', {}),
        # rank 1 SIGKILLs itself at the start of iteration 10; the last checkpoint is iteration 8's
        'kill': (train('kill', 12, drop, fsdp), 2, 'train.py', {'NANOHFA_TEST_DIE_AT': '10:1'}),
        # rank 0 sends itself SIGTERM during step 5: both processes stop at 6 and save together
        'term': (train('term', 12, drop, fsdp), 2, 'train.py', {'NANOHFA_TEST_DIE_AT': '5:0:term'}),
    }
    r = run_all(jobs, tmp)
    state = {f'{k}_ckpt_iter': load(o(k) / 'ckpt.pt')['iter_num'] if (o(k) / 'ckpt.pt').exists() else None
             for k in ('kill', 'term')}
    sample = ['--device=cpu', '--start=abc', '--max_new_tokens=40', '--num_samples=2']
    read = ['--figures=False', '--min_freq=0', f'--data_dir={data}']
    resume = '--init_from=resume'
    for k in ('sa_fsdp', 'sa_one'):  # resumed in copies: the checkpoints at iteration 8 are compared below
        shutil.copytree(o(k), o(f'{k}_resumed'))
    jobs2 = {
        'kill2': (train('kill', 12, resume), 2, 'train.py', {}),
        'term2': (train('term', 12, resume), 2, 'train.py', {}),
        'sa_fsdp_one': (train('sa_fsdp_resumed', 12, resume), 1, 'train.py', {}),  # an FSDP checkpoint, one process
        'sa_one2': (train('sa_one_resumed', 12, resume), 1, 'train.py', {}),
        **{f'sample_{k}_{t}': ([f'--out_dir={o(k)}', *sample, f'--temperature={t}'], 1, 'sample.py', {})
           for k in ('sa_fsdp', 'sa_ddp') for t in (0, 1)},
        **{f'read_{k}': ([f'--out_dir={o(k)}', *read], 1, 'interactions.py', {}) for k in ('ha_fsdp', 'ha_ddp')},
    }
    r.update(run_all(jobs2, tmp, at_once=4))
    return {'rc': {k: v[0] for k, v in r.items()}, 'log': {k: v[1] for k, v in r.items()}, 'out': o, **state}


def ok(runs, *names):
    for name in names:
        assert runs['rc'][name] == 0, f"{name}:\n{runs['log'][name][-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize('attention', ['sa', 'ha'])
def test_fsdp_trains_the_losses_of_ddp_and_of_one_process(runs, attention):
    one, ddp, fsdp = (f'{attention}_{k}' for k in ('one', 'ddp', 'fsdp'))
    ok(runs, one, ddp, fsdp)
    assert '2 processes, FSDP)' in runs['log'][fsdp]
    a, b, c = (losses(runs['out'](k)) for k in (one, ddp, fsdp))
    assert [i for i, _ in c] == list(range(8))
    for x, y, z in zip(a, b, c):
        assert z[1] == pytest.approx(y[1], abs=1e-5) and z[1] == pytest.approx(x[1], abs=1e-5), (x, y, z)
    for x, z in zip(evals(runs['out'](one)), evals(runs['out'](fsdp))):
        assert z[0] == x[0] and z[2] == pytest.approx(x[2], abs=1e-5)  # val_loss


@pytest.mark.slow
def test_fsdp_compiles(runs):
    """torch.compile of the sharded model, HA's custom ops included: the eager run's losses."""
    ok(runs, 'ha_fsdp_compile', 'ha_fsdp')
    assert 'compiling the model' in runs['log']['ha_fsdp_compile']
    a, b = losses(runs['out']('ha_fsdp_compile')), losses(runs['out']('ha_fsdp'))[:4]
    assert [i for i, _ in a] == [0, 1, 2, 3] and [x[1] for x in a] == pytest.approx([x[1] for x in b], abs=1e-4)


@pytest.mark.slow
def test_fsdp_mixed_precision(runs):
    """dtype=bfloat16 (CPU autocast here, as on a GPU): bf16 weights gathered for compute, fp32
    gradients reduced; the losses near fp32's, the checkpoint's weights and moments fp32."""
    ok(runs, 'sa_fsdp_bf16', 'sa_fsdp')
    a, b = losses(runs['out']('sa_fsdp_bf16')), losses(runs['out']('sa_fsdp'))
    assert [x[1] for x in a] == pytest.approx([x[1] for x in b], abs=0.02) and a != b
    ckpt = load(runs['out']('sa_fsdp_bf16') / 'ckpt.pt')
    assert {v.dtype for v in ckpt['model'].values()} == {torch.float32}
    assert {v.dtype for s in ckpt['optimizer']['state'].values() for v in s.values()} == {torch.float32}


@pytest.mark.slow
@pytest.mark.parametrize('parallel', ['fsdp', 'ddp'])
def test_activation_checkpointing_changes_no_loss(runs, parallel):
    ref, ac = f'drop_{parallel}', f'drop_{parallel}_ac'
    ok(runs, ref, ac)
    assert 'activation checkpointing' in runs['log'][ac] and 'activation checkpointing' not in runs['log'][ref]
    assert losses(runs['out'](ac)) == losses(runs['out'](ref))  # bit for bit, dropout 0.1 included
    assert evals(runs['out'](ac)) == evals(runs['out'](ref))


@pytest.mark.slow
def test_fsdp_resume_after_sigkill_is_exact(runs):
    assert runs['rc']['kill'] != 0 and runs['kill_ckpt_iter'] == 8, runs['log']['kill'][-3000:]
    ok(runs, 'drop_fsdp', 'kill2')
    assert 'at iteration 8' in runs['log']['kill2']
    ref, kill = runs['out']('drop_fsdp'), runs['out']('kill')
    assert [i for i, _ in losses(kill)] == list(range(12))
    assert losses(kill) == losses(ref)
    assert evals(kill) == evals(ref)
    assert load(kill / 'ckpt.pt')['iter_num'] == 12


@pytest.mark.slow
def test_fsdp_sigterm_saves_and_resumes_exactly(runs):
    ok(runs, 'term', 'term2', 'drop_fsdp')
    assert 'stopped by signal at iteration 6; checkpoint saved' in runs['log']['term'] and runs['term_ckpt_iter'] == 6
    assert 'Traceback' not in runs['log']['term'] and 'at iteration 6' in runs['log']['term2']
    term, ref = runs['out']('term'), runs['out']('drop_fsdp')
    assert losses(term) == losses(ref) and evals(term) == evals(ref)


@pytest.mark.slow
def test_fsdp_checkpoint_is_our_format(runs):
    """The full state gathered to rank 0: the keys, shapes and dtypes of the DDP run's checkpoint,
    the optimizer keyed by position as optimizer.state_dict() keys it, equal values."""
    ok(runs, 'sa_fsdp', 'sa_ddp')
    a, b = load(runs['out']('sa_fsdp') / 'ckpt.pt'), load(runs['out']('sa_ddp') / 'ckpt.pt')
    assert a.keys() == b.keys() and a['model'].keys() == b['model'].keys()
    for k, v in b['model'].items():
        assert a['model'][k].dtype == v.dtype and torch.allclose(a['model'][k], v, atol=1e-6), k
    oa, ob = a['optimizer'], b['optimizer']
    assert oa['param_groups'] == ob['param_groups'] and oa['state'].keys() == ob['state'].keys()
    for i, s in ob['state'].items():
        assert oa['state'][i].keys() == s.keys()
        assert all(torch.allclose(oa['state'][i][k], s[k], atol=1e-6) for k in s)
    assert a['config']['parallel'] == 'fsdp' and a['iter_num'] == b['iter_num'] == 8


@pytest.mark.slow
@pytest.mark.parametrize('temperature', [0, 1])
def test_fsdp_checkpoint_samples_the_tokens_of_the_ddp_one(runs, temperature):
    fsdp, ddp = f'sample_sa_fsdp_{temperature}', f'sample_sa_ddp_{temperature}'
    ok(runs, fsdp, ddp)
    text = lambda log: log.split("Overriding: temperature", 1)[1].split('\n', 1)[1]
    assert len(text(runs['log'][fsdp])) > 80 and text(runs['log'][fsdp]) == text(runs['log'][ddp])


def close(a, b, tol):
    """Two JSON values equal, numbers within tol."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= tol
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return a == b


@pytest.mark.slow
def test_interactions_reads_an_fsdp_checkpoint(runs):
    ok(runs, 'read_ha_fsdp', 'read_ha_ddp')
    a, b = (json.loads((runs['out'](k) / 'interactions' / 'interactions.json').read_text())['heads']
            for k in ('ha_fsdp', 'ha_ddp'))
    assert len(a) == 2 and close(a, b, 1e-4)


@pytest.mark.slow
def test_one_process_resumes_an_fsdp_checkpoint(runs):
    """The checkpoint's parallel='fsdp' is inherited, not an error: one process trains it whole."""
    ok(runs, 'sa_fsdp_one', 'sa_one2')
    assert '1 process)' in runs['log']['sa_fsdp_one'] and 'at iteration 8' in runs['log']['sa_fsdp_one']
    a, b = losses(runs['out']('sa_fsdp_resumed')), losses(runs['out']('sa_one_resumed'))
    assert [i for i, _ in a] == list(range(12))
    assert [x[1] for x in a] == pytest.approx([x[1] for x in b], abs=1e-5)
