"""
Smoke test of train.py on a GPU: a few iterations of every GPU config (and of the
config/ia_table.py grid's variants) with torch.compile on, one process, on a synthetic
GPT-2-token dataset made on the spot; prints each run's tokens/s, MFU and first-step time.

    python tools/train_smoke.py                    # every distinct model, 20 iterations each
    python tools/train_smoke.py --only sa,ha --iters 20 --out gpu_check_out
    python tools/train_smoke.py --sync_check       # host-device syncs: as many for 16 steps as for 6

Configs whose model and batch equal an earlier one's (e.g. owt_gpt3small_sa and sa) are run
once. Needs CUDA (on CPU it runs too, slowly, with --device=cpu --compile=False).
"""

import argparse
import array
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compare  # noqa: E402
from tools.budgets import gpu_configs  # noqa: E402

MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'batch_size', 'attention', 'attn_layers', 'head_dim',
              'hfa_order', 'n_hfa_head', 'hfa_kron', 'ha_order', 'ha_share_kv', 'ha_window1', 'ha_window2',
              'attn_window', 'linear_norm', 'bias', 'dropout')


def synthetic_data(folder, n_train=4_000_000, n_val=400_000):
    """Uniform random GPT-2 token ids in nanoGPT's layout (the loss stays ~log 50257);
    uint16 written with the standard library (the GPU image may lack numpy)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, n in (('train', n_train), ('val', n_val)):
        with open(folder / f'{split}.bin', 'wb') as f:
            array.array('H', (rng.randrange(50257) for _ in range(n))).tofile(f)
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'gpt2', 'vocab_size': 50257}))
    return folder


SYNC_WRAP = '''
import runpy, sys, warnings, torch
torch.cuda.set_sync_debug_mode('warn')
count = [0]
def show(message, *args, **kwargs):
    count[0] += 'synchroniz' in str(message)
warnings.showwarning = show
warnings.simplefilter('always')
sys.argv = ['train.py'] + sys.argv[1:]
try:
    runpy.run_path('train.py', run_name='__main__')
finally:
    print('SYNC_WARNINGS', count[0])
'''
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--eval_iters=2', '--warmup_iters=2', '--learning_rate=1e-2']


def sync_counts(data, work, iters=(6, 16), extra=()):
    """Host-device syncs that torch.cuda.set_sync_debug_mode flags in whole tiny CUDA runs of
    `iters` steps each, evaluated and logged only at the start and the end: the loop is
    sync-free per step when the counts are equal. Returns [(count, returncode, output)]."""
    out = []
    for n in iters:
        cmd = [sys.executable, '-c', SYNC_WRAP, *TINY, f'--data_dir={data}', f'--out_dir={Path(work) / f"sync{n}"}',
               f'--max_iters={n}', f'--lr_decay_iters={n}', '--eval_interval=1000', '--log_interval=1000',
               '--device=cuda', *extra]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        m = re.search(r'SYNC_WARNINGS (\d+)', r.stdout)
        out.append((int(m.group(1)) if m else None, r.returncode, r.stdout + r.stderr))
    return out


def schedule_args(iters):
    """train.py's schedule for a run of `iters` steps: warmup shorter than the decay, which
    train.py's get_lr divides by (iters = 2 with warmup 2 divided by zero)."""
    return [f'--max_iters={iters}', f'--lr_decay_iters={iters}', f'--warmup_iters={min(2, max(iters - 1, 0))}']


