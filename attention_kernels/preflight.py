"""
The preflight: every Triton kernel a run will use runs first in a child process, so that a
kernel that crashes, hangs or is wrong on this GPU costs one line and a few seconds, never
the run.

The in-process guard (guard.py) falls back when a kernel raises or disagrees with PyTorch;
it cannot survive an illegal memory access (the CUDA context is lost and the process dies,
under torchrun with every rank), a launch that never returns, or a compile that aborts. So
before the first training step, on CUDA with kernel='auto' or 'triton' and kernel_check=True:

- the caller says which heads the model has (`heads`: one plain dict per group of heads, its
  family, head count, factors, head size, windows...; model.kernel_heads builds them): this
  package knows nothing of the model;
- for each family whose Triton form the dispatch picks at the run's configuration class
  (family, dtype, head size, causal / window form, the tile table; the guard's class string,
  at the run's sequence length), a child process (`python -m attention_kernels.preflight`)
  runs that form's forward and backward on one sequence of two heads at the run's length and
  compares output and gradients with the PyTorch form in float64 (the guard's rule and
  tolerances). The children run at once, one per family. Each says on its stdout (a file)
  which stage it reached: 'ready' once torch and triton are imported, then 'fwd', 'bwd',
  'compare' while the kernel runs. The imports have their own budget (import_timeout, the
  setting preflight_import_timeout), the kernel the other (timeout,
  kernel_preflight_timeout);
- the verdict blames the kernel only for what the kernel did once running: a crash (a
  non-zero exit or a signal it raised itself: SIGABRT, SIGSEGV...), a hang past the timeout,
  an exception (compile or launch) or a mismatch. Those send the family to PyTorch
  (attention_kernels.use_pytorch) with one line naming the family, the stage, its
  configuration class and what happened, and are cached. What the machine did is not the
  kernel's: imports past their budget (a cold network file system), a child that died before
  the kernel ran, a signal from outside (SIGKILL: the out-of-memory killer; SIGTERM, SIGINT,
  SIGHUP), CUDA out of memory. Those too send the family to PyTorch for this run, with a
  line that says so, but are not cached: the next run checks again. kernel='triton' stops
  the run with the line instead, before anything is written;
- verdicts are cached per user, outside the checkout, in cache_dir()/preflight.json
  ($NANOHFA_CACHE, else $XDG_CACHE_HOME/nanohfa, else ~/.cache/nanohfa) per (GPU and compute
  capability, driver, torch, triton, a hash of attention_kernels' sources, configuration
  class and length), so a second run starts no child; a changed kernel or driver checks
  again. The file is read-merged-written under a lock (flock on preflight.json.lock) through
  a uniquely named temporary file, so runs on several nodes sharing a home folder add their
  verdicts without losing any; a cache that cannot be written is one warning, and the run
  goes on. `python -m attention_kernels.preflight --forget FAMILY` removes verdicts;
- a stop during the preflight (SIGTERM, SIGINT, SIGHUP to this process) kills the children
  before the process ends by that signal, and a child dies with its parent (Linux:
  PR_SET_PDEATHSIG), so no child keeps the GPU;
- under torchrun local rank 0 of each node runs it while the other ranks wait for it in the
  process group's start, for at most ddp_timeout: the two budgets must fit inside it, or the
  run stops with one line before anything runs. `agree` then all-reduces the verdicts, so a
  family that failed on any node uses PyTorch on every rank (DDP and FSDP never mix kernels).

Test hook: NANOHFA_PREFLIGHT_ENTRIES names a Python file whose ENTRIES dict ({family: fn},
fn with the family's Triton-form signature less strict/check) stands in for those families'
Triton forms in the child (the other families run their Triton kernels: in the interpreter on
CPU). The file joins the source hash, and the preflight then runs on any device (the tests
run it on CPU), with everything else (children, timeout, comparison, cache, dispatch) the
code a GPU run uses.

    python -m attention_kernels.preflight --report out.json   # GPT-2-small classes (gpu_check.sh)
    python -m attention_kernels.preflight --forget ha         # check HA's classes again next run
"""

import functools
import hashlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import attention_kernels
from attention_kernels import guard

