"""
Token files on disk, for data.py: nanoGPT's one <split>.bin, or shards in llm.c's format.

A split is `<split>.bin`, or every file of the folder named `<split>_*.bin` or `*_<split>_*.bin`
(ours: train_000000.bin; llm.c's and modded-nanogpt's: fineweb_train_000001.bin), in name
order. A file is headerless uint16 tokens (nanoGPT's), or llm.c's format: a header of 256
int32 (magic 20240520, version 1, the token count) and then uint16 tokens; magic 20240801,
version 7, marks uint32 tokens (LLaMA-3's vocabulary). A headerless GPT-2 file cannot be taken
for a headered one: the magic would be its first two tokens, 54,216 and 308, and GPT-2 has
50,257. A split is one sequence: its files end to end (Tokens), so the same tokens as one file
or as shards give the same windows. Only headers are read when a split opens; a window is read
from its file(s) when drawn (os.pread), through a pool of at most MAX_OPEN descriptors (fewer
under a low `ulimit -n`): FineWeb's thousands of shards open under the common limit of 1,024,
and nothing stays mapped, so resident memory does not grow with the tokens read.

Shards are written (write_split) in llm.c's format, each to a temporary name and flushed to
disk; a progress file then records it and where the next one starts (document, and tokens of
it already written), and only then is it renamed into place. A preparation killed after shard k
starts again at shard k+1: it tokenizes nothing before that point again and rewrites no shard.
"""

import bisect
import errno
import functools
import json
import os
import re
import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np

from nanohfa.errors import UserError

try:  # imported now: with no descriptor left, an import would fail where it is needed
    import resource
except ImportError:
    resource = None

HEADER_INTS = 256  # llm.c's header: 256 int32, of which [0] magic, [1] version, [2] token count
FORMATS = {20240520: (1, np.dtype('<u2')), 20240801: (7, np.dtype('<u4'))}  # magic: (version, tokens)
GPT2_MAGIC = 20240520
SHARD_TOKENS = 100_000_000  # llm.c's FineWeb shards hold 100M tokens; ours do by default
MAX_SHARD_TOKENS = 2 ** 31 - 1  # the header's token count is an int32
MAX_OPEN = 1024  # token files held open at once, per process (a quarter of `ulimit -n` at most)
PROGRESS = 'prepare.json'   # in a folder being prepared: the settings and how far it got


def split_files(folder, split):
    """The files of one split, in name order: <split>.bin, or the shards <split>_*.bin and
    *_<split>_*.bin. Both at once is refused: which one is meant cannot be guessed."""
    folder = Path(folder)
    one = folder / f'{split}.bin'
    try:
        shards = sorted(p for p in folder.iterdir() if re.fullmatch(rf'(.+_)?{split}_.+\.bin', p.name))
    except (FileNotFoundError, NotADirectoryError):  # no such folder: nothing in it
        shards = []
    except OSError as e:  # there, but not listed (no descriptor left, no permission): said as such
        raise UserError(_unreadable(folder, e))
    if shards and one.exists():
        raise UserError(f"{folder} holds both {one.name} and {len(shards)} {split} shard(s) ({shards[0].name}, ...); "
                        f"a split is one or the other: move one of them out of the folder")
    return shards or ([one] if one.exists() else [])


class File(NamedTuple):
    """One token file, its header checked: where its tokens start (bytes), how many, of what width."""
    path: Path
    magic: Optional[int]  # None: headerless uint16 (nanoGPT's)
    dtype: np.dtype
    offset: int
    count: int