def runs_to_make(wanted=()):
    """(name, config file, overrides) of every distinct GPU model; `wanted` names (a run's
    name or its part after ':') are chosen before models are merged, so `sa` runs as sa."""
    out, seen = [], {}
    candidates = [(p.stem, str(p), {}) for p in gpu_configs()]
    ia = ROOT / 'config' / 'ia_table.py'
    with tempfile.TemporaryDirectory() as tmp:
        args = compare.parse_args(['--config', str(ia), '--out', tmp])
        candidates += [(f"ia_table:{v['variant']}", str(ia), v['overrides']) for v in compare.plan(args)]
    if wanted:
        candidates = [c for c in candidates if c[0] in wanted or c[0].split(':')[-1] in wanted]
    for name, path, overrides in candidates:
        cfg = compare.resolve(path, [], overrides)
        kinds = set(cfg['attn_layers'].split(',')) if cfg['attn_layers'] else {cfg['attention']}
        key = tuple(cfg[k] for k in MODEL_KEYS if not (k.startswith('ha_') and 'ha' not in kinds)
                    and not (k.startswith('hfa_') and not kinds & {'hfa_v1', 'hfa_v2'}))
        if key in seen:
            print(f"{name}: the model of {seen[key]}, not run again")
            continue
        seen[key] = name
        out.append((name, path, overrides))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--iters', type=int, default=20)
    p.add_argument('--accum', type=int, default=2, help='gradient_accumulation_steps of every run')
    p.add_argument('--only', default='', help='comma list of run names (default: all)')
    p.add_argument('--timeout', type=int, default=300, help='seconds per run')
    p.add_argument('--out', default='', help='folder for smoke.json')
    p.add_argument('--sync_check', action='store_true', help='only count host-device syncs (CUDA)')
    p.add_argument('extra', nargs='*', help='more train.py --key=value settings')
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix='train_smoke_'))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix='train_smoke_work_'))
    data = synthetic_data(work / 'data')
    if args.sync_check:
        res = sync_counts(data, work, extra=args.extra)
        for n, (count, rc, log) in zip((6, 16), res):
            print(f"{n} steps: {count} syncs flagged (exit {rc})")
            if rc:
                print(log[-2000:])
        ok = all(rc == 0 for _, rc, _ in res) and res[0][0] == res[1][0]
        print('no per-step sync' if ok else 'FAILED: syncs grow with the number of steps')
        return 0 if ok else 1
    wanted = set(filter(None, args.only.split(',')))
    results = []
    for name, path, overrides in runs_to_make(wanted):
        cmd = [sys.executable, str(ROOT / 'train.py'), path, *compare.as_args(overrides),
               f'--data_dir={data}', f'--out_dir={work / name.replace(":", "_")}', *schedule_args(args.iters), f'--eval_interval={args.iters}',
               '--eval_iters=2', '--log_interval=5', f'--gradient_accumulation_steps={args.accum}',
               '--compile=True', '--wandb_log=False', '--always_save_checkpoint=False', *args.extra]
        t0 = time.time()
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
            log, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:  # its partial output may come as bytes
            text = lambda b: b.decode(errors='replace') if isinstance(b, bytes) else b or ''
            log, rc = text(e.stdout) + text(e.stderr), 'timeout'
        with open(work / 'smoke.log', 'a') as f:  # every run's whole output
            f.write(f"\n=== {name}: {' '.join(cmd)}\n{log}")
        final = re.search(r'final: .*?([\d,]+) tokens/s(?:, mfu ([\d.]+)%)?', log)
        first = re.search(r'iter 0: .*time (\d+)ms \(first step', log)
        res = {'run': name, 'rc': rc, 'wall_s': round(time.time() - t0, 1),
               'tokens_per_s': float(final.group(1).replace(',', '')) if final else None,
               'mfu': float(final.group(2)) / 100 if final and final.group(2) else None,
               'first_step_s': int(first.group(1)) / 1000 if first else None}
        results.append(res)
        print(f"{name:<26} rc {rc!s:>7}  {res['tokens_per_s'] or 0:>10,.0f} tokens/s  "
              f"MFU {100 * (res['mfu'] or 0):5.1f}%  first step {res['first_step_s'] or 0:6.1f} s  "
              f"({res['wall_s']:.0f} s)", flush=True)
        if rc != 0:
            print('\n'.join('    ' + l for l in log.strip().splitlines()[-6:]))
        (out / 'smoke.json').write_text(json.dumps(results, indent=1))  # after every run: a kill keeps them
    print(f"wrote {out / 'smoke.json'}; every run's output: {work / 'smoke.log'}")
    return 0 if results and all(r['rc'] == 0 for r in results) else 1


if __name__ == '__main__':
    sys.exit(main())
