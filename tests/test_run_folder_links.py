"""A run folder cannot be aimed: a file train.py writes in place (.lock, the logs, ckpt.pt.tmp)
or run.json that is a symbolic link is refused in one line before anything is claimed, and a
link planted after the claim is never written through; a grid folder's summaries and SLURM
records are renamed over a link, and a run's stdout.txt is never appended through one."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import compare
from nanohfa import checkpoint
from nanohfa import slurm
from nanohfa import run_folder
from nanohfa import tokenizer as tok
from nanohfa.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n\n" * 60


def md5(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def victim(tmp_path):
    """A file outside the run folder that a planted link points at."""
    v = tmp_path / 'elsewhere' / 'precious.txt'
    v.parent.mkdir()
    v.write_text('not yours to write\n')
    return v


@pytest.mark.parametrize('name', ['.lock', 'run.json', 'log.jsonl', 'train_log.jsonl', 'ckpt.pt.tmp'])
def test_a_fresh_out_dir_holding_a_linked_run_file_is_refused_and_the_target_is_untouched(tmp_path, name):
    out, v = tmp_path / 'out', victim(tmp_path)
    out.mkdir()
    (out / name).symlink_to(v)
    before = md5(v)
    with pytest.raises(UserError, match=f"{name} is a symbolic link .*remove the link, or choose another --out_dir"):
        run_folder.claim(out, fresh=True, overwrite=False)
    assert md5(v) == before and sorted(p.name for p in out.iterdir()) == [name]


def test_a_log_linked_after_the_claim_is_not_appended_through(tmp_path):
    out, v = tmp_path / 'out', victim(tmp_path)
    lock = run_folder.claim(out, fresh=True, overwrite=False)
    (out / 'log.jsonl').symlink_to(v)
    with pytest.raises(UserError, match='log.jsonl is a symbolic link'):
        run_folder.append_jsonl(out / 'log.jsonl', {'iter': 0}, None)
    lock.close()
    assert v.read_text() == 'not yours to write\n'


def test_a_checkpoint_temp_file_planted_as_a_link_is_replaced_not_written_through(tmp_path):
    out, v = tmp_path / 'out', victim(tmp_path)
    out.mkdir()
    (out / 'ckpt.pt.tmp').symlink_to(v)
    checkpoint.save_checkpoint({'iter_num': 3, 'w': torch.ones(2)}, out, keep_last=0, saved_iter=None)
    assert v.read_text() == 'not yours to write\n'
    assert not (out / 'ckpt.pt').is_symlink() and torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 3
    assert not (out / 'ckpt.pt.tmp').exists()


def test_run_json_is_written_by_rename_so_a_link_put_there_later_is_replaced(tmp_path):
    out, v = tmp_path / 'out', victim(tmp_path)
    out.mkdir()
    (out / 'run.json').symlink_to(v)
    run_folder.write_atomic(out / 'run.json', b'{}')  # what start_logs writes it with
    assert v.read_text() == 'not yours to write\n' and not (out / 'run.json').is_symlink()


@pytest.mark.slow
def test_a_resume_into_a_folder_whose_log_is_a_link_is_one_line_and_changes_nothing(tmp_path):
    data, out, v = tmp_path / 'data', tmp_path / 'out', victim(tmp_path)
    data.mkdir()
    enc = tok.CharTokenizer.from_text([TEXT])
    ids = np.array(enc.encode(TEXT), dtype=np.uint16)
    ids[:4000].tofile(data / 'train.bin')
    ids[4000:].tofile(data / 'val.bin')
    (data / 'meta.json').write_text(json.dumps(enc.meta()))
    args = [sys.executable, 'train.py', f'--data_dir={data}', f'--out_dir={out}', '--device=cpu', '--n_layer=1',
            '--n_head=2', '--n_embd=16', '--block_size=16', '--batch_size=4', '--max_iters=4', '--lr_decay_iters=4',
            '--eval_interval=2', '--eval_iters=1', '--compile=False']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (out / 'train_log.jsonl').unlink()
    (out / 'train_log.jsonl').symlink_to(v)
    files = {p.name: md5(p) for p in out.iterdir() if p.is_file() and not p.is_symlink()}
    r = subprocess.run(args + ['--init_from=resume', '--max_iters=6', '--lr_decay_iters=6'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode != 0 and len(lines) == 1 and 'train_log.jsonl is a symbolic link' in lines[0], r.stderr
    assert v.read_text() == 'not yours to write\n'
    assert {p.name: md5(p) for p in out.iterdir() if p.is_file() and not p.is_symlink()} == files


def test_a_grids_summaries_replace_links_planted_in_its_folder(tmp_path):
    out, v = tmp_path / 'grid', victim(tmp_path)
    out.mkdir()
    for name in ('results.json', 'results.md', 'results.csv'):
        (out / name).symlink_to(v)
    compare.write_outputs(out, [{'variant': 'sa', 'n_seeds': 0, 'failed': []}], '| table |')
    assert v.read_text() == 'not yours to write\n'
    assert not any((out / n).is_symlink() for n in ('results.json', 'results.md', 'results.csv'))
    assert json.loads((out / 'results.json').read_text())[0]['variant'] == 'sa'


def test_a_slurm_record_replaces_a_link_and_a_runs_output_is_not_appended_through_one(tmp_path):
    run, v = tmp_path / 'run', victim(tmp_path)
    run.mkdir()
    (run / slurm.RECORD).symlink_to(v)
    slurm.write_record(run, {'job_id': '7'})
    assert not (run / slurm.RECORD).is_symlink() and slurm.read_record(run)['job_id'] == '7'
    (run / 'stdout.txt').symlink_to(v)
    with pytest.raises(UserError, match='stdout.txt is a symbolic link'):
        run_folder.append_in_place(run / 'stdout.txt')
    assert v.read_text() == 'not yours to write\n'
