"""
tools/gpu_report.py: the markdown a user sends after a first GPU run, from what
tools/gpu_check.sh left in its folder (made up here), with every section present and with
the files of sections that did not run missing.
"""

import json

from tools import gpu_report


def write(out, name, obj, jsonl=False):
    (out / name).write_text('\n'.join(json.dumps(r) for r in obj) if jsonl else json.dumps(obj))


def test_report_of_a_whole_run(tmp_path):
    write(tmp_path, 'environment.json', dict(device='NVIDIA H100 80GB HBM3', capability='9.0', torch='2.11.0',
                                             triton='3.6.0', cuda='12.8'))
    write(tmp_path, 'gpu_check.json', [dict(section='environment', status='ok', exit_code=0, seconds=3, log='x'),
                                       dict(section='kernel_tests', status='timeout', exit_code=124, seconds=40,
                                            log='y')])
    write(tmp_path, 'preflight.json', [
        dict(case='hfa dh=64', config='hfa A=2 bfloat16 dh=64 causal cuda sm_90 tiles ... T=1024', verdict='ok',
             stage='compare', start_s=6.1, check_s=3.2),
        dict(case='ha dh=128', config='ha bfloat16 dh=128 causal window cuda sm_90 tiles ... T=1024',
             verdict='illegal memory access in the preflight (CUDA error 700)', stage='bwd', start_s=6.3,
             check_s=None)])
    write(tmp_path, 'self_check.json', [
        dict(family='hfa', dtype='bfloat16', head_dim=64, Tq=1024, Tk=1024, offset=0, window=0, verdict='ok',
             detail='', seconds=1.5, checked=[]),
        dict(family='ha', dtype='bfloat16', head_dim=128, Tq=1024, Tk=1024, offset=0, window=[512, 32],
             verdict='mismatch', detail='Triton ha3_backward (ha bfloat16 dh=128 ...) disagrees with PyTorch: '
                                        'dk2 relative RMSE 3.1e-01 > 1.6e-02', seconds=2.0, checked=[])])
    write(tmp_path, 'bench_kernels.jsonl', [
        dict(variant='sdpa', block_size=4096, head_dim=64, mode='kernel_fwd_bwd', seconds=0.002, tflops_per_s=400.0,
             frac_of_peak=0.4, time_vs_sdpa=1.0),
        dict(variant='ha_win', block_size=4096, head_dim=64, mode='kernel_fwd', seconds=0.01, tflops_per_s=1.0,
             frac_of_peak=0.1, time_vs_sdpa=5.0),
        dict(variant='ha_win', block_size=4096, head_dim=128, mode='kernel_fwd_bwd', error='KernelMismatch: ...')],
          jsonl=True)
    write(tmp_path, 'smoke.json', [dict(run='ha', rc=0, tokens_per_s=123456.0, mfu=0.31, first_step_s=40.0)])
    (tmp_path / 'kernel_tests.xml').write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b">'
        '<failure message="x"/></testcase><testcase classname="t" name="c"><skipped/></testcase>'
        '</testsuite></testsuites>')
    text = gpu_report.report(tmp_path).read_text()
    assert text.index('## Device') < text.index('## Preflight') < text.index('## Sections') < text.index('## Self-check') < \
        text.index('## Kernels beside SDPA') < text.index('## Training step') < text.index('## Kernel tests')
    assert 'NVIDIA H100 80GB HBM3' in text and '| triton | 3.6.0 |' in text
    assert '**Not finished: kernel_tests**' in text
    assert '1 of 2 Triton families passed: **1 did not** (crashed, hung or disagreed' in text
    assert '| ha dh=128 | illegal memory access in the preflight (CUDA error 700) | bwd | 6.3 |' in text
    assert '1 of 2 configurations agree with PyTorch: **1 do not**' in text and 'dk2 relative RMSE' in text
    assert '| sdpa | 4096 | 64 | 2.000 | 400.0 | 40.0 | 1.00 |  |' in text
    assert 'error: KernelMismatch' in text and '| ha_win | 4096 | 64 |' not in text  # forward-only rows left out
    assert '| ha | 0 | 123,456 | 31.0 | 40.0 |' in text
    assert '1 passed, 1 failed, 1 skipped' in text and '`t::b`' in text


def test_report_when_nothing_ran(tmp_path):
    text = gpu_report.report(tmp_path).read_text()
    assert text.count('## ') == 7
    assert 'no preflight.json' in text and 'no self_check.json' in text and 'no bench_kernels.jsonl' in text and 'no kernel_tests.xml' in text


def test_an_unreadable_file_costs_its_section_only(tmp_path):
    (tmp_path / 'self_check.json').write_text('{not json')
    write(tmp_path, 'smoke.json', [dict(run='sa', rc=0, tokens_per_s=1.0, mfu=None, first_step_s=None)])
    text = gpu_report.report(tmp_path).read_text()
    assert 'could not read: JSONDecodeError' in text and '| sa | 0 | 1 |' in text