TIMEOUT_S = 120  # per child, from its imports done to its verdict: compiling a family's kernels + the check
START_S = 120  # per child, for its imports (torch, triton: tens of seconds on a cold network file system)
MARGIN_S = 30  # under torchrun, beyond the two budgets: the children's start and end, the process group's start
LOCK_WAIT_S = 30  # for the cache's lock: a writer holds it for milliseconds
ENTRIES_ENV = 'NANOHFA_PREFLIGHT_ENTRIES'
ROOT = Path(__file__).resolve().parent.parent
CACHE_FILE = 'preflight.json'
KERNEL_STAGES = ('fwd', 'bwd', 'compare')  # the kernel is running (compare: the float64 reference after it)
OUTSIDE = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # sent to a child, not raised by it
CUDA_ERRORS = {  # torch says the CUDA error's text; the line also gives its number, which searches find
    'an illegal memory access': ('illegal memory access', 700), 'misaligned address': ('misaligned address', 716),
    'illegal instruction': ('illegal instruction', 715), 'too many resources requested': ('out of resources', 701),
    'unspecified launch failure': ('launch failure', 719)}


def _stop(line):
    """The run stops with this line (the scripts' one-line error, exit 2)."""
    try:
        from nanohfa.errors import UserError  # train.py's folder
    except ImportError:
        UserError = RuntimeError
    raise UserError(line)


# -----------------------------------------------------------------------------
# what to check: one case per family whose Triton form the run's dispatch picks


def cases(heads, kernel, dtype, T, device):
    """{family: case} for the model's `heads` (a list of plain dicts, one per group of heads:
    family ('sa', 'linear', 'hfa', 'ha'), heads, factors (HFA's A), softmax, head_size, causal,
    window, norm (linear), order, windows, shared (HA); model.kernel_heads) under the `kernel`
    setting, on `device` with attention inputs of `dtype` (a name) and length T. A case is a
    plain dict (it travels to the child as JSON). Attention-weight dropout is left out:
    evaluation runs without it, on the Triton forms."""
    if attention_kernels.load_triton() is not None:  # no Triton kernel runs (kernel='triton' says so at the model)
        return {}
    fake = _fake_entries()
    kind = 'triton' if fake is not None else kernel  # the fakes: Triton forms wherever they'd run
    dev_type = 'cuda' if fake is not None else torch.device(device).type
    out = {}
    for h in heads:
        family = h['family']
        if family == 'sa' or family in out:
            continue
        window = h['window'] if h['causal'] else 0
        case = dict(family=family, dtype=dtype, T=T, dh=h['head_size'], heads=min(2, h['heads']), causal=h['causal'],
                    device=device, window=window, A=h['factors'], norm=h['norm'], order=h['order'],
                    windows=list(h['windows']) if h['causal'] else [0, 0], shared=h['shared'])
        form = form_of(h, kind, dtype, dev_type, T)
        if form.startswith('triton'):
            out[family] = dict(case, form=form, config=config_class(case, form))
    return out


def form_of(h, kernel, dtype, dev_type, T):
    """dispatch's name of the form that computes the group of heads `h` (a kernel_heads dict)
    in a (T, T) causal training call, for inputs of `dtype` (a name) on `dev_type`."""
    window = h['window'] if h['causal'] else 0
    long_causal = h['family'] == 'linear' and h['causal'] and not window and T >= attention_kernels.CHUNKED_MIN_T
    return attention_kernels.route(kernel, h['family'], getattr(torch, dtype), dev_type, softmax=h['softmax'],
                                   order=h['order'], factors=h['factors'], head_size=h['head_size'],
                                   long_causal=long_causal, ha_geometry=(T, T, 0, h['causal'], *h['windows']),
                                   ha_form=h.get('form', 'auto'))


