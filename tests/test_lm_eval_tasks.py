"""lm-eval tasks on our checkpoints beyond the model itself (lm_eval_tasks.py, eval.py, compare.py
--eval_tasks), offline over the local tasks in tests/fixtures/lm_eval_tasks:
- tags expand to their tasks, a group to its own aggregate where it has one, else to its tasks;
- a task that fails on a run costs its cells and one line, never the grid's summary;
- each run's results are reused under a key that changes with the task YAML, lm-eval's version
  and the model arguments;
- the held-out bits per byte are the same for one file, our shards, headered and uint32 shards;
- two processes under torchrun give the numbers of one; --output_path is a folder or a .json file."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nanohfa import lm_eval_tasks
from nanohfa.errors import UserError
from test_lm_eval import ENC, GEN, MC, TASKS, TEXT, fixture_texts, save_run, tiny

ROOT = Path(__file__).resolve().parents[1]
ODD = 'nanohfa_tiny_odd'  # a document with a character the tiny models lack
pytestmark = pytest.mark.usefixtures('one_thread')


def char_data(folder):
    """A character dataset of the fixture texts (val.bin, meta.json): one byte per token."""
    folder.mkdir(parents=True)
    ids = np.array(ENC.encode('\n\n'.join(fixture_texts()) * 4), dtype=np.uint16)
    ids.tofile(folder / 'train.bin')
    ids[:2000].tofile(folder / 'val.bin')
    (folder / 'meta.json').write_text(json.dumps(ENC.meta()))
    return folder


def one_run_grid(tmp_path, tasks, model_args='', include_path=TASKS):
    """compare.py's arguments and rows for a grid of one finished run (sa, seed 0), its checkpoint saved."""
    save_run(tiny('sa'), tmp_path / 'grid' / 'runs' / 'sa' / 'seed0')
    data = char_data(tmp_path / 'data')
    args = SimpleNamespace(eval_tasks=tasks, eval_include_path=str(include_path), eval_limit=None,
                           eval_model_args=model_args, out=str(tmp_path / 'grid'))
    rows = [{'variant': 'sa', 'n_seeds': 1, 'config': {'data_dir': str(data), 'dataset': ''},
             'runs': [{'seed': 0, 'val_loss': 2.0}], 'val_loss_mean': 2.0, 'val_loss_std': float('nan')}]
    return args, rows


def saved(tmp_path):
    return json.loads((tmp_path / 'grid' / 'runs' / 'sa' / 'seed0' / lm_eval_tasks.RESULTS).read_text())


# -----------------------------------------------------------------------------
# what a name evaluates

def test_tags_and_groups_expand_to_their_tasks_or_the_groups_own_aggregate(tmp_path):
    """A tag: a column per task. A group with an aggregate (acc over both tasks' documents): its own
    column, not its tasks'. A group without one: its tasks' columns."""
    args, rows = one_run_grid(tmp_path, 'nanohfa_tiny_tag,nanohfa_tiny_group,nanohfa_tiny_bundle')
    table = lm_eval_tasks.grid_table(args, rows)
    r = rows[0]
    columns = [k[:-len(' mean')] for k in r if k.endswith(' mean') and k != 'val_loss_mean']
    assert columns == ['val bits/byte', f'{MC} acc_norm', f'{TEXT} bits_per_byte', 'nanohfa_tiny_group acc',
                       'nanohfa_tiny_mc_then acc', f'{GEN} exact_match']
    res = saved(tmp_path)['results']
    assert r['nanohfa_tiny_group acc mean'] == pytest.approx(
        (res[MC]['acc,none'] + res['nanohfa_tiny_mc_then']['acc,none']) / 2)  # 7 documents each
    header = table.splitlines()[2]
    assert '| nanohfa_tiny_group acc | Δ vs SA |' in header and 'nanohfa_tiny_bundle' not in header
    assert not r['eval_failed']


# -----------------------------------------------------------------------------
# a task that fails

