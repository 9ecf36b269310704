"""
The GPU report: one markdown file from what tools/gpu_check.sh left in its folder, to read
and to paste into an issue. Most important first: the device and versions, which sections
did not finish, each kernel's self-check verdict, the kernels' TFLOP/s beside SDPA, the
GPT-2-small training step per variant, the kernel tests. A missing or unreadable file is
said in its section; the report is always written.

    python tools/gpu_report.py gpu_check_out          # writes gpu_check_out/gpu_check.md
"""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def _load(path, jsonl=False):
    if not path.exists():
        return None
    text = path.read_text()
    if jsonl:
        return [json.loads(x) for x in text.splitlines() if x.strip()]
    return json.loads(text)


def _table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(c).replace('|', '/') for c in r) + ' |' for r in rows]
    return lines


def _num(x, fmt):
    return '' if x is None else format(x, fmt)


def environment(out):
    env = _load(out / 'environment.json')
    if env is None:
        return ['no environment.json (the environment section did not run)']
    keys = ['device', 'capability', 'memory_gib', 'torch', 'cuda', 'triton', 'python', 'platform', 'peak_bf16_flops']
    return _table(['', ''], [(k, env.get(k)) for k in keys if k in env])


def sections(out):
    secs = _load(out / 'gpu_check.json')
    if secs is None:
        return ['no gpu_check.json']
    rows = [(s['section'], s['status'], s['seconds'], s['exit_code']) for s in secs]
    bad = [s['section'] for s in secs if s['status'] != 'ok']
    head = [f"**Not finished: {', '.join(bad)}** (their logs: `<section>.log`)" if bad else 'Every section finished.', '']
    return head + _table(['section', 'status', 'seconds', 'exit code'], rows)


def preflight(out):
    recs = _load(out / 'preflight.json')
    if recs is None:
        return ['no preflight.json (the warm_cache section did not run or finish)']
    bad = [r for r in recs if r['verdict'] != 'ok']
    head = [f"{len(recs) - len(bad)} of {len(recs)} Triton families passed"
            f"{': **' + str(len(bad)) + ' did not** (crashed, hung or disagreed in a child process)' if bad else ''}.",
            '']
    rows = [(r['case'], r['verdict'], r['stage'], r['start_s'], r['check_s'], r['config']) for r in recs]
    return head + _table(['case', 'verdict', 'stage', 'child start s', 'check s', 'configuration class'], rows)


def self_check(out):
    recs = _load(out / 'self_check.json')
    if recs is None:
        return ['no self_check.json (the self_check section did not run or finish)']
    bad = [r for r in recs if r['verdict'] != 'ok']
    head = [f"{len(recs) - len(bad)} of {len(recs)} configurations agree with PyTorch"
            f"{': **' + str(len(bad)) + ' do not**' if bad else ''}.", '']
    rows = [(r['family'], r['dtype'], r['head_dim'], f"{r['Tq']} x {r['Tk']}", r['offset'], r['window'],
             r['verdict'], r['seconds'], r['detail']) for r in recs]
    return head + _table(['family', 'dtype', 'dh', 'Tq x Tk', 'offset', 'window', 'verdict', 's', 'detail'], rows)


def kernels(out):
    recs = _load(out / 'bench_kernels.jsonl', jsonl=True)
    if recs is None:
        return ['no bench_kernels.jsonl (the bench sections did not run)']
    rows = []
    for r in recs:
        if r.get('error'):
            rows.append((r['variant'], r['block_size'], r['head_dim'], '', '', '', '', f"error: {r['error']}"))
        elif r.get('mode') == 'kernel_fwd_bwd':
            rows.append((r['variant'], r['block_size'], r['head_dim'], _num(r['seconds'] * 1e3, '.3f'),
                         _num(r['tflops_per_s'], '.1f'), _num(100 * r['frac_of_peak'], '.1f'),
                         _num(r.get('time_vs_sdpa'), '.2f'), ''))
    return ['Forward + backward, causal, bf16 (bench.py --kernels_only).', ''] + \
        _table(['kernel', 'T', 'dh', 'ms', 'TFLOP/s', '% of peak', 'time / SDPA', ''], rows)


def train_step(out):
    recs = _load(out / 'smoke.json')
    if recs is None:
        return ['no smoke.json (the train_smoke section did not run)']
    rows = [(r['run'], r['rc'], _num(r.get('tokens_per_s'), ',.0f'), _num(100 * r['mfu'] if r.get('mfu') else None,
                                                                          '.1f'),
             _num(r.get('first_step_s'), '.1f')) for r in recs]
    return ['GPT-2 small, compiled train.py (tools/train_smoke.py).', ''] + \
        _table(['run', 'exit', 'tokens/s', 'MFU %', 'first step s'], rows)


def kernel_tests(out):
    path = out / 'kernel_tests.xml'
    if not path.exists():
        return ['no kernel_tests.xml (the kernel_tests section did not run or finish)']
    cases = ET.parse(path).getroot().iter('testcase')
    counts, failed = {'passed': 0, 'failed': 0, 'skipped': 0}, []
    for c in cases:
        if c.find('failure') is not None or c.find('error') is not None:
            counts['failed'] += 1
            failed.append(f"{c.get('classname')}::{c.get('name')}")
        elif c.find('skipped') is not None:
            counts['skipped'] += 1
        else:
            counts['passed'] += 1
    return [', '.join(f"{v} {k}" for k, v in counts.items())] + [f"- failed: `{f}`" for f in failed]


PARTS = [('Device', environment), ('Preflight: each Triton family first run in a child process', preflight),
         ('Sections', sections), ('Self-check of every Triton kernel', self_check),
         ('Kernels beside SDPA', kernels), ('Training step per variant', train_step), ('Kernel tests', kernel_tests)]


def report(out):
    out = Path(out)
    lines = ['# nanoHFA GPU report', '',
             'Written by `bash tools/gpu_check.sh` (tools/gpu_report.py). Please attach this file, and '
             'gpu_check.json beside it, to an issue.', '']
    for title, part in PARTS:
        try:
            body = part(out)
        except Exception as e:  # one unreadable file costs its section only
            body = [f"could not read: {type(e).__name__}: {e}"]
        lines += [f"## {title}", '', *body, '']
    path = out / 'gpu_check.md'
    path.write_text('\n'.join(lines))
    return path


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit('usage: python tools/gpu_report.py OUT_FOLDER')
    print(f"wrote {report(sys.argv[1])}")