def config_class(case, form):
    """The guard's configuration class string of the case's Triton form, with its length."""
    from attention_kernels.ha import ops as ha_ops
    from attention_kernels.hfa import ops as hfa_ops
    from attention_kernels.linear import ops as linear_ops
    x = torch.empty(1, case['T'], case['dh'], dtype=getattr(torch, case['dtype']), device=case['device'])
    if case['family'] == 'linear':
        text = linear_ops._config(x, 0, case['causal'], case['window'], case['norm'], form == 'triton_chunked')
    elif case['family'] == 'hfa':
        text = hfa_ops._config(x.expand(case['A'], -1, -1, -1), 0, case['causal'], case['window'])
    else:
        text = ha_ops._config(x, x, 0, case['causal'], *case['windows'])
    return f"{text} T={case['T']}"


# -----------------------------------------------------------------------------
# the child: one family's Triton form, forward and backward, against its PyTorch form


def _fake_entries():
    """The test hook's ENTRIES (module docstring), or None."""
    path = os.environ.get(ENTRIES_ENV)
    if not path:
        return None
    spec = importlib.util.spec_from_file_location('nanohfa_preflight_entries', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ENTRIES


def _inputs(case, g):
    """The family's inputs (its layout; one sequence), the call's other arguments, the names
    of the gradients, and what the guard's SDPA floor is measured on."""
    f, H, T, dh = case['family'], case['heads'], case['T'], case['dh']

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=case['device']).to(getattr(torch, case['dtype']))
    if f == 'linear':
        xs = [rand(1, H, T, dh) for _ in range(3)]
        return xs, lambda q, k, v: (q, k, v, 0, case['causal'], case['window'], case['norm'], 0.0), \
            ('dq', 'dk', 'dv'), lambda q, k, v: (q[0], k[0], v[0])
    if f == 'hfa':
        A = case['A']
        xs = [rand(A, 1, H, T, dh), rand(A, 1, H, T, dh), rand(1, H, T, dh)]
        return xs, lambda q, k, v: (q, k, v, 0, case['causal'], case['window'], True, 0.0), \
            ('dq', 'dk', 'dv'), lambda q, k, v: (q[0, 0], k[0, 0], v[0])
    n = 1 if case['shared'] else 2  # one key and value stream in both slots, as the model passes them
    xs = [rand(1, H, T, dh) for _ in range(1 + 2 * n)]
    names = ('dq', 'dk', 'dv') if n == 1 else ('dq', 'dk1', 'dk2', 'dv1', 'dv2')

    def args(q, *kv):
        ks, vs = (list(kv[:1]) * 2, list(kv[1:]) * 2) if n == 1 else (list(kv[:2]), list(kv[2:]))
        return q, ks, vs, 0, case['causal'], list(case['windows']), True
    return xs, args, names, lambda *t: (t[0][0], t[1][0], t[1 + n][0])


def check(case, report):
    """Run the case's Triton form (or the test hook's entry) forward and backward and compare
    with its PyTorch form in float64; report(stage=...) before each stage. The verdict: None
    (agrees) or what disagrees, in the guard's words."""
    f = case['family']
    fake = _fake_entries()
    if fake is not None and f in fake:
        entry = fake[f]
    else:
        attention_kernels.load_triton()
        entry = functools.partial(attention_kernels.FORMS[f][case['form']], strict=True, check=False)
    dev_type = torch.device(case['device']).type
    ref_form = attention_kernels.route('torch', f, torch.float64, dev_type, order=case['order'], factors=case['A'],
                                       head_size=case['dh'])
    reference = attention_kernels.FORMS[f][ref_form]
    g = torch.Generator(device=case['device']).manual_seed(0)
    xs, args, names, sdpa_qkv = _inputs(case, g)
    xs = [x.requires_grad_() for x in xs]
    report(stage='fwd')
    out = entry(*args(*xs))
    dout = torch.randn(out.shape, generator=g, device=case['device']).to(out.dtype)
    report(stage='bwd')
    grads = torch.autograd.grad(out, xs, dout)
    if dev_type == 'cuda':
        torch.cuda.synchronize(case['device'])  # an asynchronous launch error surfaces here, in this stage
    report(stage='compare')
    x64 = [x.detach().double().requires_grad_() for x in xs]
    want = reference(*args(*x64))
    want_grads = torch.autograd.grad(want, x64, dout.double())
    geometry = (0, case['causal'], case['window'] if f != 'ha' else case['windows'][0])
    return guard.wrong_grads([out.detach(), *grads], ('out', *names), [want.detach(), *want_grads], dout[0],
                             sdpa_qkv(*[x.detach() for x in xs]), geometry)