def test_a_failing_task_costs_its_cells_and_one_line(tmp_path):
    args, rows = one_run_grid(tmp_path, f'{MC},{ODD}')
    table = lm_eval_tasks.grid_table(args, rows)
    r = rows[0]
    assert [x['task'] for x in r['eval_failed']] == [ODD]
    assert "'1€' are not in this model's character vocabulary" in r['eval_failed'][0]['error']
    assert r[f'{MC} acc_norm n'] == 1 and r[f'{ODD} n'] == 0
    lines = table.splitlines()
    assert lines[-2] == 'lm-eval FAILED (1), those cells left out:'
    assert lines[-1].startswith(f'- sa seed 0, {ODD}: characters') and '\n' not in r['eval_failed'][0]['error']
    assert lines[4].endswith('| - | - |')  # the failed task's cell and its Δ
    assert ODD not in saved(tmp_path)['nanohfa']['units']  # not kept: tried again next time


@pytest.mark.slow
def test_a_failing_task_leaves_the_grids_summary_written(tmp_path, capsys):
    """compare.py --eval_tasks with a task that fails on every run: results.json, results.csv,
    results.md and the plot are written with the other task's numbers, the failure is one line per
    run, the exit status 1; --eval_model_args reaches the model."""
    import compare
    from test_lm_eval import TINY
    data = char_data(tmp_path / 'data')
    (tmp_path / 'tiny.py').write_text(TINY)
    out = tmp_path / 'grid'
    argv = ['--config', str(tmp_path / 'tiny.py'), f'--data_dir={data}', '--variants', 'sa,hfa', '--seeds', '1',
            '--out', str(out), '--jobs', '2', '--threads', '1', '--eval_tasks', f'{MC},{ODD}',
            '--eval_include_path', str(TASKS), '--eval_limit', '3', '--eval_model_args', 'batch_size=2,dtype=float32']
    assert compare.main(argv) == 1
    printed = capsys.readouterr().out
    for name in ('results.json', 'results.csv', 'results.md', 'compare.png'):
        assert (out / name).is_file(), name
    rows = {r['variant']: r for r in json.loads((out / 'results.json').read_text())}
    assert set(rows) == {'sa', 'hfa'} and all(r['n_seeds'] == 1 for r in rows.values())
    assert all(r[f'{MC} acc_norm n'] == 1 and [x['task'] for x in r['eval_failed']] == [ODD] for r in rows.values())
    md = (out / 'results.md').read_text()
    assert '| sa |' in md and f'{MC} acc_norm' in md and f'- hfa seed 0, {ODD}: characters' in md
    assert 'lm-eval FAILED (2)' in printed
    record = json.loads((out / 'runs' / 'sa' / 'seed0' / lm_eval_tasks.RESULTS).read_text())['nanohfa']
    assert record['model_args']['batch_size'] == 2 and record['limit'] == 3


def test_model_args_are_checked_in_one_line():
    assert lm_eval_tasks.parse_model_args('batch_size=4,unknown_chars=drop')['batch_size'] == 4
    with pytest.raises(UserError, match=r"unknown key\(s\) batch \(batch: did you mean batch_size\?\); valid: meta, "):
        lm_eval_tasks.parse_model_args('batch=4')
    with pytest.raises(UserError, match=r"unknown_chars='keep'; valid: error, drop"):
        lm_eval_tasks.parse_model_args('unknown_chars=keep')
    with pytest.raises(UserError, match=r"batch_size=0 must be a whole number >= 1"):
        lm_eval_tasks.parse_model_args('batch_size=0')


# -----------------------------------------------------------------------------
# the cache of results