def token_file(path):
    """One token file's header (or its size, headerless), checked; nothing is kept open."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, 'rb') as f:
            head = np.frombuffer(f.read(12), dtype='<i4')
    except OSError as e:
        raise UserError(_unreadable(path, e))
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
        return File(path, magic, dtype, header, count)
    if version in (1, 7) and count > 0 and size in (header + 2 * count, header + 4 * count):
        raise UserError(f"{path} has an llm.c header with magic {magic}, not 20240520 (uint16 tokens) or 20240801 "
                        f"(uint32 tokens): not a token shard, or a corrupt one; download or prepare it again")
    if size == 0 or size % 2:  # uint16 tokens: 2 bytes each
        raise UserError(f"{path} holds {size:,} bytes, {'nothing' if not size else 'an odd number'}: not a file of "
                        f"uint16 tokens (cut short?); re-run the prepare script")
    return File(path, None, np.dtype('<u2'), 0, size // 2)


def _unreadable(path, e):
    if e.errno == errno.EMFILE:  # not the file's fault: the process's limit on open files
        return (f"{path} cannot be opened: this process has too many files open (ulimit -n "
                f"{_soft_limit()}); raise it (ulimit -n 4096) or close what else holds files")
    return (f"{path} cannot be read ({e.strerror or e}); check that the file is there and readable "
            f"(under torchrun: on every node)")


def _soft_limit():
    """The process's limit on open files (`ulimit -n`)."""
    if resource is None:  # not Unix
        return 1024
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class _OpenFiles:
    """The token files a process reads from, open read-only: at most a fixed share of the
    process's open-file limit, the least recently read closed first. A split of thousands of
    shards (FineWeb's) so never holds a descriptor per shard, and reads (os.pread) keep no
    pages mapped: resident memory stays flat however many tokens are read."""

    def __init__(self):
        self.fds, self.lock = OrderedDict(), threading.Lock()

    def limit(self):
        return max(4, min(MAX_OPEN, _soft_limit() // 4))

    def read(self, f, start, stop):
        """Tokens start..stop (0 <= start <= stop <= f.count) of the File f, a fresh array."""
        out = np.empty(stop - start, f.dtype)
        buf, at = memoryview(out).cast('B'), f.offset + start * f.dtype.itemsize
        with self.lock:  # a descriptor is never closed under a read
            fd = self._fd(f.path)
            done = 0
            try:
                while done < len(buf):
                    n = os.preadv(fd, [buf[done:]], at + done) if hasattr(os, 'preadv') else \
                        _copy_into(buf[done:], os.pread(fd, len(buf) - done, at + done))
                    if n == 0:
                        raise UserError(f"{f.path} ended before its {f.count:,} tokens (cut short or replaced while "
                                        f"training?); download or prepare it again")
                    done += n
            except OSError as e:
                self.close(f.path)
                raise UserError(_unreadable(f.path, e))
        return out

    def _fd(self, path):
        if path in self.fds:
            self.fds.move_to_end(path)
            return self.fds[path]
        while len(self.fds) >= self.limit():
            os.close(self.fds.popitem(last=False)[1])
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            if e.errno != errno.EMFILE or not self.fds:
                raise UserError(_unreadable(path, e))
            self.close_all()  # the rest of the process took the descriptors: give ours back and retry
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise UserError(_unreadable(path, e))
        self.fds[path] = fd
        return fd

    def close(self, path):
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_all(self):
        while self.fds:
            os.close(self.fds.popitem()[1])

    def __len__(self):
        return len(self.fds)


def _copy_into(buf, data):
    buf[:len(data)] = data
    return len(data)


OPEN = _OpenFiles()  # one pool for the process: every split's files together


def read(f, start=0, stop=None):
    """Tokens start..stop of one File (default: all of it), read into a fresh array."""
    stop = f.count if stop is None else stop
    return OPEN.read(f, start, stop)


class Tokens:
    """A split as one sequence: its files end to end. Offsets run over the whole, so a window
    may cross from one shard into the next, exactly as it would in one file of the same tokens.
    A slice is read from the files (a fresh array), through a bounded pool of descriptors."""

    def __init__(self, files):
        self.entries = files
        self.files, self.magic, self.dtype = [f.path for f in files], files[0].magic, files[0].dtype
        self.starts = np.cumsum([0] + [f.count for f in files]).tolist()

    def __len__(self):
        return self.starts[-1]

    def __getitem__(self, s):
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("Tokens takes slices with step 1")
        start, stop, _ = s.indices(len(self))
        if stop <= start:
            return np.empty(0, self.dtype)
        i = bisect.bisect_right(self.starts, start) - 1  # the file that holds `start` (start < len)
        pieces = []
        while start < stop:
            end = min(stop, self.starts[i + 1])
            pieces.append(read(self.entries[i], start - self.starts[i], end - self.starts[i]))
            start, i = end, i + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


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
    opened = [token_file(p) for p in files]
    magics = {f.magic for f in opened}
    if len(magics) > 1:
        kinds = {}  # the first file of each kind, in name order
        for f in opened:
            kinds.setdefault(f.magic, f.path.name)
        raise UserError(f"the {split} files of {folder} are of different kinds: " + ', '.join(
            f"{name} {describe(m)}" for m, name in kinds.items()) + "; a split needs one tokenizer and one token "
            f"width: keep the files of one preparation")
    for f in opened:
        if listed and f.count != want[f.path.name]:
            raise UserError(f"{f.path} holds {f.count:,} tokens but meta.json lists {want[f.path.name]:,}; the files "
                            f"come from different preparations: prepare the data again")
    return Tokens(opened)


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
