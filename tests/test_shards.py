"""Token shards (data.py, shards.py): a split as <split>.bin or as shards, headerless or in
llm.c's format, read as one sequence; shards written by prepare_openwebtext.py that resume.

The shards read here are written by the test itself from the format's description (256 int32:
magic, version, token count, then the tokens), not by our writer. Training runs (slow) are tiny
and launched together: one file vs shards of the same tokens (sa, ha, and sa under DDP with 2
processes), a run on shards killed and resumed, a shard unreadable on one process under
torchrun, and a cut-short shard.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nanohfa import data
from nanohfa import shards
from nanohfa.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
ITOS = list('abcdefghijklmnop')
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--device=cpu', '--eval_iters=2', '--eval_interval=4',
        '--warmup_iters=2', '--lr_decay_iters=8', '--learning_rate=1e-2', '--log_interval=1000',
        '--dropout=0.1', '--max_iters=8']
HA = ['--attention=ha', '--ha_order=3', '--ha_window1=8', '--ha_window2=4']


@pytest.fixture(autouse=True)
def _no_file_left_open():
    """The files a test read stay in the process's pool of open token files: closed after it."""
    yield
    shards.OPEN.close_all()


def llmc_file(path, tokens, magic=20240520, version=1, dtype='<u2', count=None):
    """A shard as llm.c describes it: 256 little-endian int32 (magic, version, token count, zeros),
    then the tokens."""
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    Path(path).write_bytes(np.array(header, '<i4').tobytes() + np.asarray(tokens, dtype).tobytes())


def char_meta(folder, vocab=len(ITOS)):
    (Path(folder) / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': vocab,
                                                        'itos': ITOS[:vocab] if vocab <= 16 else None}))


def one_file_and_shards(tmp, n_train=3000, n_val=600, cuts=(700, 1500, 2900), seed=0):
    """The same tokens twice: nanoGPT's train.bin/val.bin, and llm.c shards named as modded-nanogpt
    names them (fineweb_val_000000.bin, fineweb_train_000001.bin, ...)."""
    rng = np.random.default_rng(seed)
    train, val = rng.integers(0, 16, n_train).astype(np.uint16), rng.integers(0, 16, n_val).astype(np.uint16)
    one, sh = Path(tmp) / 'one', Path(tmp) / 'shards'
    for d in (one, sh):
        d.mkdir(parents=True)
        char_meta(d)
    train.tofile(one / 'train.bin')
    val.tofile(one / 'val.bin')
    for k, part in enumerate(np.split(train, cuts)):
        llmc_file(sh / f'fineweb_train_{k + 1:06d}.bin', part)
    llmc_file(sh / 'fineweb_val_000000.bin', val)
    return one, sh, train, val


# -----------------------------------------------------------------------------
# reading

def test_independent_shards_read_back_token_identical(tmp_path):
    one, sh, train, val = one_file_and_shards(tmp_path)
    t = data.open_split(sh, 'train', 16)
    assert [p.name for p in t.files] == [f'fineweb_train_{k:06d}.bin' for k in (1, 2, 3, 4)]
    assert len(t) == len(train) and (t[0:len(t)] == train).all()
    assert (data.open_split(sh, 'val', 16)[0:600] == val).all()
    # slices inside a shard, across one boundary, across several, and at the ends
    for a, b in [(0, 5), (690, 710), (650, 1600), (2890, 3000), (699, 700), (700, 700)]:
        assert (t[a:b] == train[a:b]).all(), (a, b)
    # the same windows, as train.py draws them, as from one file
    offsets = torch.tensor([0, 690, 1495, 2899, 2983])
    for x, y in zip(data.windows(t, offsets, 16), data.windows(data.open_split(one, 'train', 16), offsets, 16)):
        assert torch.equal(x, y)
    assert data.check_vocabulary(sh, data.read_meta(sh)) is None


