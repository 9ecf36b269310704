"""
Runs a script (train.py) with test hooks installed from outside; the script knows nothing of
them. For the tests only:

    NANOHFA_TEST_DIE_AT=ITER[:RANK[:WHERE]] python tests/train_hooks.py train.py --key=value ...
    NANOHFA_TEST_READS=events.json python tests/train_hooks.py train.py ...
    NANOHFA_TEST_UNREADABLE=RANK:NAME python tests/train_hooks.py train.py ...
    NANOHFA_TEST_SLOW_STEPS=SECONDS / NANOHFA_TEST_SLOW_START=SECONDS / NANOHFA_TEST_SLOW_SAVE=SECONDS
    NANOHFA_TEST_HOLD_AT=ITER[:SECONDS] python tests/train_hooks.py train.py ...

NANOHFA_TEST_DIE_AT: process RANK (default 0) sends itself SIGKILL at the start of iteration
ITER (WHERE=step, the default: that iteration's first training forward), halfway through
writing that iteration's checkpoint (save: torch.save writes it, then the file is cut to half
its size), or sends itself SIGTERM during that iteration's step (term); with WHERE=full, that
iteration's checkpoint meets a full disk instead (every write past its first 256 bytes raises
OSError ENOSPC, as on a real one, where torch's writer then raises "unexpected pos ..."), and with
WHERE=nospace a disk with no space left (every write raises ENOSPC). The iteration is
train.py's own `iter_num`, read from its globals while it runs.

NANOHFA_TEST_READS: every host read of a tensor (item, tolist, cpu, numpy, float, int, bool)
made by the script's own lines, every training forward and every optimizer step are written
in order to that file at exit: [kind, iteration, 'file:line'].

NANOHFA_TEST_UNREADABLE=RANK:NAME: process RANK gets PermissionError opening any file named NAME
(a shard missing or unreadable on one node only).

NANOHFA_TEST_SLOW_STEPS=SECONDS: every training forward first sleeps SECONDS (a machine slow enough
for the run to reach its time limit), in a SLURM job's first segment only (SLURM_RESTART_COUNT unset
or 0): the requeued segment runs at full speed. The numbers are those of a run without the hook.

NANOHFA_TEST_SLOW_START=SECONDS: train.py sleeps SECONDS before it starts (a start longer than a
SLURM time limit: nothing trains, and a signal in the meantime kills it).

NANOHFA_TEST_SLOW_SAVE=SECONDS: a checkpoint written after a stop signal (train.py's stop_signal
set) takes SECONDS longer, spent with ckpt.pt.tmp open (a large checkpoint on a slow filesystem).

NANOHFA_TEST_HOLD_AT=ITER[:SECONDS]: in a process that trains from scratch (not a resumed one), the
training forward of iteration ITER waits until the process has its stop signal (train.py's
stop_signal set), for at most SECONDS (default 120), so that a signal sent once an earlier
checkpoint exists lands mid-run however loaded the machine is. Waiting in vain
prints one line to stderr ("HOLD_AT: no stop signal ..."), which a test can look for.

Under torchrun: `torchrun ... tests/train_hooks.py train.py ...`. Launched by compare.py or a SLURM
job: tests/faults/ on PYTHONPATH installs these hooks in every train.py (its sitecustomize.py).
"""

import atexit
import errno
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script():
    return sys.modules['__main__']  # the running script's module, while runpy runs it


def die_at(at, rank=0, where='step'):
    if int(os.environ.get('RANK', 0)) != rank:
        return
    import torch
    from model import GPT
    if where in ('full', 'nospace'):
        save, room = torch.save, 256 if where == 'full' else 0

        class FillingDisk:
            """The checkpoint file on a disk that fills halfway through it (full: a write past the
            first 256 bytes) or has no space left (nospace: every write) raises the OSError a full
            disk raises (ENOSPC), and torch's writer reports it."""
            def __init__(self, f):
                self.f, self.written = f, 0

            def write(self, b):
                if self.written + len(b) > room:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.written += len(b)
                return self.f.write(b)

            def flush(self):
                self.f.flush()

        def save_onto_a_full_disk(obj, f, *args, **kw):
            full = isinstance(obj, dict) and obj.get('iter_num') == at
            return save(obj, FillingDisk(f) if full else f, *args, **kw)
        torch.save = save_onto_a_full_disk
        return
    if where == 'save':
        save = torch.save

        def save_then_crash(obj, f, *args, **kw):
            save(obj, f, *args, **kw)
            if isinstance(obj, dict) and obj.get('iter_num') == at:
                f.flush()
                f.truncate(f.tell() // 2)
                os.kill(os.getpid(), signal.SIGKILL)
        torch.save = save_then_crash
        return
    forward, sent = GPT.forward, []

    def forward_then_fault(self, *args, **kw):
        if self.training and getattr(script(), 'iter_num', None) == at and not sent:
            sent.append(where)
            os.kill(os.getpid(), signal.SIGKILL if where == 'step' else signal.SIGTERM)
        return forward(self, *args, **kw)
    GPT.forward = forward_then_fault


def unreadable(rank, name):
    """Process RANK cannot open files named NAME: a shard missing or unreadable on its node alone."""
    if int(os.environ.get('RANK', 0)) != rank:
        return
    import builtins
    real_open = builtins.open

    def refusing_open(file, *args, **kw):
        if os.path.basename(str(file)) == name:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kw)
    builtins.open = refusing_open