def test_the_cache_misses_when_the_task_yaml_lm_evals_version_or_the_model_args_change(tmp_path, capsys,
                                                                                      monkeypatch):
    from lm_eval.tasks import TaskManager
    tasks = tmp_path / 'tasks'
    shutil.copytree(TASKS, tasks)
    run_dir = save_run(tiny('sa'), tmp_path / 'run')
    request = {'include_path': str(tasks), 'limit': 2, 'num_fewshot': None}
    model_args = lm_eval_tasks.parse_model_args('')

    def evaluated(args=model_args):  # a fresh index, as a new compare.py process builds
        manager = TaskManager(include_path=str(tasks), include_defaults=False)
        units = {MC: lm_eval_tasks.build_unit(MC, manager)}
        res, failed = lm_eval_tasks.evaluate_run(run_dir, units, manager, request, args, 'sa seed 0')
        assert not failed and 'acc,none' in res['results'][MC]
        return 'lm-eval: sa seed 0' in capsys.readouterr().out

    assert evaluated() and not evaluated()  # the second time: reused
    yaml = tasks / 'tiny_mc.yaml'
    yaml.write_text(yaml.read_text().replace('doc_to_text: "{{question}}"', 'doc_to_text: "{{question}} "'))
    assert evaluated() and not evaluated()
    monkeypatch.setattr(lm_eval_tasks.lm_eval, '__version__', '0.4.99')
    assert evaluated() and not evaluated()
    assert evaluated({**model_args, 'batch_size': 3}) and not evaluated({**model_args, 'batch_size': 3})
    os.utime(run_dir / 'ckpt.pt', ns=(1, 1))  # a checkpoint written again
    assert evaluated({**model_args, 'batch_size': 3})


# -----------------------------------------------------------------------------
# bits per byte, whatever the layout of the held-out split

def shard(path, ids, magic=20240520):
    """An llm.c shard: 256 int32 of header (magic, version, count), then uint16 or uint32 tokens."""
    version, dtype = {20240520: (1, '<u2'), 20240801: (7, '<u4')}[magic]
    header = np.zeros(256, dtype='<i4')
    header[:3] = magic, version, len(ids)
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype=dtype).tobytes())


def test_bits_per_byte_are_the_same_for_one_file_and_shards_of_the_same_text(tmp_path):
    """The same text prepared as one val.bin and as shards: the bytes recorded at preparation agree;
    counted token by token they agree again, for llm.c's shards without meta.json, a headered val.bin
    and uint32 shards. GPT-2's end-of-text tokens carry no bytes."""
    from nanohfa import data
    text = tmp_path / 'corpus.txt'
    text.write_text('\n\n'.join(f"{t} Ünïcödé № {i}." for i, t in enumerate(fixture_texts() * 3)))
    one = data.prepare(str(text), 'one', 'gpt2', val_fraction=0.3, root=tmp_path, shard_tokens=0)
    sharded = data.prepare(str(text), 'sharded', 'gpt2', val_fraction=0.3, root=tmp_path, shard_tokens=100)
    assert len(data.read_meta(sharded)['shards']['val']) > 2
    val_text = sum(len(t.encode()) for t in data.split_documents(data.load_documents(str(text)), 0.3)['val']['text'])
    val = np.asarray(data.split_tokens(one, 'val', 0)[:])
    want = val_text / len(val)
    assert (val == 50256).sum() > 1  # documents end in end-of-text
    for folder in (one, sharded):
        bpt, kind, how = lm_eval_tasks.bytes_per_token(str(folder))
        assert (bpt, kind) == (pytest.approx(want, rel=1e-12), 'recorded') and 'meta.json val_bytes' in how
    layouts = {'llmc': lambda d: shard(d / 'fineweb_val_000000.bin', val),
               'headered_val_bin': lambda d: shard(d / 'val.bin', val),
               'uint32': lambda d: (shard(d / 'val_000000.bin', val[:50], 20240801),
                                    shard(d / 'val_000001.bin', val[50:], 20240801),
                                    (d / 'meta.json').write_text('{"tokenizer": "gpt2", "vocab_size": 50257}')),
               'no_val_bytes': lambda d: (shutil.copy(one / 'val.bin', d / 'val.bin'), (d / 'meta.json').write_text(
                   json.dumps({k: v for k, v in data.read_meta(one).items() if k != 'val_bytes'})))}
    for name, make in layouts.items():
        (tmp_path / name).mkdir()
        make(tmp_path / name)
        bpt, kind, how = lm_eval_tasks.bytes_per_token(str(tmp_path / name))
        assert (bpt, kind) == (pytest.approx(want, rel=1e-12), 'counted'), name
        assert f'each of its {len(val):,} tokens' in how


