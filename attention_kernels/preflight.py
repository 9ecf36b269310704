"""
The preflight: every Triton kernel a run will use runs first in a child process, so that a
kernel that crashes, hangs or is wrong on this GPU costs one line and a few seconds, never
the run.

The in-process guard (guard.py) falls back when a kernel raises or disagrees with PyTorch;
it cannot survive an illegal memory access (the CUDA context is lost and the process dies,
under torchrun with every rank), a launch that never returns, or a compile that aborts. So
before the first training step, on CUDA with kernel='auto' or 'triton' and kernel_check=True:

- for each family whose Triton form the dispatch picks at the run's configuration class
  (family, dtype, head size, causal / window form, the tile table; the guard's class string,
  at the run's sequence length), a child process (`python -m attention_kernels.preflight`)
  runs that form's forward and backward on one sequence of two heads at the run's length and
  compares output and gradients with the PyTorch form in float64 (the guard's rule and
  tolerances). The children run at once, one per family, under one timeout (the setting
  kernel_preflight_timeout, TIMEOUT_S by default);
- a crash (a non-zero exit or a signal), a timeout, an exception (compile or launch) or a
  mismatch sends that family to PyTorch (attention_kernels.use_pytorch) with one line naming
  the family, the stage, its configuration class and what happened; kernel='triton' stops
  the run with that line instead, before anything is written;
- the verdict is cached in $NANOHFA_CACHE/preflight.json per (GPU and compute capability,
  driver, torch, triton, a hash of attention_kernels' sources, configuration class and
  length), so a second run on the machine starts no child; a changed kernel or driver checks again;
- under torchrun local rank 0 of each node runs it and `agree` all-reduces the verdicts, so a
  family that failed on any node uses PyTorch on every rank (DDP and FSDP never mix kernels).

Test hook: NANOHFA_PREFLIGHT_ENTRIES names a Python file whose ENTRIES dict ({family: fn},
fn with the family's Triton-form signature less strict/check) stands in for those families'
Triton forms in the child (the other families run their Triton kernels: in the interpreter on
CPU). The file joins the source hash, and the preflight then runs on any device (the tests
run it on CPU), with everything else (children, timeout, comparison, cache, dispatch) the
code a GPU run uses.

    python -m attention_kernels.preflight --report out.json   # GPT-2-small classes (gpu_check.sh)
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
import time
from pathlib import Path

import torch

import attention_kernels
from attention_kernels import guard

TIMEOUT_S = 120  # per child, from its imports done to its verdict: compiling a family's kernels + the check
START_S = 120  # per child, for its imports (torch, triton: tens of seconds on a cold network file system)
ENTRIES_ENV = 'NANOHFA_PREFLIGHT_ENTRIES'
ROOT = Path(__file__).resolve().parent.parent
CACHE_FILE = 'preflight.json'
CUDA_ERRORS = {  # torch says the CUDA error's text; the line also gives its number, which searches find
    'an illegal memory access': ('illegal memory access', 700), 'misaligned address': ('misaligned address', 716),
    'illegal instruction': ('illegal instruction', 715), 'too many resources requested': ('out of resources', 701),
    'unspecified launch failure': ('launch failure', 719)}


def _stop(line):
    """kernel='triton': the run stops with this line (the scripts' one-line error, exit 2)."""
    try:
        from errors import UserError  # train.py's folder
    except ImportError:
        UserError = RuntimeError
    raise UserError(line)


# -----------------------------------------------------------------------------
# what to check: one case per family whose Triton form the run's dispatch picks


def cases(cfg, dtype, T, device):
    """{family: case} for the model config `cfg` (GPTConfig) on `device` with attention inputs
    of `dtype` (a name) and length T. A case is a plain dict (it travels to the child as JSON).
    Attention-weight dropout is left out: evaluation runs without it, on the Triton forms."""
    from model import head_groups  # the model's heads: which families, with how many streams
    if attention_kernels.load_triton() is not None:  # no Triton kernel runs (kernel='triton' says so at the model)
        return {}
    fake = _fake_entries()
    kind = 'triton' if fake is not None else cfg.kernel  # the fakes: Triton forms wherever they'd run
    dev_type = 'cuda' if fake is not None else torch.device(device).type
    window = cfg.attn_window if cfg.causal else 0
    out = {}
    for group in (g for layer in cfg.layer_attentions() for g in head_groups(cfg, layer)):
        family = {'linear': 'linear', 'hfa_v1': 'hfa', 'hfa_v2': 'hfa', 'ha': 'ha'}.get(group.kind)
        if family is None or family in out:
            continue
        case = dict(family=family, dtype=dtype, T=T, dh=cfg.dh, heads=min(2, group.heads), causal=cfg.causal,
                    device=device, window=window, A=group.n_q, norm=cfg.linear_norm, order=cfg.ha_order,
                    windows=[cfg.ha_window1, cfg.ha_window2] if cfg.causal else [0, 0], shared=cfg.ha_share_kv)
        long_causal = family == 'linear' and cfg.causal and not window and T >= attention_kernels.CHUNKED_MIN_T
        form = attention_kernels.route(kind, family, getattr(torch, dtype), dev_type, softmax=group.softmax,
                                       order=cfg.ha_order, factors=group.n_q, head_size=cfg.dh,
                                       long_causal=long_causal)
        if form.startswith('triton'):
            out[family] = dict(case, form=form, config=config_class(case, form))
    return out


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


def child_main(case_json):
    """The child process: one JSON line per stage on stdout, then the verdict."""
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
        report(verdict='error', detail=f"{type(e).__name__}: {lines[0] if lines else ''}")


# -----------------------------------------------------------------------------
# the parent: children, their verdicts, the cache


def _spawn(name, case, folder):
    """Start the child for `case`, its stdout and stderr in files (no pipe to fill)."""
    t0 = time.time()
    out = open(folder / f"{name}.out", 'w')
    err = open(folder / f"{name}.err", 'w')
    proc = subprocess.Popen([sys.executable, '-m', 'attention_kernels.preflight', '--child', json.dumps(case)],
                            cwd=ROOT, stdout=out, stderr=err)  # our process group: Ctrl-C reaches it too
    out.close()
    err.close()
    return proc, t0


def _verdict(name, proc, started, folder, killed):
    """What the child's files and exit say (killed: why the parent killed it, or None):
    {'ok', 'stage', 'what', 'start_s', 'check_s'}."""
    records = [json.loads(x) for x in (folder / f"{name}.out").read_text().splitlines() if x.startswith('{')]
    err = (folder / f"{name}.err").read_text()
    stages = [r['stage'] for r in records if r.get('stage') in ('fwd', 'bwd', 'compare')]
    stage = stages[-1] if stages else 'start'  # where it ended: 'start' is before the kernel ran
    ready = next((r['t'] for r in records if r.get('stage') == 'ready'), None)
    end = records[-1]['t'] if records else time.time()
    res = dict(stage=stage, start_s=round(ready - started, 2) if ready else None,
               check_s=round(end - ready, 2) if ready else None, ok=False)
    final = records[-1] if records and 'verdict' in records[-1] else None
    if killed:
        res['what'] = killed
    elif final and final['verdict'] == 'ok':
        res['ok'], res['what'] = True, 'passed the preflight'
    elif final and final['verdict'] == 'mismatch':
        res['stage'] = 'fwd' if final['detail'].startswith('out ') else 'bwd'
        res['what'] = f"disagrees with PyTorch in the preflight: {final['detail']}"
    else:
        text = final['detail'] if final else err
        cuda = next((v for k, v in CUDA_ERRORS.items() if k in text), None)
        if cuda:
            res['what'] = f"{cuda[0]} in the preflight (CUDA error {cuda[1]})"
        elif final:
            res['what'] = f"raised in the preflight: {final['detail']}"
        elif proc.returncode < 0:
            res['what'] = f"the preflight's process died ({signal.Signals(-proc.returncode).name})"
        else:
            res['what'] = f"the preflight's process exited with status {proc.returncode}"
        res['stderr_tail'] = err.strip().splitlines()[-5:]
    return res


def _ready(name, folder):
    """When the child said its imports were done, or None."""
    for x in (folder / f"{name}.out").read_text().splitlines():
        if x.startswith('{"stage": "ready"'):
            return json.loads(x)['t']
    return None


def run_children(todo, timeout):
    """{family: verdict} for {family: case}: one child each, all at once; a child past START_S
    for its imports or `timeout` after them is killed (a hang)."""
    with tempfile.TemporaryDirectory(prefix='nanohfa-preflight-') as d:
        folder = Path(d)
        running = {f: _spawn(f, case, folder) for f, case in todo.items()}
        verdicts = {}
        try:
            while running:
                time.sleep(0.05)
                for f, (proc, t0) in list(running.items()):
                    killed = None
                    if proc.poll() is None:
                        ready = _ready(f, folder)
                        if time.time() < (ready + timeout if ready else t0 + START_S):
                            continue
                        proc.kill()
                        proc.wait()
                        killed = (f"no result within {timeout:g} s in the preflight (a hang, or raise "
                                  f"kernel_preflight_timeout)" if ready else
                                  f"the preflight's process took more than {START_S} s to import torch and triton")
                    verdicts[f] = _verdict(f, proc, t0, folder, killed)
                    del running[f]
        finally:  # interrupted (Ctrl-C, an error): no child outlives the parent
            for proc, _ in running.values():
                proc.kill()
                proc.wait()
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


def cache_path():
    from tokenizer import CACHE  # the project's cache folder ($NANOHFA_CACHE, else cache/)
    return Path(CACHE) / CACHE_FILE


def _read_cache(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(path, new):
    """Add entries; written whole to a temporary file, then renamed (no half-written file)."""
    table = {**_read_cache(path), **new}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1))
    os.replace(tmp, path)


