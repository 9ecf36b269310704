"""
An out_dir belongs to one run, and holds its files: ckpt.pt (checkpoint.py writes it),
log.jsonl (one line per evaluation), train_log.jsonl (one per step) and run.json.

train.py takes out_dir with claim(): an advisory lock held for the whole run (flock: the
operating system releases it when the process ends, however it ends, so a SIGKILL never
leaves a stale lock), and a run from scratch never replaces a checkpoint that is already
there unless asked to, and then moves the old run aside instead of deleting it. A write that
fails (a full disk) is one line naming the last good checkpoint. An evaluation's log line goes
to Weights & Biases too, when asked, under nanoGPT's keys (wandb_record). run.json records the
code the run trained with (code_version: the git commit, a hash of uncommitted changes, a hash
of the code files themselves), and the code of earlier segments where a resume changed it.
"""

import ast
import errno
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from nanohfa.data import write_atomic
from nanohfa.errors import UserError

RUN_FILES = ('ckpt.pt', 'log.jsonl', 'train_log.jsonl', 'run.json')  # with ckpt_<iter>.pt: one run's files
# the files a run opens for writing in place (ckpt.pt itself and run.json are renamed over: a
# rename replaces a link, never writes through it)
WRITTEN_IN_PLACE = ('.lock', 'log.jsonl', 'train_log.jsonl', 'ckpt.pt.tmp')
ROOT = Path(__file__).resolve().parents[1]  # the checkout: the scripts, data/ and cache/ beside this package


def linked(path):
    """The refusal of a run file that is a symbolic link."""
    return (f"{path} is a symbolic link (to {os.readlink(path)}): a run writes its files in place, never through "
            f"a link, which would aim its writes at another file; remove the link, or choose another --out_dir")


def open_in_place(path, flags, mode=0o666):
    """os.open of a file in a run folder that never follows a symbolic link: anyone who can create
    the folder first (shared scratch) or hands over a run folder could otherwise aim this run's
    writes at a file of their choosing."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(linked(path)) from None
        raise


def append_in_place(path):
    """A file in a run or grid folder opened for appending text, never through a link."""
    return os.fdopen(open_in_place(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), 'a')


def _lock(path, out_dir):
    """The lock file, opened and locked; a run holding it already is named in the refusal."""
    f = os.fdopen(open_in_place(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), 'a+')
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'a process that is starting'
        f.close()
        raise UserError(f"out_dir {out_dir!r} is in use by another run ({holder}); wait for it to end, "
                        f"or choose another --out_dir")
    return f


def claim(out_dir, fresh, overwrite):
    """Take out_dir for this run and return the open lock file (keep it for the run's lifetime).
    fresh: the run starts from scratch (or from other weights), so a checkpoint there would be
    replaced: refused, or with overwrite moved to out_dir/replaced-<time>/ with the run's logs."""
    out = Path(out_dir)
    lock = None
    for name in WRITTEN_IN_PLACE + ('run.json',):  # before anything is claimed or moved aside
        if (out / name).is_symlink():
            raise UserError(linked(out / name))
    try:
        if (out / '.lock').exists():  # a running run is the first thing to report
            lock = _lock(out / '.lock', out_dir)
        old = out / 'ckpt.pt'
        if fresh and old.exists() and not overwrite:
            raise UserError(f"out_dir {out_dir!r} already holds a run (ckpt.pt saved "
                            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(old.stat().st_mtime))}); continue it "
                            f"with --init_from=resume, train into another --out_dir, or start over with "
                            f"--overwrite=True (the old run is moved aside, not deleted)")
        out.mkdir(parents=True, exist_ok=True)
        lock = lock or _lock(out / '.lock', out_dir)
        if fresh and old.exists():
            aside = out / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
            aside.mkdir()
            for p in [out / name for name in RUN_FILES] + sorted(out.glob('ckpt_*.pt')):
                if p.exists():
                    os.replace(p, aside / p.name)
            print(f"overwrite=True: the previous run's checkpoint and logs moved to {aside}")
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                   f"{' '.join(sys.argv)}\n")
        lock.flush()
    except OSError as e:
        raise UserError(f"out_dir {out_dir!r} cannot be written ({e.strerror}); choose another --out_dir")
    return lock


def write_failed(e, what, out, saved_iter):
    """A full disk (or another write error) while writing `what` into the run folder `out`: one
    line, naming the last checkpoint (of iteration saved_iter; None: none saved yet)."""
    kept = (f"the last good checkpoint {Path(out) / 'ckpt.pt'} (iteration {saved_iter}) is untouched; free some "
            f"space and continue with --init_from=resume" if saved_iter is not None else
            "no checkpoint of this run had been saved yet; free some space and start again")
    # torch's zip writer reports a failed write as its own RuntimeError ("unexpected pos ...");
    # the OSError behind it (ENOSPC on a full disk) is what the user needs to read
    cause = next((c for c in (e, e.__context__, e.__cause__) if isinstance(c, OSError)), None)
    reason = getattr(cause, 'strerror', None) or str(cause or e)  # ENOSPC: "No space left on device"
    return UserError(f"could not write {what} ({reason}); {kept}")


def append_jsonl(path, record, saved_iter):
    """One JSON line appended to a log in the run folder (saved_iter: for write_failed)."""
    try:
        with append_in_place(path) as f:
            f.write(json.dumps(record) + '\n')
    except OSError as e:
        raise write_failed(e, path, Path(path).parent, saved_iter)


