"""
Token files on disk, for data.py: nanoGPT's one <split>.bin, or shards in llm.c's format.

A split is `<split>.bin`, or every file of the folder named `<split>_*.bin` or `*_<split>_*.bin`
(ours: train_000000.bin; llm.c's and modded-nanogpt's: fineweb_train_000001.bin), in name
order. A file is headerless uint16 tokens (nanoGPT's), or llm.c's format: a header of 256
int32 (magic 20240520, version 1, the token count) and then uint16 tokens; magic 20240801,
version 7, marks uint32 tokens (LLaMA-3's vocabulary). A headerless GPT-2 file cannot be taken
for a headered one: the magic would be its first two tokens, 54,216 and 308, and GPT-2 has
50,257. Every file is memory-mapped, never read whole, and a split is one sequence: its files
end to end (Tokens), so the same tokens as one file or as shards give the same windows.

Shards are written (write_split) in llm.c's format, each to a temporary name and flushed to
disk; a progress file then records it and where the next one starts (document, and tokens of
it already written), and only then is it renamed into place. A preparation killed after shard k
starts again at shard k+1: it tokenizes nothing before that point again and rewrites no shard.
"""

import bisect
import functools
import json
import os
import re
from collections import deque
from pathlib import Path

import numpy as np

from errors import UserError

HEADER_INTS = 256  # llm.c's header: 256 int32, of which [0] magic, [1] version, [2] token count
FORMATS = {20240520: (1, np.dtype('<u2')), 20240801: (7, np.dtype('<u4'))}  # magic: (version, tokens)
GPT2_MAGIC = 20240520
SHARD_TOKENS = 100_000_000  # llm.c's FineWeb shards hold 100M tokens; ours do by default
PROGRESS = 'prepare.json'   # in a folder being prepared: the settings and how far it got


def split_files(folder, split):
    """The files of one split, in name order: <split>.bin, or the shards <split>_*.bin and
    *_<split>_*.bin. Both at once is refused: which one is meant cannot be guessed."""
    folder = Path(folder)
    one = folder / f'{split}.bin'
    try:
        shards = sorted(p for p in folder.iterdir() if re.fullmatch(rf'(.+_)?{split}_.+\.bin', p.name))
    except OSError:  # no such folder: nothing in it
        shards = []
    if shards and one.exists():
        raise UserError(f"{folder} holds both {one.name} and {len(shards)} {split} shard(s) ({shards[0].name}, ...); "
                        f"a split is one or the other: move one of them out of the folder")
    return shards or ([one] if one.exists() else [])


