"""
An out_dir belongs to one run. train.py takes it with claim(): an advisory lock held for the
whole run (flock: the operating system releases it when the process ends, however it ends,
so a SIGKILL never leaves a stale lock), and a run from scratch never replaces a checkpoint
that is already there unless asked to, and then moves the old run aside instead of deleting it.
"""

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from errors import UserError

RUN_FILES = ('ckpt.pt', 'log.jsonl', 'train_log.jsonl', 'run.json')  # with ckpt_<iter>.pt: one run's files


def _lock(path, out_dir):
    """The lock file, opened and locked; a run holding it already is named in the refusal."""
    f = open(path, 'a+')
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