def trim_jsonl(path, keep):
    """On resume, drop log lines written after the checkpoint (they will be redone)."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l.strip() and keep(json.loads(l))]
        write_atomic(path, ''.join(l + '\n' for l in lines).encode(), durable=False)


def code_files(root=ROOT):
    """The code train.py runs: train.py, the modules of `root` it imports, directly or through
    another (read by ast, wherever the import stands), and the whole of attention_kernels/ (whose
    kernels are imported by name at run time)."""
    root = Path(root)
    files, todo = set(), [root / 'train.py'] + sorted(root.glob('attention_kernels/**/*.py'))
    while todo:
        path = todo.pop()
        if path in files or not path.exists():
            continue
        files.add(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                todo += [f for a in node.names for f in _module_files(root, a.name)]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                todo += _module_files(root, node.module)
                todo += [f for a in node.names for f in _module_files(root, f'{node.module}.{a.name}')]
    return sorted(files)


def _module_files(root, name):
    """The files under `root` that importing module `name` ('nanohfa.data') runs: its own, and its
    packages' __init__.py (none for a module that is not the project's)."""
    parts = name.split('.')
    out = [root.joinpath(*parts[:k], '__init__.py') for k in range(1, len(parts) + 1)]
    return out + [root.joinpath(*parts).with_suffix('.py')]


def code_version(root=ROOT):
    """The code train.py runs (code_files): the git commit (None outside a git checkout), a hash of
    the uncommitted changes to those files (None when there are none), and a hash of the files
    themselves, which decides whether two segments of a run ran the same code. A change elsewhere
    (the launchers, bench.py, docs, tests) changes neither hash."""
    root = Path(root)
    files = code_files(root)
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(root).as_posix().encode() + b'\0' + f.read_bytes() + b'\0')

    def git(*cmd):
        try:
            r = subprocess.run(['git', '-C', str(root), *cmd], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout if r.returncode == 0 else None
    commit = git('rev-parse', 'HEAD')
    changes = None
    if commit:
        paths = [f.relative_to(root).as_posix() for f in files]
        diff = git('diff', 'HEAD', '--binary', '--', *paths) or b''
        new = (git('ls-files', '--others', '--exclude-standard', '-z', '--', *paths) or b'').split(b'\0')
        diff += b''.join(n + b'\0' + (root / n.decode()).read_bytes() for n in new if n)
        changes = hashlib.sha256(diff).hexdigest()[:16] if diff else None
    return {'commit': commit.decode().strip() if commit else None, 'changes': changes,
            'files': digest.hexdigest()[:16]}


def code_text(code):
    """A code record as one reads it: commit abc123def456 (+ uncommitted changes 0f3a...)."""
    if not code:
        return 'unrecorded code'
    text = f"commit {code['commit'][:12]}" if code.get('commit') else f"code {code['files']} (no git commit)"
    return text + (f" + uncommitted changes {code['changes']}" if code.get('changes') else '')


def start_logs(out, run, resumed_at=None, evaluated=False):
    """The run's logs at its start. Resumed at iteration resumed_at: the lines logged after the
    checkpoint are dropped (those steps, and that iteration's evaluation unless `evaluated`,
    will be done again); from scratch: no old logs. run.json gets `run` (config, model, sizes) and
    the code this segment runs; a resumed run that ran other code before keeps that under code_before."""
    out = Path(out)
    run = {**run, 'code': code_version()}
    if resumed_at is not None:
        try:
            before = json.loads((out / 'run.json').read_text())
        except (OSError, json.JSONDecodeError):
            before = {}
        earlier = before.get('code_before', []) + [before['code']] if before.get('code') else []
        if before.get('code') and before['code']['files'] != run['code']['files']:
            print(f"resuming on other code than this run's last segment ({code_text(run['code'])} now, "
                  f"{code_text(before['code'])} then); run.json keeps both")
        if any(c['files'] != run['code']['files'] for c in earlier):
            run['code_before'] = [c for c in earlier if c['files'] != run['code']['files']]
    try:
        if resumed_at is not None:
            trim_jsonl(out / 'log.jsonl', lambda r: r['iter'] < resumed_at + evaluated)
            trim_jsonl(out / 'train_log.jsonl', lambda r: r['iter'] < resumed_at)
        else:
            for name in ('log.jsonl', 'train_log.jsonl'):
                (out / name).unlink(missing_ok=True)
        write_atomic(out / 'run.json', json.dumps(run, indent=1).encode(), durable=False)
    except OSError as e:
        raise write_failed(e, f"the logs in {out}", out, resumed_at)


def wandb_record(rec):
    """An evaluation under nanoGPT's wandb keys (iter, train/loss, val/loss, lr, mfu in percent),
    with val/ppl, tokens, tokens_per_s and train/grad_norm (the last step's, before clipping)
    beside them."""
    keys = {'iter': 'iter', 'train_loss': 'train/loss', 'val_loss': 'val/loss', 'val_ppl': 'val/ppl',
            'lr': 'lr', 'tokens': 'tokens', 'tokens_per_s': 'tokens_per_s', 'grad_norm': 'train/grad_norm'}
    logged = {name: rec[k] for k, name in keys.items() if rec.get(k) is not None}
    if rec.get('mfu') is not None:
        logged['mfu'] = 100 * rec['mfu']
    return logged