def open_file(path):
    """One token file, memory-mapped. Returns (tokens, magic): magic None for headerless uint16."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, 'rb') as f:
            head = np.frombuffer(f.read(12), dtype='<i4')
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror or e}); check that the file is there and readable "
                        f"(under torchrun: on every node)")
    magic, version, count = (int(x) for x in head) if len(head) == 3 else (0, 0, -1)
    header = HEADER_INTS * 4
    if magic in FORMATS:
        want, dtype = FORMATS[magic]
        if version != want:
            raise UserError(f"{path} has llm.c's magic {magic} but version {version}, not {want}: a format this "
                            f"reader does not know; write the shard again with llm.c's or prepare_openwebtext.py")
        if count < 1 or size != header + count * dtype.itemsize:
            raise UserError(f"{path}: its header says {count:,} tokens ({header + count * dtype.itemsize:,} bytes) "
                            f"but the file holds {size:,} bytes (cut short?); download or prepare it again")
        return np.memmap(path, dtype=dtype, mode='r', offset=header, shape=(count,)), magic
    if version in (1, 7) and count > 0 and size in (header + 2 * count, header + 4 * count):
        raise UserError(f"{path} has an llm.c header with magic {magic}, not 20240520 (uint16 tokens) or 20240801 "
                        f"(uint32 tokens): not a token shard, or a corrupt one; download or prepare it again")
    if size == 0 or size % 2:  # uint16 tokens: 2 bytes each
        raise UserError(f"{path} holds {size:,} bytes, {'nothing' if not size else 'an odd number'}: not a file of "
                        f"uint16 tokens (cut short?); re-run the prepare script")
    return np.memmap(path, dtype=np.uint16, mode='r'), None


class Tokens:
    """A split as one sequence: its files end to end. Offsets run over the whole, so a window
    may cross from one shard into the next, exactly as it would in one file of the same tokens."""

    def __init__(self, parts, files, magic):
        self.parts = [p.view(np.ndarray) for p in parts]  # plain views of the maps: faster to slice
        self.files, self.magic, self.dtype = files, magic, parts[0].dtype
        self.starts = np.cumsum([0] + [len(p) for p in parts]).tolist()
        sizes = [len(p) for p in parts]  # shards of one size but the last (ours, llm.c's): found by division
        self.size = sizes[0] if len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0] else None

    def __len__(self):
        return self.starts[-1]

    def __getitem__(self, s):
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("Tokens takes slices with step 1")
        start, stop, _ = s.indices(len(self))
        i = min(start // self.size, len(self.parts) - 1) if self.size else bisect.bisect_right(self.starts, start) - 1
        if stop <= self.starts[i + 1]:  # within one file: a view, nothing copied
            return self.parts[i][start - self.starts[i]:max(start, stop) - self.starts[i]]
        pieces = []
        while start < stop:
            end = min(stop, self.starts[i + 1])
            pieces.append(self.parts[i][start - self.starts[i]:end - self.starts[i]])
            start, i = end, i + 1
        return np.concatenate(pieces)


def open_split(folder, split, listed=None):
    """A split's files as one Tokens. `listed`: meta.json's list of the shards, each checked to be
    there with its token count (a shard missing from a prepared folder is named)."""
    files = split_files(folder, split)
    if not files:
        return None
    if listed:  # our own preparation: exactly the shards it wrote
        want = {e['file']: e['tokens'] for e in listed}
        missing = sorted(set(want) - {p.name for p in files})
        if missing:
            raise UserError(f"{Path(folder) / missing[0]} ({want[missing[0]]:,} tokens), listed in meta.json, is "
                            f"missing; copy it back or prepare the data again")
        for p in files:
            if p.name not in want:
                raise UserError(f"{p} is not one of the shards meta.json lists; move it out of the folder")
    opened = [open_file(p) for p in files]
    magics = {m for _, m in opened}
    if len(magics) > 1:
        kinds = {}  # the first file of each kind, in name order
        for p, (_, m) in zip(files, opened):
            kinds.setdefault(m, p.name)
        raise UserError(f"the {split} files of {folder} are of different kinds: " + ', '.join(
            f"{name} {describe(m)}" for m, name in kinds.items()) + "; a split needs one tokenizer and one token "
            f"width: keep the files of one preparation")
    for p, (tokens, _) in zip(files, opened):
        if listed and len(tokens) != want[p.name]:
            raise UserError(f"{p} holds {len(tokens):,} tokens but meta.json lists {want[p.name]:,}; the files "
                            f"come from different preparations: prepare the data again")
    return Tokens([t for t, _ in opened], files, magics.pop())


def describe(magic):
    return {None: '(headerless uint16)', 20240520: "(llm.c's uint16, magic 20240520)",
            20240801: "(llm.c's uint32, magic 20240801)"}[magic]


# -----------------------------------------------------------------------------
# under torchrun: a check that fails on one process fails on all, with the same line

_store, _calls = [], [0]


def agreed(check):
    """Run a data check on every process of a torchrun job and share the outcome: if it fails
    on any (a shard missing or unreadable on one node), every process stops with the same line,
    instead of the others waiting in the first collective for a peer that has gone. The outcomes
    go through torchrun's own key-value store, which exists before the process group does."""
    @functools.wraps(check)
    def run(*args, **kwargs):
        if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != 'True':  # one process, or not torchrun's
            return check(*args, **kwargs)
        try:
            result, error = check(*args, **kwargs), ''
        except UserError as e:
            result, error = None, str(e)
        if not _store:
            from datetime import timedelta
            from torch.distributed import TCPStore
            _store.append(TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']),
                                   int(os.environ['WORLD_SIZE']), is_master=False, timeout=timedelta(seconds=600)))
        _calls[0] += 1
        key = f"nanohfa/data/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}/{_calls[0]}"
        rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
        _store[0].set(f'{key}/{rank}', error)
        errors = [_store[0].get(f'{key}/{r}').decode() for r in range(world)]  # waits for every process
        failed = [r for r in range(world) if errors[r]]
        if failed:
            same = all(errors[r] == errors[failed[0]] for r in range(world))
            raise UserError(errors[failed[0]] if same else f"process {failed[0]} of {world}: {errors[failed[0]]}")
        return result
    return run