def test_bits_per_byte_of_a_large_split_come_from_a_stated_sample(tmp_path, monkeypatch):
    from nanohfa import tokenizer as tok
    enc = tok.CharTokenizer(sorted(set('abc Ünï€')))  # 1, 2 and 3 bytes a character
    (tmp_path / 'd').mkdir()
    np.array(enc.encode('abc Ünï€' * 500), dtype=np.uint16).tofile(tmp_path / 'd' / 'val.bin')
    (tmp_path / 'd' / 'meta.json').write_text(json.dumps(enc.meta()))
    monkeypatch.setattr(lm_eval_tasks, 'SAMPLE_TOKENS', 800)
    bpt, kind, how = lm_eval_tasks.bytes_per_token(str(tmp_path / 'd'))
    assert kind == 'sampled' and '800 of its 4,000 tokens, in 100 evenly spaced pieces' in how
    assert bpt == pytest.approx(len('abc Ünï€'.encode()) / 8, rel=0.02)


# -----------------------------------------------------------------------------
# eval.py: processes and where the results go

@pytest.mark.slow
def test_two_processes_under_torchrun_give_the_numbers_of_one(tmp_path):
    out_dir = save_run(tiny('hfa_v1', seed=2, scale=20.0), tmp_path / 'run')
    common = ['eval.py', f'--out_dir={out_dir}', f'--tasks={MC},{TEXT},{GEN},nanohfa_tiny_mc_then',
              f'--include_path={TASKS}', '--device=cpu', '--batch_size=3']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    results = {}
    for n, launcher in ((1, [sys.executable]), (2, [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                                     '--nproc_per_node=2'])):
        r = subprocess.run(launcher + common + [f'--output_path={tmp_path / f"n{n}"}/'], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.count('wrote ') == 1  # one process writes
        files = list((tmp_path / f'n{n}').rglob('results_*.json'))
        assert len(files) == 1
        results[n] = json.loads(files[0].read_text())
    assert results[2]['nanohfa']['processes'] == 2 and results[1]['nanohfa']['processes'] == 1
    for task, metrics in results[1]['results'].items():
        for key, value in metrics.items():
            if isinstance(value, float) and 'stderr' not in key:
                assert results[2]['results'][task][key] == pytest.approx(value, rel=1e-9, abs=1e-12), (task, key)
    assert results[1]['n-samples'] == results[2]['n-samples']


def test_output_path_is_a_folder_or_a_json_file_as_lm_evals_cli(tmp_path, capsys):
    import eval as eval_py
    out_dir = save_run(tiny('sa'), tmp_path / 'run')
    common = [f'--out_dir={out_dir}', f'--tasks={MC}', f'--include_path={TASKS}', '--device=cpu', '--limit=2']
    eval_py.main(common + [f'--output_path={tmp_path / "new_folder"}/'])
    from lm_eval.utils import sanitize_model_name
    written, = (tmp_path / 'new_folder').rglob('*.json')  # FOLDER/<model>/results_<date>.json
    assert written.parent == tmp_path / 'new_folder' / sanitize_model_name(str(out_dir / 'ckpt.pt'))
    assert written.name.startswith('results_') and f"wrote {written}" in capsys.readouterr().out
    eval_py.main(common + [f'--output_path={tmp_path / "new_folder"}'])  # an existing folder, no slash
    assert len(list((tmp_path / 'new_folder').rglob('*.json'))) == 2
    eval_py.main(common + [f'--output_path={tmp_path / "res.json"}'])
    as_file, = tmp_path.glob('res_*.json')
    assert json.loads(as_file.read_text())['results'][MC]['acc,none'] >= 0
    (tmp_path / 'plain').write_text('')
    with pytest.raises(UserError, match=r'is a file, not a folder; give a folder, or a path ending in .json'):
        eval_py.main(common + [f'--output_path={tmp_path / "plain"}'])