def slow_steps(seconds):
    if int(os.environ.get('SLURM_RESTART_COUNT') or 0):
        return
    from model import GPT
    forward = GPT.forward

    def slow_forward(self, *args, **kw):
        if self.training:
            time.sleep(seconds)
        return forward(self, *args, **kw)
    GPT.forward = slow_forward


def slow_save(seconds):
    import torch
    save = torch.save

    def save_slowly_after_a_stop(obj, f, *args, **kw):
        if isinstance(obj, dict) and 'iter_num' in obj and getattr(script(), 'stop_signal', None) is not None:
            time.sleep(seconds)
        return save(obj, f, *args, **kw)
    torch.save = save_slowly_after_a_stop


def hold_at(at, seconds):
    from model import GPT
    forward, held, first = GPT.forward, [], []

    def forward_held(self, *args, **kw):
        if self.training and not first:
            first.append(getattr(script(), 'iter_num', None))
        if self.training and first[0] == 0 and getattr(script(), 'iter_num', None) == at and not held:
            held.append(at)
            deadline = time.time() + seconds
            while getattr(script(), 'stop_signal', None) is None and time.time() < deadline:
                time.sleep(0.05)
            if getattr(script(), 'stop_signal', None) is None:
                print(f"HOLD_AT: no stop signal in {seconds:g} s at iteration {at}; going on", file=sys.stderr, flush=True)
        return forward(self, *args, **kw)
    GPT.forward = forward_held


def record_reads(path):
    import torch
    from model import GPT
    events, mine = [], os.path.realpath(sys.argv[0])

    def note(kind, frame=None):
        where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame else ''
        events.append([kind, getattr(script(), 'iter_num', None), where])

    def reading(name):
        read = getattr(torch.Tensor, name)

        def wrapped(self, *args, **kw):
            caller = sys._getframe(1)
            if os.path.realpath(caller.f_code.co_filename) == mine:
                note('read', caller)
            return read(self, *args, **kw)
        setattr(torch.Tensor, name, wrapped)
    for name in ('item', 'tolist', 'cpu', 'numpy', '__float__', '__int__', '__bool__'):
        reading(name)
    forward = GPT.forward

    def counted_forward(self, *args, **kw):
        if self.training:
            note('forward')
        return forward(self, *args, **kw)
    GPT.forward = counted_forward
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(lambda *_: note('optimizer_step'))
    atexit.register(lambda: Path(path).write_text(json.dumps(events)))


def install():
    """The hooks the environment names, installed in this process (before the script runs, whose
    folder its imports come from: a copy of the checkout imports its own model.py)."""
    root = str(Path(sys.argv[0]).resolve().parent)
    sys.path.insert(0, root)
    if os.environ.get('NANOHFA_TEST_SLOW_START'):
        time.sleep(float(os.environ['NANOHFA_TEST_SLOW_START']))
    if os.environ.get('NANOHFA_TEST_SLOW_STEPS'):
        slow_steps(float(os.environ['NANOHFA_TEST_SLOW_STEPS']))
    if os.environ.get('NANOHFA_TEST_SLOW_SAVE'):
        slow_save(float(os.environ['NANOHFA_TEST_SLOW_SAVE']))
    if os.environ.get('NANOHFA_TEST_HOLD_AT'):
        at, seconds = (os.environ['NANOHFA_TEST_HOLD_AT'].split(':') + [''])[:2]
        hold_at(int(at), float(seconds or 120))
    if os.environ.get('NANOHFA_TEST_DIE_AT'):
        at, rank, where = (os.environ['NANOHFA_TEST_DIE_AT'].split(':') + ['', ''])[:3]
        die_at(int(at), int(rank or 0), where or 'step')
    if os.environ.get('NANOHFA_TEST_UNREADABLE'):
        rank, name = os.environ['NANOHFA_TEST_UNREADABLE'].split(':', 1)
        unreadable(int(rank), name)
    if os.environ.get('NANOHFA_TEST_READS'):
        record_reads(os.environ['NANOHFA_TEST_READS'])
    sys.path.remove(root)


def main():
    sys.argv = sys.argv[1:]  # the script and its arguments, as if it were run directly
    sys.path[0] = str(ROOT)
    install()
    runpy.run_path(sys.argv[0], run_name='__main__')


if __name__ == '__main__':
    main()