def _die_with_parent(parent):
    """Linux: this process gets SIGKILL when its parent dies (even by SIGKILL), so no child of
    a killed run keeps the GPU; if the parent is already gone, end now."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's stop handler is what there is
        return
    if os.getppid() != parent:
        os._exit(1)


def child_main(case_json, parent):
    """The child process: one JSON line per stage on stdout, then the verdict."""
    _die_with_parent(parent)

    def report(**kw):
        print(json.dumps({**kw, 't': time.time()}), flush=True)
    case = json.loads(case_json)
    attention_kernels.load_triton()  # before torch._dynamo, which imports triton (CPU: the interpreter first)
    import torch._dynamo  # noqa: F401  the first custom-op call imports it (3 s on CPU): part of the start
    report(stage='ready')  # imports done: the child start ends here
    try:
        why = check(case, report)
        report(verdict='ok' if why is None else 'mismatch', detail=why)
    except Exception as e:  # a compile or launch failure: the parent decides what it costs
        lines = str(e).strip().splitlines()
        report(verdict='error', detail=f"{type(e).__name__}: {lines[0] if lines else ''}",
               oom=isinstance(e, torch.OutOfMemoryError) or 'CUDA out of memory' in str(e))


# -----------------------------------------------------------------------------
# the parent: children, their verdicts


def _spawn(name, case, folder):
    """Start the child for `case`, its stdout and stderr in files (no pipe to fill), in a
    session of its own: the parent stops it, and whatever it started, as one group."""
    t0 = time.time()
    out = open(folder / f"{name}.out", 'w')
    err = open(folder / f"{name}.err", 'w')
    proc = subprocess.Popen([sys.executable, '-m', 'attention_kernels.preflight', '--child', json.dumps(case),
                             str(os.getpid())], cwd=ROOT, stdout=out, stderr=err, start_new_session=True)
    out.close()
    err.close()
    return proc, t0


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
    proc.wait()


def _records(name, folder):
    return [json.loads(x) for x in (folder / f"{name}.out").read_text().splitlines() if x.startswith('{')]


def _verdict(name, proc, started, folder, killed, budgets):
    """What the child's files and exit say. killed: why the parent killed it ('import' or
    'hang'), or None. {'ok', 'kernel' (the verdict is about the kernel: cached), 'stage',
    'what', 'start_s', 'check_s'}."""
    records = _records(name, folder)
    err = (folder / f"{name}.err").read_text()
    stages = [r['stage'] for r in records if r.get('stage') in ('ready',) + KERNEL_STAGES]
    stage = stages[-1] if stages else 'start'  # where it ended: 'start' (imports) and 'ready' are before the kernel
    running = stage in KERNEL_STAGES
    ready = next((r['t'] for r in records if r.get('stage') == 'ready'), None)
    end = records[-1]['t'] if records else time.time()
    res = dict(stage=stage if running else 'start', start_s=round(ready - started, 2) if ready else None,
               check_s=round(end - ready, 2) if ready else None, ok=False, kernel=running)
    final = records[-1] if records and 'verdict' in records[-1] else None
    if killed == 'import':
        res['what'] = (f"the preflight's process took more than {budgets[0]:g} s to import torch and triton "
                       f"(preflight_import_timeout)")
    elif killed == 'hang':
        res['what'] = (f"no result within {budgets[1]:g} s in the preflight (a hang; if only slow, raise "
                       f"kernel_preflight_timeout, and under torchrun ddp_timeout with it)" if running else
                       f"the preflight's process stopped before running the kernel (for {budgets[1]:g} s)")
    elif final and final['verdict'] == 'ok':
        res['ok'], res['what'] = True, 'passed the preflight'
    elif final and final['verdict'] == 'mismatch':
        res['stage'] = 'fwd' if final['detail'].startswith('out ') else 'bwd'
        res['what'] = f"disagrees with PyTorch in the preflight: {final['detail']}"
    elif proc.returncode < 0 and -proc.returncode in OUTSIDE:  # the child does not send these to itself
        name_ = signal.Signals(-proc.returncode).name
        res['kernel'] = False
        res['what'] = (f"the preflight's process was killed from outside ({name_}"
                       + (": out of memory?" if -proc.returncode == signal.SIGKILL else '') + ')')
    else:
        text = final['detail'] if final else err
        cuda = next((v for k, v in CUDA_ERRORS.items() if k in text), None)
        if final and final.get('oom'):
            res['kernel'] = False
            res['what'] = f"out of GPU memory in the preflight (another process on the GPU?): {final['detail']}"
        elif cuda:
            res['what'] = f"{cuda[0]} in the preflight (CUDA error {cuda[1]})"
        elif final:
            res['what'] = f"raised in the preflight: {final['detail']}"
        elif proc.returncode < 0:
            res['what'] = f"the preflight's process died ({signal.Signals(-proc.returncode).name})"
        else:
            res['what'] = f"the preflight's process exited with status {proc.returncode}"
        res['stderr_tail'] = err.strip().splitlines()[-5:]
    return res


class _Stopped(BaseException):
    """A stop signal reached the parent while its children ran."""


def _on_stop(signum, frame):
    raise _Stopped(signum)


def run_children(todo, timeout, import_timeout=START_S):
    """{family: verdict} for {family: case}: one child each, all at once; a child past
    import_timeout for its imports or `timeout` after them is killed. A stop signal kills the
    children, then ends this process by that signal (its previous handler's action)."""
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                handlers[sig] = signal.signal(sig, _on_stop)
    stopped = None
    with tempfile.TemporaryDirectory(prefix='nanohfa-preflight-') as d:
        folder = Path(d)
        running, verdicts = {}, {}
        try:
            for f, case in todo.items():
                running[f] = _spawn(f, case, folder)
            while running:
                time.sleep(0.05)
                for f, (proc, t0) in list(running.items()):
                    killed = None
                    if proc.poll() is None:
                        ready = next((r['t'] for r in _records(f, folder) if r.get('stage') == 'ready'), None)
                        if time.time() < (ready + timeout if ready else t0 + import_timeout):
                            continue
                        _kill(proc)
                        killed = 'hang' if ready else 'import'
                    verdicts[f] = _verdict(f, proc, t0, folder, killed, (import_timeout, timeout))
                    del running[f]
        except _Stopped as e:
            stopped = e.args[0]
        finally:  # stopped, interrupted, an error: no child outlives the parent
            late = []  # a second signal while the children are killed: noted, not raised in the middle
            for sig in handlers:
                signal.signal(sig, lambda signum, frame: late.append(signum))
            for proc, _ in running.values():
                _kill(proc)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            stopped = stopped if stopped is not None or not late else late[0]
    if stopped is not None:
        print(f"nanoHFA: {signal.Signals(stopped).name} during the kernel preflight: its {len(running)} child "
              f"process(es) stopped, nothing written", file=sys.stderr, flush=True)
        os.kill(os.getpid(), stopped)  # the previous handler's action: by default the process ends by it
        raise SystemExit(128 + stopped)  # a handler that returned: the preflight has no verdict to give
    return {f: verdicts[f] for f in todo}


def machine(device):
    """What a verdict holds for: the GPU and its compute capability, the driver, torch, triton."""
    if torch.device(device).type == 'cuda':
        major, minor = torch.cuda.get_device_capability(device)
        try:  # the kernel module's version (Linux); the CUDA runtime is torch's
            driver = Path('/proc/driver/nvidia/version').read_text().split('Kernel Module')[1].split()[0]
        except (OSError, IndexError):
            driver = 'unknown'
        gpu = f"{torch.cuda.get_device_name(device)} sm_{major}{minor} driver {driver} cuda {torch.version.cuda}"
    else:
        gpu = f"{platform.machine()} {device}"
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = 'none'
    return f"{gpu} torch {torch.__version__} triton {tv}"


def source_hash():
    """sha256 (12 hex digits) of attention_kernels' sources and the test hook's file, if any."""
    h = hashlib.sha256()
    files = sorted(Path(__file__).parent.rglob('*.py'))
    if os.environ.get(ENTRIES_ENV):
        files.append(Path(os.environ[ENTRIES_ENV]))
    for p in files:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


# -----------------------------------------------------------------------------
# the cache: per user, outside the checkout, written under a lock


def cache_dir():
    """$NANOHFA_CACHE, else $XDG_CACHE_HOME/nanohfa, else ~/.cache/nanohfa: the user's, not the
    checkout's (which every node of a cluster may share, and every user of it)."""
    if os.environ.get('NANOHFA_CACHE'):
        return Path(os.environ['NANOHFA_CACHE'])
    return Path(os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache') / 'nanohfa'


def cache_path():
    return cache_dir() / CACHE_FILE


def _read_cache(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _update_cache(path, change):
    """table -> table, applied under the cache's lock (flock on <path>.lock; NFS maps it to its
    locks) to the file as it is now, written whole to a uniquely named temporary file and renamed
    (no half-written file, no lost entry when several runs write at once). Returns the new
    table. OSError when the folder cannot be written (read-only, full) or the lock not had."""
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + '.lock'), 'a') as lock:
        deadline = time.time() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    raise OSError(f"its lock {lock.name} was held for more than {LOCK_WAIT_S} s")
                time.sleep(0.05)
        table = change(_read_cache(path))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix='.tmp')
        try:
            with os.fdopen(fd, 'w') as f:
                f.write(json.dumps(table, indent=1))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return table  # the lock goes with the file's closing