def test_slices_of_unequal_shards_are_right_at_every_boundary(tmp_path):
    """Every slice [a:b] of a split of shards of unequal sizes (a one-token shard among them),
    negative and out-of-range ends and empty slices at and past the end included, is the
    slice of one array of the same tokens."""
    sizes = [3, 1, 6, 2, 1, 9, 4]
    tokens = np.random.default_rng(3).integers(0, 16, sum(sizes)).astype(np.uint16)
    d = tmp_path / 'unequal'
    d.mkdir()
    for k, part in enumerate(np.split(tokens, np.cumsum(sizes)[:-1])):
        llmc_file(d / f'train_{k:06d}.bin', part)
    t = shards.open_split(d, 'train')
    n = len(tokens)
    assert len(t) == n
    for a in range(-n - 2, n + 3):
        for b in range(-n - 2, n + 3):
            got = t[a:b]
            assert got.dtype == np.dtype('<u2') and got.tolist() == tokens[a:b].tolist(), (a, b)


def many_shards(folder, count, per_shard=24, seed=4):
    """`count` llm.c shards of `per_shard` tokens (ids < 16) in `folder`; returns their tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(seed).integers(0, 16, count * per_shard).astype(np.uint16)
    for k in range(count):
        llmc_file(folder / f'train_{k:06d}.bin', tokens[k * per_shard:(k + 1) * per_shard])
    return tokens


def open_descriptors():
    return len(os.listdir('/proc/self/fd'))


@pytest.mark.skipif(not os.path.isdir('/proc/self/fd'), reason='counts descriptors in /proc (Linux)')
def test_reading_two_thousand_shards_keeps_a_bounded_number_of_files_open(tmp_path):
    """Opening a split of 2,000 shards keeps no file open; reading windows from every one of
    them keeps at most the pool's limit open, and the tokens are those of one array."""
    tokens = many_shards(tmp_path / 'many', 2000)
    shards.OPEN.close_all()
    before = open_descriptors()
    t = shards.open_split(tmp_path / 'many', 'train')
    assert open_descriptors() == before and len(t.files) == 2000
    offsets = torch.arange(0, len(tokens) - 17, 7)  # windows in and across every shard
    x, y = data.windows(t, offsets, 16)
    want = np.stack([tokens[i:i + 17] for i in offsets.tolist()]).astype(np.int64)
    assert (x.numpy() == want[:, :-1]).all() and (y.numpy() == want[:, 1:]).all()
    assert 0 < len(shards.OPEN) <= shards.OPEN.limit() <= shards.MAX_OPEN
    assert open_descriptors() - before == len(shards.OPEN)
    shards.OPEN.close_all()
    assert open_descriptors() == before


def test_headerless_shards_and_uint32_shards(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 70000, 5000).astype(np.uint32)
    d = tmp_path / 'wide'
    d.mkdir()
    for k, part in enumerate(np.split(ids, [2000])):
        llmc_file(d / f'train_{k:06d}.bin', part, magic=20240801, version=7, dtype='<u4')
    llmc_file(d / 'val_000000.bin', ids[:500], magic=20240801, version=7, dtype='<u4')
    with pytest.raises(UserError, match="holds uint32 tokens .* but no meta.json"):
        data.check_vocabulary(d, None)
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'other', 'vocab_size': 70000}))
    assert (data.open_split(d, 'train', 8)[0:5000] == ids).all()
    assert data.check_vocabulary(d, data.read_meta(d)) is None
    x, _ = data.windows(data.open_split(d, 'train', 8), torch.tensor([1995]), 8)
    assert x.tolist()[0] == ids[1995:2003].tolist()  # ids past 65,535 survive, across the shard boundary
    h = tmp_path / 'headerless'  # nanoGPT-style uint16 shards without a header, no meta.json: GPT-2's
    h.mkdir()
    tokens = rng.integers(0, 50257, 4000).astype(np.uint16)
    tokens[:2000].tofile(h / 'train_0.bin')
    tokens[2000:].tofile(h / 'train_1.bin')
    tokens[:300].tofile(h / 'val_0.bin')
    assert (data.open_split(h, 'train', 8)[0:4000] == tokens).all()
    assert 'taken as GPT-2' in data.check_vocabulary(h, None)


def test_llmc_gpt2_shards_without_meta_are_gpt2_tokens(tmp_path):
    _, sh, _, _ = one_file_and_shards(tmp_path)
    (sh / 'meta.json').unlink()
    assert 'magic 20240520' in data.check_vocabulary(sh, None)
    assert data.model_vocab_size(data.read_meta(sh)) == 50304


