"""Shared by every test: the repository root is importable (model.py, attention_kernels/) however
pytest is invoked, and the session leaves no trace.

- attention_kernels is loaded first: on a machine without CUDA it imports triton with the interpreter
  on (TRITON_INTERPRET for that import only), which must happen before anything else imports
  triton, so that the Triton kernels can be tested on CPU tensors. On Linux a triton that cannot
  be used fails the session with one line (the Triton tests would otherwise skip and a run
  be green with no kernel tested); elsewhere (macOS, Windows: no triton wheel) they skip.

- Caches live in one temporary folder for the session: ours (NANOHFA_CACHE), tiktoken's,
  Hugging Face's (its module cache too, where transformers copies a folder's code), wandb's,
  matplotlib's, pip's, triton's. They are set in this process's
  environment, which the scripts the tests start inherit; the user's shell is untouched and
  the folder is removed at the end. No test reaches the Hugging Face Hub (offline mode on;
  a test that checks the offline probe itself takes these variables out for its subprocess).
- Every test must leave torch's default dtype, its thread count and the environment as it
  found them (`_leaves_global_state_alone`); a test that changes one fails in its teardown.
- `slow` marks the tests that start subprocesses (train.py, bench.py, compare.py, torchrun),
  run the Triton interpreter or torch.compile, or compute for seconds (the experiments'
  --quick runs, training loops); `make test-fast` leaves them out (`-m "not slow"`) and so
  runs the model and kernel specification; `make test` (CI) runs everything.
- `slurm_cluster` starts a real SLURM cluster on this machine (munged, slurmctld, three slurmd; tests/slurm_cluster.py)
  once per session for the tests that ask for it, and stops it by its pids at the end. Without the
  binaries (apt-get install -y slurm-wlm munge, as root) those tests skip, or fail under CI=true.
"""
import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SESSION_DIR = tempfile.mkdtemp(prefix='nanohfa-tests-')
_ENV_BEFORE = dict(os.environ)
SESSION_ENV = {
    'NANOHFA_CACHE': os.path.join(SESSION_DIR, 'nanohfa'),
    'TIKTOKEN_CACHE_DIR': os.path.join(SESSION_DIR, 'nanohfa', 'tiktoken'),
    'HF_HOME': os.path.join(SESSION_DIR, 'hf'),
    'HF_HUB_CACHE': os.path.join(SESSION_DIR, 'hf', 'hub'),
    'HF_DATASETS_CACHE': os.path.join(SESSION_DIR, 'hf', 'datasets'),
    'HF_MODULES_CACHE': os.path.join(SESSION_DIR, 'hf', 'modules'),  # remote code of the exported folders
    'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'TRANSFORMERS_OFFLINE': '1',
    'WANDB_MODE': 'offline', 'WANDB_DIR': os.path.join(SESSION_DIR, 'wandb'),
    'WANDB_CACHE_DIR': os.path.join(SESSION_DIR, 'wandb', 'cache'),
    'WANDB_CONFIG_DIR': os.path.join(SESSION_DIR, 'wandb', 'config'),
    'WANDB_DATA_DIR': os.path.join(SESSION_DIR, 'wandb', 'data'),
    'MPLCONFIGDIR': os.path.join(SESSION_DIR, 'matplotlib'),
    'PIP_CACHE_DIR': os.path.join(SESSION_DIR, 'pip'),
    'TRITON_CACHE_DIR': os.path.join(SESSION_DIR, 'triton'),
    'TORCHINDUCTOR_CACHE_DIR': os.path.join(SESSION_DIR, 'inductor'),
    'XDG_CACHE_HOME': os.path.join(SESSION_DIR, 'xdg'),
    'HF_HUB_DISABLE_TELEMETRY': '1',
}
os.environ.update(SESSION_ENV)
for d in ('WANDB_DIR', 'MPLCONFIGDIR'):
    os.makedirs(SESSION_ENV[d], exist_ok=True)

# GPT-2's ranks, if this checkout already holds them, are copied (read, not written) so the
# session need not fetch them again; tokenizer.py checks their sha256 either way
_ranks = os.path.join(ROOT, 'cache', 'tiktoken')
if os.path.isdir(_ranks):
    shutil.copytree(_ranks, SESSION_ENV['TIKTOKEN_CACHE_DIR'], dirs_exist_ok=True)


def pytest_configure(config):
    if TRITON_ERROR and sys.platform == 'linux':
        raise pytest.UsageError(f"{TRITON_ERROR}; on Linux the Triton kernels must be tested: "
                                f"install requirements.txt (make venv)")
    config.addinivalue_line('markers', 'slow: subprocesses, the Triton interpreter, torch.compile or seconds of '
                                      'computing (left out by make test-fast)')


def pytest_unconfigure(config):
    shutil.rmtree(SESSION_DIR, ignore_errors=True)
    os.environ.clear()
    os.environ.update(_ENV_BEFORE)


def _state():
    import torch
    env = {k: v for k, v in os.environ.items() if k != 'PYTEST_CURRENT_TEST'}  # pytest's own, per phase
    return torch.get_default_dtype(), torch.get_num_threads(), env


import attention_kernels  # noqa: E402

TRITON_ERROR = attention_kernels.load_triton()
try:  # scikit-learn sets KMP_DUPLICATE_LIB_OK on its first import (lm-eval's metrics import it):
    import sklearn  # noqa: E402, F401  imported once here, so no test is blamed for that import
except ImportError:
    pass
_STATE_AT_START = _state()


def _changes(before, after):
    (dtype, threads, env), (dtype2, threads2, env2) = before, after
    keys = sorted(k for k in env.keys() | env2.keys() if env.get(k) != env2.get(k))
    return [f"default dtype {dtype} -> {dtype2}"] * (dtype != dtype2) + \
        [f"threads {threads} -> {threads2}"] * (threads != threads2) + \
        [f"environment variables {keys}"] * bool(keys)


def pytest_collection_finish(session):
    """Importing a test module (and what it imports) must not change global state either."""
    changed = _changes(_STATE_AT_START, _state())
    if changed:
        raise pytest.UsageError(f"importing the test modules changed global state: {'; '.join(changed)}")


@pytest.fixture(scope='module')
def one_thread():
    """Tiny tensors: one thread is faster and does not fight the other jobs on the machine
    (a module's tests ask for it with pytestmark = pytest.mark.usefixtures('one_thread'))."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _leaves_global_state_alone():
    before = _state()
    yield
    changed = _changes(before, _state())
    assert not changed, f"the test changed global state: {'; '.join(changed)}"


@pytest.fixture(scope='session')
def slurm_cluster():
    """A real SLURM cluster on this machine for the session (tests/slurm_cluster.py), stopped at the end.
    Without SLURM the tests that use it skip with one line, except under CI=true, where they fail."""
    import slurm_cluster as cluster
    why = cluster.missing()
    if why:
        if os.environ.get('CI') == 'true':
            pytest.fail(f"{why} (CI must run the SLURM tests)", pytrace=False)
        pytest.skip(why)
    with cluster.SlurmCluster() as c:
        yield c