def _write_cache(path, new):
    """Add verdicts to the cache; a cache that cannot be written is a warning (checked again
    next run), never the end of the run. Returns whether they were written."""
    try:
        _update_cache(path, lambda table: {**table, **new})
        return True
    except OSError as e:
        print(f"nanoHFA: warning: the kernel preflight's verdicts cannot be cached in {path} "
              f"({e.strerror or e}); they are checked again next run (NANOHFA_CACHE names another folder)",
              file=sys.stderr, flush=True)
        return False


def forget(prefix, path=None):
    """Remove the cached verdicts whose configuration class starts with `prefix` (a family:
    'ha'; or a class as a line gives it), on every machine. Returns how many went."""
    path = path or cache_path()
    if not path.exists():
        return 0
    gone = []

    def drop(table):
        gone[:] = [k for k in table if k.split(' | ', 1)[-1].startswith(prefix)]
        return {k: v for k, v in table.items() if k not in gone}
    _update_cache(path, drop)
    return len(gone)


def verdicts(todo, timeout, import_timeout=START_S):
    """{family: verdict} for {family: case}: from the cache where it holds one, else from the
    children; the verdicts about a kernel are then cached, those about the machine not.
    'cached' says which came from the cache, 'stored' whether a fresh one was cached."""
    path = cache_path()
    prefix = f"{machine(next(iter(todo.values()))['device'])} src {source_hash()}"
    keys = {f: f"{prefix} | {case['config']}" for f, case in todo.items()}
    table = _read_cache(path)
    missing = {f: case for f, case in todo.items() if keys[f] not in table}
    fresh = run_children(missing, timeout, import_timeout) if missing else {}
    stamp = time.strftime('%Y-%m-%d %H:%M')
    keep = {keys[f]: {**v, 'when': stamp} for f, v in fresh.items() if v['kernel']}
    stored = _write_cache(path, keep) if keep else False
    return {f: {**fresh[f], 'cached': False, 'stored': stored and fresh[f]['kernel']} if f in fresh
            else {**table[keys[f]], 'cached': True} for f in todo}