# -----------------------------------------------------------------------------
# writing shards

def write_shard(path, pieces, n):
    """n tokens (the uint16 arrays `pieces`) as an llm.c shard, written to <path>.tmp and flushed to
    disk; the caller renames it into place once its progress file says so (a shard under its own
    name is always whole). Returns the temporary path."""
    header = np.zeros(HEADER_INTS, dtype='<i4')
    header[:3] = GPT2_MAGIC, FORMATS[GPT2_MAGIC][0], n
    tmp = path.with_name(path.name + '.tmp')  # not *.bin: never taken for a shard
    with open(tmp, 'wb') as f:
        f.write(header.tobytes())
        for p in pieces:
            f.write(p.astype('<u2', copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())
    return tmp


def write_split(out, split, ds, tokenize, shard_tokens, progress, save, keep_lengths=False, block=4096):
    """Tokenize the documents of `ds` (a datasets.Dataset) in order, a block at a time, and write
    them as shards <split>_000000.bin, ... of shard_tokens tokens (the last one shorter). After
    each shard, save(progress) records the shards so far and where the next one starts (document,
    tokens of it already written): a run started again goes on from there. Returns the progress."""
    from tqdm import tqdm
    p = progress.setdefault(split, {'shards': [], 'next_doc': 0, 'skip': 0, 'lengths': []})
    for entry in p['shards']:  # killed between saving the progress and renaming the last shard: rename it
        path = Path(out) / entry['file']
        if not path.exists():
            if not path.with_name(path.name + '.tmp').exists():
                raise UserError(f"{path} is missing though {Path(out) / PROGRESS} lists it as written; move "
                                f"{out} away and prepare the data again")
            os.replace(path.with_name(path.name + '.tmp'), path)
    if p.get('done'):
        return p
    doc, skip = p['next_doc'], p['skip']
    lengths = p['lengths'][:doc]  # whole documents' lengths (val only: the held-out halves need them)
    pending, n_pending, first = deque(), 0, doc  # token arrays not yet written, one per document from `first`
    bar = tqdm(total=len(ds), initial=doc, desc=f'{split} shards', unit='doc', leave=False)
    i = doc
    while True:
        if i < len(ds) and n_pending < shard_tokens:
            ids = tokenize(ds.select(range(i, min(len(ds), i + block))))
            if keep_lengths:
                lengths += [len(a) for a in ids]
            ids[0] = ids[0][skip if i == doc else 0:]
            pending.extend(ids)
            n_pending += sum(len(a) for a in ids)
            bar.update(len(ids))
            i += len(ids)
            continue
        if not n_pending:
            break
        n = min(shard_tokens, n_pending)  # the next shard: full, or the last one
        take, need = [], n
        while need:
            a = pending[0]
            if len(a) <= need:
                take.append(pending.popleft())
                need -= len(a)
                first, skip = first + 1, 0
            else:
                take.append(a[:need])
                pending[0], skip, need = a[need:], skip + need, 0
        while pending and not len(pending[0]):  # empty documents
            pending.popleft()
            first, skip = first + 1, 0
        n_pending -= n
        name = f'{split}_{len(p["shards"]):06d}.bin'
        tmp = write_shard(Path(out) / name, take, n)
        p['shards'].append({'file': name, 'tokens': n})
        p.update(next_doc=first, skip=skip, lengths=lengths[:first] if keep_lengths else [])
        save(progress)  # first the progress, then the rename: a shard in place is always in the progress
        os.replace(tmp, Path(out) / name)
    bar.close()
    p['done'] = True
    save(progress)
    return p


def read_progress(out):
    try:
        return json.loads((Path(out) / PROGRESS).read_text())
    except (OSError, ValueError):
        return None
