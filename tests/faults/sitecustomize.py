"""Faults for train.py wherever it is started: a test puts this folder on PYTHONPATH with the
NANOHFA_TEST_* variables of tests/train_hooks.py, and every train.py below it (started by compare.py,
by a SLURM job, by torchrun) runs with those hooks installed, as under `python tests/train_hooks.py
train.py`. Any other program started with this folder on its path is left alone, except:

NANOHFA_TEST_STALE_NODE=K: in SLURM job processes on node K (SLURM_NODEID) other than train.py (the
launcher's TrainJob), a file named ckpt.pt looks absent, as on a shared filesystem whose cached view
of the run folder on that node is older than the checkpoint.
"""
import os
import sys

if sys.argv and os.path.basename(sys.argv[0]) == 'train.py' and any(k.startswith('NANOHFA_TEST_') for k in os.environ):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import train_hooks
    sys.path.pop(0)
    train_hooks.install()

elif os.environ.get('NANOHFA_TEST_STALE_NODE') is not None and \
        os.environ.get('SLURM_NODEID') == os.environ['NANOHFA_TEST_STALE_NODE'] and \
        'submitit' in ' '.join(getattr(sys, 'orig_argv', sys.argv)):
    import pathlib
    _exists = pathlib.Path.exists
    pathlib.Path.exists = lambda self, *a, **kw: False if self.name == 'ckpt.pt' else _exists(self, *a, **kw)