# -----------------------------------------------------------------------------
# what train.py calls


def line(case, v, kernel):
    """The one line a family's verdict gets."""
    f = case['family']
    again = f"python -m attention_kernels.preflight --forget {f} checks it again"
    if v['cached']:
        note = f" (cached {v.get('when', '')} in {cache_path()}" + (f"; {again})" if not v['ok'] else ')')
    elif not v['kernel']:
        note = ": not the kernel's doing, so not cached: the next run checks it again"
    elif not v['ok'] and v.get('stored'):
        note = f" (cached in {cache_path()}; {again})"
    else:
        note = ''
    if v['ok']:
        took = '' if v['cached'] else f" (child start {v['start_s']} s, check {v['check_s']} s)"
        return f"kernels: {f} on Triton ({case['config']}): passed the preflight{took}{note}"
    end = f"kernel='triton' stops here (kernel='auto' would use PyTorch for {f})" if kernel == 'triton' \
        else f"using PyTorch for {f}"
    return f"triton {f} {v['stage']} ({case['config']}): {v['what']}{note}; {end}"


def budget_check(timeout, import_timeout, ddp_timeout):
    """Under torchrun the other ranks wait for this node's preflight in the process group's
    start, for at most ddp_timeout: the preflight's budgets must fit in it, or the run stops."""
    need = import_timeout + timeout + MARGIN_S
    if ddp_timeout is not None and need > ddp_timeout:
        _stop(f"preflight_import_timeout={import_timeout:g} s + kernel_preflight_timeout={timeout:g} s "
              f"(+ {MARGIN_S} s) exceed ddp_timeout={ddp_timeout:g} s: under torchrun the other ranks would stop "
              f"waiting for the preflight; raise ddp_timeout to at least {need:g} or lower the preflight's timeouts")