# bad input: (what the test does to a copy of the shards folder, the text its one line must hold)
def _cut_short(d):
    p = d / 'fineweb_train_000002.bin'
    p.write_bytes(p.read_bytes()[:-6])


def _magic(d):
    llmc_file(d / 'fineweb_train_000002.bin', np.zeros(800, np.uint16), magic=20240521)


def _version(d):
    llmc_file(d / 'fineweb_train_000002.bin', np.zeros(800, np.uint16), version=2)


def _no_val(d):
    (d / 'fineweb_val_000000.bin').unlink()


def _widths(d):
    llmc_file(d / 'fineweb_train_000002.bin', np.zeros(800, np.uint32), magic=20240801, version=7, dtype='<u4')


def _val_other_kind(d):
    np.zeros(600, np.uint16).tofile(d / 'fineweb_val_000000.bin')  # headerless, train headered


def _empty(d):
    for p in d.iterdir():
        p.unlink()


def _both_layouts(d):
    np.zeros(100, np.uint16).tofile(d / 'train.bin')


def _listed_missing(d):
    meta = json.loads((d / 'meta.json').read_text())
    meta['shards'] = {'train': [{'file': f'fineweb_train_{k:06d}.bin', 'tokens': n}
                                for k, n in ((1, 700), (2, 800), (3, 1400), (4, 100))],
                      'val': [{'file': 'fineweb_val_000000.bin', 'tokens': 600}]}
    (d / 'meta.json').write_text(json.dumps(meta))
    (d / 'fineweb_train_000003.bin').unlink()


BAD = {
    'cut_short': (_cut_short, "fineweb_train_000002.bin: its header says 800 tokens (2,624 bytes) but the file "
                              "holds 2,618 bytes (cut short?)"),
    'wrong_magic': (_magic, "has an llm.c header with magic 20240521, not 20240520"),
    'wrong_version': (_version, "has llm.c's magic 20240520 but version 2, not 1"),
    'train_without_val': (_no_val, "holds train shards but no val shards"),
    'token_widths': (_widths, "the train files of {d} are of different kinds: "),
    'train_val_kinds': (_val_other_kind, "the train and val files of {d} are of different kinds"),
    'empty_folder': (_empty, "{d}/train.bin not found; prepare the data first"),
    'both_layouts': (_both_layouts, "holds both train.bin and 4 train shard(s)"),
    'listed_shard_missing': (_listed_missing,
                             "fineweb_train_000003.bin (1,400 tokens), listed in meta.json, is missing"),
}


@pytest.mark.parametrize('case', list(BAD))
def test_bad_shards_are_one_clear_error(tmp_path, case):
    _, d, _, _ = one_file_and_shards(tmp_path)
    change, text = BAD[case]
    change(d)
    with pytest.raises(UserError) as e:
        data.open_split(d, 'train', 16)
        data.open_split(d, 'val', 16)
        data.check_vocabulary(d, data.read_meta(d))
    assert text.format(d=d) in str(e.value) and '\n' not in str(e.value)


def test_shards_with_another_vocabulary_are_refused(tmp_path):
    _, d, _, _ = one_file_and_shards(tmp_path)
    llmc_file(d / 'fineweb_train_000005.bin', [3, 40, 2])  # a shard from a larger vocabulary
    with pytest.raises(UserError, match="holds token id 40 but its vocabulary has 16 tokens"):
        data.check_vocabulary(d, data.read_meta(d))


# -----------------------------------------------------------------------------
# writing

PHRASES = ['shall the king speak', 'of love and war', 'while the fool sings']
CORPUS = [' '.join(PHRASES[i % 3] for _ in range(3 + i % 11)) + f' {i}.' for i in range(60)]