def verdicts(todo, timeout):
    """{family: verdict} for {family: case}: from the cache where it holds one, else from the
    children (whose verdicts are then cached); 'cached' says which."""
    path = cache_path()
    prefix = f"{machine(next(iter(todo.values()))['device'])} src {source_hash()}"
    keys = {f: f"{prefix} | {case['config']}" for f, case in todo.items()}
    table = _read_cache(path)
    missing = {f: case for f, case in todo.items() if keys[f] not in table}
    fresh = run_children(missing, timeout) if missing else {}
    if fresh:
        stamp = time.strftime('%Y-%m-%d %H:%M')
        _write_cache(path, {keys[f]: {**v, 'when': stamp} for f, v in fresh.items()})
    return {f: {**fresh[f], 'cached': False} if f in fresh else {**table[keys[f]], 'cached': True} for f in todo}


# -----------------------------------------------------------------------------
# what train.py calls


def line(case, v, kernel):
    """The one line a family's verdict gets."""
    f = case['family']
    when = f" (cached {v.get('when', '')}, {CACHE_FILE})" if v['cached'] else ''
    if v['ok']:
        took = '' if v['cached'] else f" (child start {v['start_s']} s, check {v['check_s']} s)"
        return f"kernels: {f} on Triton ({case['config']}): passed the preflight{took}{when}"
    end = f"kernel='triton' stops here (kernel='auto' would use PyTorch for {f})" if kernel == 'triton' \
        else f"using PyTorch for {f}"
    return f"triton {f} {v['stage']} ({case['config']}): {v['what']}{when}; {end}"