def run(heads, kernel, device, dtype, T, timeout=TIMEOUT_S, local_rank=0, import_timeout=START_S,
        ddp_timeout=None, check=True):
    """The preflight of every Triton kernel the run will use (the module docstring), for the
    model's `heads` (cases()) under its `kernel` setting (check=False: none). ddp_timeout:
    under torchrun, the limit the preflight must fit in. Returns {family: {'path': 'triton' |
    'pytorch' | None (not checked on this process), 'why'}} for run.json; sends failed
    families to PyTorch, or (kernel='triton') stops with one line."""
    fake = _fake_entries()
    if not check or kernel not in ('auto', 'triton') or (torch.device(device).type != 'cuda' and fake is None):
        return {}
    todo = cases(heads, kernel, dtype, T, device)
    if not todo:
        return {}
    budget_check(timeout, import_timeout, ddp_timeout)  # on every rank alike: the same settings
    if local_rank != 0:  # one process per node checks; agree() tells the others
        return {f: {'path': None, 'why': 'checked by local rank 0'} for f in todo}
    paths = {}
    for f, v in verdicts(todo, timeout, import_timeout).items():
        text = line(todo[f], v, kernel)
        if not v['ok'] and kernel == 'triton':
            _stop(text)
        if v['ok']:
            print(text, flush=True)
        else:
            print(f"nanoHFA: {text}", file=sys.stderr, flush=True)
            attention_kernels.use_pytorch(f, text)
        paths[f] = {'path': 'triton' if v['ok'] else 'pytorch', 'why': text, 'config': todo[f]['config']}
    return paths


def record(paths, heads, kernel, device, dtype, T):
    """run.json's 'kernels': per family of the model's `heads`, the form that computes its
    training forward ('form': dispatch's name for it, after the preflight's verdicts, as
    route gives it for a (T, T) causal call) and the preflight's entry where there is one.
    A run's numbers can be remade only on the form that made them (tools/rerun.py)."""
    out = {}
    for h in heads:
        f = h['family']
        if f in out:
            continue
        out[f] = {'form': form_of(h, kernel, dtype, torch.device(device).type, T), **paths.get(f, {})}
    return out