def corpus(tmp):
    (Path(tmp) / 'corpus.txt').write_text('\n\n'.join(CORPUS) + '\n')
    return str(Path(tmp) / 'corpus.txt')


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
    """One corpus prepared as single files, as shards of 1,000 tokens, and through the Hub path on
    a local folder of parquet files (--hf_id names a Hub dataset, FineWeb's HuggingFaceFW/fineweb
    --hf_config=sample-10BT among them; offline, the same path on local files)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tmp = tmp_path_factory.mktemp('prepared')
    src = corpus(tmp)
    (tmp / 'fw' / 'data').mkdir(parents=True)
    pq.write_table(pa.table({'text': CORPUS, 'id': [str(i) for i in range(len(CORPUS))]}),
                   tmp / 'fw' / 'data' / 'train-00000-of-00001.parquet')
    return {'src': src, 'tmp': tmp,
            'one': data.prepare(src, 'one', 'char', val_fraction=0.1, root=tmp),
            'sh': data.prepare(src, 'sh', 'char', val_fraction=0.1, root=tmp, shard_tokens=1000),
            # the Hub's default, 100M-token shards (a local folder this small would get single files)
            'fw': data.prepare('openwebtext', 'fw', 'char', val_fraction=0.2, hf_id=str(tmp / 'fw'), root=tmp,
                               shard_tokens=shards.SHARD_TOKENS),
            'fw_small': data.prepare('openwebtext', 'fw_small', 'char', val_fraction=0.2, hf_id=str(tmp / 'fw'),
                                     root=tmp, shard_tokens=None)}


def test_written_shards_are_the_single_files_tokens(prepared):
    one, sh = prepared['one'], prepared['sh']
    meta = data.read_meta(sh)
    names = [s['file'] for s in meta['shards']['train']]
    assert names == [f'train_{k:06d}.bin' for k in range(len(names))]
    assert len(meta['shards']['train']) >= 4 and meta['val_documents'] == data.read_meta(one)['val_documents']
    for split in ('train', 'val'):
        a = np.fromfile(one / f'{split}.bin', np.uint16)
        b = data.open_split(sh, split, 8)
        assert b.magic == 20240520 and (a == b[0:len(b)]).all()
        for i in (0, 995, 1000, 1999, 2001, len(a) - 12):  # shards of one size: found by division
            assert (b[i:i + 12] == a[i:i + 12]).all(), i
    header = np.fromfile(sh / 'train_000001.bin', '<i4', count=3)  # llm.c's format, read by hand
    assert header.tolist() == [20240520, 1, 1000] and (sh / 'train_000001.bin').stat().st_size == 1024 + 2000
    assert not (sh / shards.PROGRESS).exists()
    assert 'shard(s): train_000000.bin' in data.summary(sh)


def test_heldout_halves_of_shards_are_those_of_one_file(prepared):
    one, sh = prepared['one'], prepared['sh']
    assert len(data.read_meta(sh)['shards']['train']) > 1
    for a, b in zip(data.heldout_halves(one, data.read_meta(one), 8), data.heldout_halves(sh, data.read_meta(sh), 8)):
        assert len(a) > 100 and (a == b).all()


def test_a_different_preparation_never_overwrites_a_dataset(prepared):
    src, sh, root = prepared['src'], prepared['sh'], prepared['tmp']
    before = files(sh)
    with pytest.raises(UserError, match=r"holds a dataset prepared otherwise \(other settings: shard_tokens\); nothing"):
        data.prepare(src, 'sh', 'char', val_fraction=0.1, root=root, shard_tokens=500)
    with pytest.raises(UserError, match="holds shards of another preparation"):
        data.prepare(src, 'sh', 'char', val_fraction=0.1, root=root)
    assert files(sh) == before
    single = files(prepared['one'])
    with pytest.raises(UserError, match=r"holds a dataset prepared otherwise \(single files, or not by this script\)"):
        data.prepare(src, 'one', 'char', val_fraction=0.1, root=root, shard_tokens=1000)
    assert files(prepared['one']) == single


def test_hub_path_on_a_local_parquet_writes_shards(prepared):
    out = prepared['fw']
    assert sorted(p.name for p in out.glob('*.bin')) == ['train_000000.bin', 'val_000000.bin']
    itos = data.read_meta(out)['itos']
    train, val = (''.join(itos[i] for i in data.open_split(out, s, 8)[0:10 ** 6]) for s in ('train', 'val'))
    assert len(train) + len(val) == len(''.join(CORPUS))
    assert all((doc in train) != (doc in val) for doc in CORPUS)  # every document whole, in one split


def test_a_small_local_dataset_folder_keeps_single_files_by_default(prepared):
    """Shards by default only for the Hub or a corpus larger than one shard (as nanoGPT's users expect)."""
    assert sorted(p.name for p in prepared['fw_small'].glob('*.bin')) == ['train.bin', 'val.bin']


KILL_AFTER_SECOND_SHARD = """
import os, runpy, signal, sys
replace, done = os.replace, []
def replace_then_die(a, b):
    replace(a, b)
    if str(b).endswith('.bin'):
        done.append(b)
        if len(done) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace_then_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.slow
def test_killed_preparation_resumes_at_the_next_shard_and_ends_byte_identical(prepared, tmp_path):
    src, whole = prepared['src'], prepared['sh']
    args = ['prepare_openwebtext.py', f'--source={src}', '--tokenizer=char', '--shard_tokens=1000',
            f'--root={tmp_path}', '--num_proc=1']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    killed = subprocess.run([PY, '-c', KILL_AFTER_SECOND_SHARD, *args, '--name=k'], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    k = tmp_path / 'k'
    assert sorted(p.name for p in k.glob('*.bin')) == ['train_000000.bin', 'train_000001.bin']
    assert not (k / 'meta.json').exists()  # unfinished: nothing reads it as a dataset
    first = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in k.glob('*.bin')}
    resumed = subprocess.run([PY, *args, '--name=k'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert 'resuming the preparation' in resumed.stdout and '2 shard(s) already written' in resumed.stdout
    assert {n: ((k / n).stat().st_ino, (k / n).stat().st_mtime_ns) for n in first} == first  # not rewritten
    assert files(k) == files(whole)  # byte for byte, meta.json included
    t0 = time.time()
    again = subprocess.run([PY, *args, '--name=k'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and 'already prepared with these settings: nothing to do' in again.stdout
    assert time.time() - t0 < 60 and files(k) == files(whole)


# -----------------------------------------------------------------------------
# training on shards (slow): launched together

def start(args, log, hooks=False, torchrun=False, **extra):
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1', **extra}
    launcher = [PY, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] if torchrun else [PY]
    script = ['tests/train_hooks.py', 'train.py'] if hooks else ['train.py']
    return subprocess.Popen([*launcher, *script, *map(str, args)], cwd=ROOT, env=env, stdout=open(log, 'w'),
                            stderr=subprocess.STDOUT, start_new_session=True)


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('shardruns')
    one, sh, _, _ = one_file_and_shards(tmp)
    cut = tmp / 'cutdata'
    cut.mkdir()
    for p in sh.iterdir():
        (cut / p.name).write_bytes(p.read_bytes())
    _cut_short(cut)
    r = lambda name: ([f'--out_dir={tmp / name}'], tmp / f'{name}.log')
    plan = {
        'sa_one': ([*TINY, f'--data_dir={one}'], {}),
        'sa_shards': ([*TINY, f'--data_dir={sh}'], {}),
        'ha_one': ([*TINY, *HA, f'--data_dir={one}'], {}),
        'ha_shards': ([*TINY, *HA, f'--data_dir={sh}'], {}),
        'killed': ([*TINY, f'--data_dir={sh}'], {'hooks': True, 'NANOHFA_TEST_DIE_AT': '6'}),
        'cut': ([*TINY, f'--data_dir={cut}'], {}),
        'ddp_one': ([*TINY, '--dropout=0.0', f'--data_dir={one}'], {'torchrun': True}),
        'ddp_shards': ([*TINY, '--dropout=0.0', f'--data_dir={sh}'], {'torchrun': True}),
        'unreadable': ([*TINY, f'--data_dir={sh}'], {'hooks': True, 'torchrun': True,
                                                      'NANOHFA_TEST_UNREADABLE': '1:fineweb_train_000003.bin'}),
    }
    procs, logs = {}, {}
    t0 = time.time()
    for name, (args, extra) in plan.items():
        out, logs[name] = r(name)
        procs[name] = start([*args, *out], logs[name], **extra)
    rc = {}
    for name, p in procs.items():
        try:
            rc[name] = p.wait(max(1, 400 - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc[name] = 'hung'
    resume = start([*TINY, f'--data_dir={sh}', f'--out_dir={tmp / "killed"}', '--init_from=resume'], tmp / 'resume.log')
    rc['resume'] = resume.wait(300)
    return {'tmp': tmp, 'rc': rc, 'cut_dir': cut, **{f'{k}_log': Path(v).read_text() for k, v in logs.items()},
            'resume_log': (tmp / 'resume.log').read_text()}


@pytest.mark.slow
@pytest.mark.parametrize('attention', ['sa', 'ha', 'ddp'])
def test_one_file_and_shards_train_identically(runs, attention):
    tmp, rc = runs['tmp'], runs['rc']
    assert rc[f'{attention}_one'] == 0 and rc[f'{attention}_shards'] == 0, runs[f'{attention}_shards_log']
    a, b = jsonl(tmp / f'{attention}_one' / 'train_log.jsonl'), jsonl(tmp / f'{attention}_shards' / 'train_log.jsonl')
    assert len(a) == 8 and [x['loss'] for x in a] == [x['loss'] for x in b]  # bit for bit
    ea, eb = jsonl(tmp / f'{attention}_one' / 'log.jsonl'), jsonl(tmp / f'{attention}_shards' / 'log.jsonl')
    assert [(x['train_loss'], x['val_loss']) for x in ea] == [(x['train_loss'], x['val_loss']) for x in eb]


@pytest.mark.slow
def test_resume_on_shards_is_bit_identical(runs):
    tmp, rc = runs['tmp'], runs['rc']
    assert rc['killed'] == -signal.SIGKILL and rc['resume'] == 0, runs['resume_log']
    ref, resumed = jsonl(tmp / 'sa_shards' / 'train_log.jsonl'), jsonl(tmp / 'killed' / 'train_log.jsonl')
    assert 'at iteration 4' in runs['resume_log']
    assert [(x['iter'], x['loss'], x['lr']) for x in resumed] == [(x['iter'], x['loss'], x['lr']) for x in ref]
    evals = lambda run: [(x['iter'], x['train_loss'], x['val_loss']) for x in jsonl(tmp / run / 'log.jsonl')]
    assert evals('killed') == evals('sa_shards') and len(evals('killed')) == 3


@pytest.mark.slow
def test_cut_short_shard_stops_train_py_with_one_line(runs):
    log, cut = runs['cut_log'], runs['cut_dir']
    assert runs['rc']['cut'] == 2, log
    errors = [l for l in log.splitlines() if l.startswith('error:')]
    assert errors == [f"error: {cut}/fineweb_train_000002.bin: its header says 800 tokens (2,624 bytes) but the "
                      f"file holds 2,618 bytes (cut short?); download or prepare it again"], log
    assert 'Traceback' not in log and 'step 0' not in log and not (runs['tmp'] / 'cut').exists()


@pytest.mark.slow
def test_shard_unreadable_on_one_process_stops_every_process_with_one_line(runs):
    """Under torchrun, process 1 alone cannot open a shard: both stop before the process group
    starts, with the same line (process 0 says it; torchrun's report names it), none hangs."""
    log = runs['unreadable_log']
    assert runs['rc']['unreadable'] not in (0, 'hung'), log
    line = (f"error: process 1 of 2: {runs['tmp'] / 'shards' / 'fineweb_train_000003.bin'} cannot be read "
            f"(Permission denied); check that the file is there and readable (under torchrun: on every node)")
    assert [l for l in log.splitlines() if l.startswith('error:')] == [line], log
    reported = [l.split(':', 1)[1].strip() for l in log.splitlines() if l.strip().startswith('traceback :')]
    assert reported == [line, line], log  # torchrun's report: both processes exited with it
    assert 'train.py", line' not in log and 'shards.py", line' not in log and 'step 0' not in log


def open_file_limit(n):
    """preexec_fn: the child's `ulimit -n` lowered to n (soft and hard), as on a cluster node."""
    def lower():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return lower


@pytest.mark.slow
def test_two_thousand_shards_train_under_ulimit_1024_as_one_file(tmp_path):
    """A train split of 2,000 shards and a val split of 300, under `ulimit -n 1024` (more shards
    than descriptors): train.py opens, checks and trains on them, with the losses of one file of
    the same tokens."""
    sh, one = tmp_path / 'shards', tmp_path / 'one'
    train = many_shards(sh, 2000)
    val = np.random.default_rng(5).integers(0, 16, 300 * 8).astype(np.uint16)
    for k in range(300):
        llmc_file(sh / f'val_{k:06d}.bin', val[k * 8:(k + 1) * 8])
    one.mkdir()
    train.tofile(one / 'train.bin')
    val.tofile(one / 'val.bin')
    for d in (sh, one):
        char_meta(d)
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = {name: subprocess.Popen([PY, 'train.py', *TINY, f'--data_dir={d}', f'--out_dir={tmp_path / (name + "_out")}'],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    preexec_fn=open_file_limit(1024))
             for name, d in (('shards', sh), ('one', one))}
    logs = {name: p.communicate(timeout=300)[0] for name, p in procs.items()}
    assert procs['shards'].returncode == 0 and procs['one'].returncode == 0, logs['shards'][-3000:]
    a, b = (jsonl(tmp_path / f'{name}_out' / 'train_log.jsonl') for name in ('one', 'shards'))
    assert len(a) == 8 and [x['loss'] for x in a] == [x['loss'] for x in b]
    ea, eb = (jsonl(tmp_path / f'{name}_out' / 'log.jsonl') for name in ('one', 'shards'))
    assert [(x['train_loss'], x['val_loss']) for x in ea] == [(x['train_loss'], x['val_loss']) for x in eb]


FILES_TAKEN = """
import os, sys
from nanohfa import shards
held = []
try:
    while True:  # the rest of the process takes every descriptor left
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
shards.open_split(sys.argv[1], 'train')
"""


@pytest.mark.slow
def test_no_descriptor_left_is_said_as_the_open_file_limit_not_a_missing_file(tmp_path):
    many_shards(tmp_path / 'many', 3)
    r = subprocess.run([PY, '-c', FILES_TAKEN, str(tmp_path / 'many')], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, preexec_fn=open_file_limit(64))
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert r.stderr.strip() == (f"error: {tmp_path / 'many'} cannot be opened: this process has "
                                f"too many files open (ulimit -n 64); raise it (ulimit -n 4096) or close what else "
                                f"holds files")


@pytest.mark.slow
@pytest.mark.parametrize('value', ['2147483648', '-1'])
def test_shard_tokens_out_of_the_headers_range_is_refused_at_parsing(tmp_path, value):
    """A shard's header counts its tokens in an int32: 2**31 tokens would crash at the first
    header, hours into a preparation; refused before anything is read or written."""
    r = subprocess.run([PY, 'prepare_openwebtext.py', f'--shard_tokens={value}', f'--source={corpus(tmp_path)}',
                        f'--root={tmp_path / "data"}'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'Traceback' not in r.stderr
    assert r.stderr.strip() == (f"error: --shard_tokens={int(value):,} is out of range: a shard's header counts its "
                                f"tokens in an int32; give 1 to 2,147,483,647 tokens per shard, or 0 for single files "
                                f"(see prepare_openwebtext.py --help)")
    assert not (tmp_path / 'data').exists()


@pytest.mark.slow
def test_bench_shards_writes_its_record(tmp_path):
    """bench.py --shards: windows/s from shards and from one file of the same tokens (it checks
    that both give the same batches), the resident memory of opening and of reading them and
    the files left open, as JSON."""
    out = tmp_path / 'shards.json'
    r = subprocess.run([PY, 'bench.py', '--shards', '--shard_count=20', '--shard_tokens=200000', '--shard_batches=20',
                        '--rounds=1', '--out', str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr
    [rec] = json.loads(out.read_text())
    assert rec['shard_count'] == 20 and rec['data_bytes'] == 2 * 20 * 200000
    assert rec['windows_per_s_shards'] > 0 and rec['windows_per_s_one_file'] > 0 and rec['ratio'] > 0
    assert 0 <= rec["open_rss_bytes"] < 2 ** 20  # 8 MB of tokens: headers read, not the tokens
    assert {'read_rss_bytes', 'open_rss_bytes_one_file', 'windows_read'} <= set(rec)
    assert 0 < rec['files_open'] <= rec['files_open_limit']