def run(cfg, device, dtype, T, timeout=TIMEOUT_S, local_rank=0):
    """The preflight of every Triton kernel the run will use (the module docstring). Returns
    {family: {'path': 'triton' | 'pytorch' | None (not checked on this process), 'why'}} for
    run.json; sends failed families to PyTorch, or (kernel='triton') stops with one line."""
    fake = _fake_entries()
    if not cfg.kernel_check or cfg.kernel not in ('auto', 'triton') \
            or (torch.device(device).type != 'cuda' and fake is None):
        return {}
    todo = cases(cfg, dtype, T, device)
    if not todo:
        return {}
    if local_rank != 0:  # one process per node checks; agree() tells the others
        return {f: {'path': None, 'why': 'checked by local rank 0'} for f in todo}
    paths = {}
    for f, v in verdicts(todo, timeout).items():
        text = line(todo[f], v, cfg.kernel)
        if not v['ok'] and cfg.kernel == 'triton':
            _stop(text)
        if v['ok']:
            print(text, flush=True)
        else:
            print(f"nanoHFA: {text}", file=sys.stderr, flush=True)
            attention_kernels.use_pytorch(f, text)
        paths[f] = {'path': 'triton' if v['ok'] else 'pytorch', 'why': text, 'config': todo[f]['config']}
    return paths


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


def report(out, timeout, device='cuda', T=1024, head_sizes=(64, 128), dtype='bfloat16'):
    """Each family's verdict at GPT-2 small's width (768) for each head size, fresh (no cache),
    one JSON line each as they come and all in `out`. Returns 0: a failed kernel is a verdict."""
    from model import GPTConfig
    records = []
    todo = {}
    for dh in head_sizes:
        for name, kw in (('linear', dict(attention='linear')), ('hfa', dict(attention='hfa_v1')),
                         ('ha', dict(attention='ha', ha_window1=512, ha_window2=32))):
            cfg = GPTConfig(n_head=768 // dh, n_embd=768, **kw)
            case = cases(cfg, dtype, T, device).get(name)
            if case:
                todo[f"{name} dh={dh}"] = case
    for name, v in run_children(todo, timeout).items():
        rec = dict(case=name, config=todo[name]['config'], verdict='ok' if v['ok'] else v['what'],
                   stage=v['stage'], start_s=v['start_s'], check_s=v['check_s'])
        print(json.dumps(rec), flush=True)
        records.append(rec)
    Path(out).write_text(json.dumps(records, indent=1))
    return 0  # a failed kernel is a verdict in the file, not a failure of this script


if __name__ == '__main__':
    if sys.argv[1:2] == ['--child']:
        child_main(sys.argv[2])
        os._exit(0)  # the verdict is out; torch's and triton's teardown took 3 s more on CPU
    else:
        import argparse
        p = argparse.ArgumentParser(description='the preflight of the Triton kernels, GPT-2-small classes')
        p.add_argument('--report', required=True, help='the JSON file of verdicts')
        p.add_argument('--timeout', type=float, default=TIMEOUT_S)
        p.add_argument('--device', default='cuda')
        p.add_argument('--T', type=int, default=1024)
        p.add_argument('--dh', default='64,128', help='head sizes')
        p.add_argument('--dtype', default='bfloat16')
        a = p.parse_args()
        sys.path.insert(0, str(ROOT))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # gpu_check.sh's timeout: children killed too
        sys.exit(report(a.report, a.timeout, a.device, a.T, [int(x) for x in a.dh.split(',')], a.dtype))