def agree(paths, kernel, device):
    """Under torchrun: a family that failed the preflight on any node uses PyTorch on every
    rank (kernel='triton': every rank stops). One all_reduce (MAX) of a flag per family."""
    import torch.distributed as dist
    if not paths or not (dist.is_available() and dist.is_initialized()):
        return paths
    families = sorted(paths)  # the same on every rank: the same config
    failed = torch.tensor([float(paths[f]['path'] == 'pytorch') for f in families], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    agreed = {}
    for f, bad in zip(families, failed.tolist()):
        if bad and paths[f]['path'] != 'pytorch':
            why = f"triton {f} failed the preflight on another node; using PyTorch for {f}"
            if kernel == 'triton':
                _stop(f"triton {f} failed the preflight on another node; kernel='triton' stops here")
            if paths[f]['path'] == 'triton':  # where it passed: local rank 0 of that node says so
                print(f"nanoHFA: {why}", file=sys.stderr, flush=True)
            attention_kernels.use_pytorch(f, why)
            agreed[f] = {**paths[f], 'path': 'pytorch', 'why': why}
        else:
            agreed[f] = {**paths[f], 'path': 'pytorch' if bad else 'triton'}
    return agreed


# -----------------------------------------------------------------------------
# gpu_check.sh: the classes a GPT-2-small run of each Triton family uses, fresh, as JSON


def gpt2_small_heads(family, dh):
    """The heads of a GPT-2-small layer (width 768) of one family at head size dh, as
    model.kernel_heads gives them: linear, HFA (A = 2) or HA (windows 512 x 32, config/ha.py)."""
    return dict(family=family, heads=768 // dh, factors=2 if family == 'hfa' else 1, softmax=family != 'linear',
                head_size=dh, causal=True, window=0, norm=False, order=3,
                windows=[512, 32] if family == 'ha' else [0, 0], shared=False)


def report(out, timeout, device='cuda', T=1024, head_sizes=(64, 128), dtype='bfloat16', import_timeout=START_S):
    """Each family's verdict at GPT-2 small's width (768) for each head size, fresh (no cache),
    one JSON line each as they come and all in `out`. Returns 0: a failed kernel is a verdict."""
    records = []
    todo = {}
    for dh in head_sizes:
        for name in ('linear', 'hfa', 'ha'):
            case = cases([gpt2_small_heads(name, dh)], 'auto', dtype, T, device).get(name)
            if case:
                todo[f"{name} dh={dh}"] = case
    for name, v in run_children(todo, timeout, import_timeout).items():
        rec = dict(case=name, config=todo[name]['config'], verdict='ok' if v['ok'] else v['what'],
                   stage=v['stage'], start_s=v['start_s'], check_s=v['check_s'])
        print(json.dumps(rec), flush=True)
        records.append(rec)
    Path(out).write_text(json.dumps(records, indent=1))
    return 0  # a failed kernel is a verdict in the file, not a failure of this script


if __name__ == '__main__':
    if sys.argv[1:2] == ['--child']:
        child_main(sys.argv[2], int(sys.argv[3]))
        os._exit(0)  # the verdict is out; torch's and triton's teardown took 3 s more on CPU
    else:
        import argparse
        p = argparse.ArgumentParser(description="the preflight of the Triton kernels: GPT-2-small classes "
                                                "(--report), or cached verdicts removed (--forget)")
        p.add_argument('--report', help='the JSON file of verdicts at GPT-2-small classes, fresh')
        p.add_argument('--forget', metavar='CLASS', help="remove the cached verdicts whose configuration class "
                                                         "starts with this: a family ('ha') or a class from a line")
        p.add_argument('--timeout', type=float, default=TIMEOUT_S)
        p.add_argument('--import_timeout', type=float, default=START_S)
        p.add_argument('--device', default='cuda')
        p.add_argument('--T', type=int, default=1024)
        p.add_argument('--dh', default='64,128', help='head sizes')
        p.add_argument('--dtype', default='bfloat16')
        a = p.parse_args()
        if a.forget:
            try:
                n = forget(a.forget)
            except OSError as e:
                print(f"error: {cache_path()} cannot be changed ({e.strerror or e}); check that its folder is "
                      f"writable, or set NANOHFA_CACHE to the cache the runs use", file=sys.stderr)
                sys.exit(2)
            print(f"{n} cached verdict(s) of {a.forget!r} removed from {cache_path()}; the next run checks again")
            sys.exit(0)
        if not a.report:
            p.error('give --report FILE or --forget CLASS')
        sys.path.insert(0, str(ROOT))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # gpu_check.sh's timeout: children killed too
        sys.exit(report(a.report, a.timeout, a.device, a.T, [int(x) for x in a.dh.split(',')], a.dtype,
                        a.import_timeout))
