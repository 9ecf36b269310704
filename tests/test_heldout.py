"""The held-out text in two halves (report_split): every choice a study makes reads the
selection half, and its final numbers are the loss on every window of the report half."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nanohfa import data
from nanohfa.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}
WORDS = 'the king shall speak of love and war while the fool sings to the moon'.split()


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
    """A character dataset of 30 paragraphs (documents) of different lengths, 30% held out."""
    tmp = tmp_path_factory.mktemp('heldout')
    rng = np.random.default_rng(0)
    paragraphs = [' '.join(rng.choice(WORDS, size=20 + 15 * (i % 7))) + f' {i}.' for i in range(30)]
    (tmp / 'corpus.txt').write_text('\n\n'.join(paragraphs) + '\n')
    return data.prepare(str(tmp / 'corpus.txt'), 'h', 'char', val_fraction=0.3, root=tmp)


def test_prepare_lists_the_held_out_documents_in_file_order(prepared):
    meta = data.read_meta(prepared)
    val = np.fromfile(prepared / 'val.bin', dtype=np.uint16)
    assert len(meta['val_documents']) == 9 and sum(meta['val_documents']) == len(val)


def test_halves_are_whole_documents_without_overlap_covering_the_held_out_text(prepared):
    meta = data.read_meta(prepared)
    val = np.fromfile(prepared / 'val.bin', dtype=np.uint16)
    starts = np.concatenate([[0], np.cumsum(meta['val_documents'])])
    docs = [val[a:b].tobytes() for a, b in zip(starts[:-1], starts[1:])]
    select, report = data.heldout_halves(prepared, meta, block_size=8)
    # each half is some documents, whole and in file order; together exactly all of them
    rebuilt = {}
    for name, half in (('select', select.tobytes()), ('report', report.tobytes())):
        at = 0
        for i, d in enumerate(docs):
            if half[at:at + len(d)] == d and i not in rebuilt:
                rebuilt[i] = name
                at += len(d)
        assert at == len(half), f'the {name} half is not a sequence of whole documents'
    assert sorted(rebuilt) == list(range(len(docs)))
    assert {'select', 'report'} == set(rebuilt.values())
    assert abs(len(select) - len(report)) <= max(meta['val_documents'])  # about equal


def test_halves_need_the_document_list(prepared, tmp_path):
    for name in ('train.bin', 'val.bin'):
        (tmp_path / name).write_bytes((prepared / name).read_bytes())
    with pytest.raises(UserError, match='re-run the prepare script'):
        data.heldout_halves(tmp_path, {'tokenizer': 'char', 'vocab_size': 30}, block_size=8)


def test_tiling_windows_predict_each_token_once():
    offsets = data.tiling_offsets(n_tokens=100, block_size=16)
    assert offsets.tolist() == [0, 16, 32, 48, 64, 80]  # 80 + 16 + 1 <= 100; 96 would need 113
    targets = np.concatenate([np.arange(o + 1, o + 17) for o in offsets.tolist()])
    assert len(set(targets.tolist())) == len(targets) == 96


@pytest.mark.slow
def test_report_loss_is_the_mean_loss_over_every_window_of_the_report_half(prepared, tmp_path):
    from model import GPT, GPTConfig
    out = tmp_path / 'run'
    args = dict(data_dir=prepared, out_dir=out, device='cpu', n_layer=1, n_head=2, n_embd=16, block_size=8,
                batch_size=4, gradient_accumulation_steps=1, max_iters=4, lr_decay_iters=4, warmup_iters=1,
                eval_interval=2, eval_iters=2, log_interval=1, report_split=True)
    r = subprocess.run([sys.executable, 'train.py', *[f'--{k}={v}' for k, v in args.items()]], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    log = [json.loads(l) for l in (out / 'log.jsonl').read_text().splitlines()]
    assert all('report_loss' not in rec for rec in log[:-1])  # read once, at the end
    final = log[-1]
    ckpt = torch.load(out / 'ckpt.pt', map_location='cpu', weights_only=True)
    model = GPT(GPTConfig(**ckpt['model_args']))
    model.load_state_dict(ckpt['model'])
    model.eval()
    _, report = data.heldout_halves(prepared, data.read_meta(prepared), block_size=8)
    offsets = data.tiling_offsets(len(report), 8)
    with torch.no_grad():
        _, loss = model(*data.windows(report, offsets, 8))
    assert final['report_tokens'] == len(offsets) * 8
    assert final['report_loss'] == pytest.approx(loss.item(), rel=1e-5)
    assert 'report loss' in r.stdout
