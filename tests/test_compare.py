"""compare.py: the grid harness end to end on a tiny dataset (real train.py runs),
skipping finished runs, resuming interrupted ones, reporting failures; and the
statistics and size matching on their own."""

import csv
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

import compare
from nanohfa import grid
from nanohfa.errors import UserError

TINY = """
device = 'cpu'
eval_interval = 2
eval_iters = 2
log_interval = 1
gradient_accumulation_steps = 1
batch_size = 4
block_size = 16
n_layer = 1
n_head = 4
n_embd = 16
bias = False
learning_rate = 1e-2
max_iters = 4
lr_decay_iters = 4
warmup_iters = 1
"""


def make_dataset(folder):
    """A random 'character' dataset: 20 symbols, train.bin / val.bin / meta.json."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 20, 4000, dtype=np.uint16).tofile(folder / 'train.bin')
    rng.integers(0, 20, 1000, dtype=np.uint16).tofile(folder / 'val.bin')
    itos = [chr(97 + i) for i in range(20)]
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 20, 'itos': itos}))


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp('compare')
    make_dataset(root / 'data')
    (root / 'tiny.py').write_text(TINY)
    return root


def argv(tiny, *more):
    return ['--config', str(tiny / 'tiny.py'), f'--data_dir={tiny / "data"}', '--jobs', '2', '--threads', '1', *more]


@pytest.fixture(scope='module')
def trained(tiny):
    out = tiny / 'grid'
    rc = compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(out)))
    return out, rc


@pytest.mark.slow
def test_grid_rows(trained):
    out, rc = trained
    assert rc == 0
    rows = json.loads((out / 'results.json').read_text())
    assert [r['variant'] for r in rows] == ['sa', 'hybrid']
    sa, hybrid = rows
    for r in rows:
        assert r['n_seeds'] == 2 and r['failed'] == [] and r['tokens'] == 4 * 4 * 16
        losses = [run['val_loss'] for run in r['runs']]
        assert r['val_loss_mean'] == pytest.approx(np.mean(losses))
        assert r['val_loss_std'] == pytest.approx(np.std(losses, ddof=1))
        assert r['val_ppl_mean'] == pytest.approx(np.mean(np.exp(losses)))
        assert r['val_loss_ci95'] == pytest.approx(stats.t.ppf(0.975, 1) * np.std(losses, ddof=1) / math.sqrt(2))
        assert 0 < r['val_loss_mean'] < 2 * math.log(20)
        for run_dir in (out / 'runs' / r['variant']).iterdir():
            log = [json.loads(l) for l in (run_dir / 'log.jsonl').read_text().splitlines()]
            assert [l['iter'] for l in log] == [0, 2, 4]
        run = json.loads((out / 'runs' / r['variant'] / 'seed0' / 'run.json').read_text())
        assert r['params'] == run['params'] and r['flops_per_token'] == run['flops_per_token']
    # each run names the form that computed each of its attention families (run.json's record)
    assert [x['kernels'] for x in sa['runs']] == [{'sa': {'form': 'sdpa'}}] * 2
    assert [x['kernels'] for x in hybrid['runs']] == [{'sa': {'form': 'sdpa'}, 'hfa': {'form': 'torch_kron'}}] * 2
    assert hybrid['params'] > sa['params']  # the 2 HFA heads have a second query/key pair
    assert hybrid['overrides'] == {'attention': 'hfa_v1', 'n_hfa_head': 2}
    assert math.isnan(sa['p_vs_sa']) and 0 <= hybrid['p_vs_sa'] <= 1
    assert hybrid['delta_val_loss_vs_sa'] == pytest.approx(hybrid['val_loss_mean'] - sa['val_loss_mean'])
    seeds = {json.loads((out / 'runs' / 'sa' / f'seed{s}' / 'run.json').read_text())['config']['seed'] for s in (0, 1)}
    assert seeds == {0, 1}
    with open(out / 'results.csv') as f:
        assert [row['variant'] for row in csv.DictReader(f)] == ['sa', 'hybrid']
    table = (out / 'results.md').read_text()
    assert '| sa |' in table and '| hybrid |' in table and 'FAILED' not in table
    assert (out / 'compare.png').stat().st_size > 1000


@pytest.mark.slow
def test_rerun_skips_finished_and_resumes_interrupted(trained, tiny, capsys):
    out, _ = trained
    runs = out / 'runs'
    watched = [runs / v / f'seed{s}' / f for v in ('sa', 'hybrid') for s in (0, 1) for f in ('log.jsonl', 'ckpt.pt')]
    before = {p: p.stat().st_mtime_ns for p in watched}
    assert compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(out))) == 0
    assert '0 to train' in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in watched} == before

    # interrupt sa/seed1 after iteration 2: the checkpoint says 2, the log stops at 2
    d = runs / 'sa' / 'seed1'
    ckpt = torch.load(d / 'ckpt.pt', weights_only=True)
    ckpt['iter_num'] = 2
    torch.save(ckpt, d / 'ckpt.pt')
    lines = (d / 'log.jsonl').read_text().splitlines()
    (d / 'log.jsonl').write_text('\n'.join(lines[:2]) + '\n')
    # hybrid/seed0 died before its first checkpoint: no ckpt.pt, a partial log
    h = runs / 'hybrid' / 'seed0'
    (h / 'ckpt.pt').unlink()
    (h / 'log.jsonl').write_text((h / 'log.jsonl').read_text().splitlines()[0] + '\n')
    untouched = runs / 'sa' / 'seed0' / 'log.jsonl'
    untouched_mtime = untouched.stat().st_mtime_ns

    assert compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(out))) == 0
    assert '2 to train (1 resumed)' in capsys.readouterr().out
    log = (d / 'log.jsonl').read_text().splitlines()
    assert log[:2] == lines[:2]  # kept, not redone from scratch
    assert [json.loads(l)['iter'] for l in log] == [0, 2, 4]
    assert 'resuming from' in (d / 'stdout.txt').read_text()
    assert 'resuming from' not in (h / 'stdout.txt').read_text()
    assert [json.loads(l)['iter'] for l in (h / 'log.jsonl').read_text().splitlines()] == [0, 2, 4]
    assert untouched.stat().st_mtime_ns == untouched_mtime
    rows = json.loads((out / 'results.json').read_text())
    assert [r['n_seeds'] for r in rows] == [2, 2]


@pytest.mark.slow
def test_failed_run_is_reported(tiny, capsys):
    out = tiny / 'broken'
    rc = compare.main(argv(tiny, '--variants', 'broken', '--seeds', '1', '--out', str(out),
                           '--preset', 'broken', 'attention=sa', 'block_size=5000'))  # longer than the data
    assert rc == 1
    row, = json.loads((out / 'results.json').read_text())
    assert row['n_seeds'] == 0 and len(row['failed']) == 1
    assert 'block_size=5000' in row['failed'][0]['stderr_tail']
    assert 'FAILED' in (out / 'results.md').read_text()
    assert 'FAILED' in capsys.readouterr().out


def test_match_params_and_flops(tiny, tmp_path):
    for measure, index in (('params', 0), ('flops', 1)):
        args = grid.parse_args(argv(tiny, '--variants', 'sa,hfa,ha_noshare', '--out', str(tmp_path),
                                       '--match', measure, '--n_embd=64'))
        sa, hfa, ha = grid.plan(args)
        target = (sa['params_planned'], sa['flops_planned'])[index]
        for v in (hfa, ha):
            size = (v['params_planned'], v['flops_planned'])[index]
            assert 'n_embd' in v['overrides'] and v['overrides']['n_embd'] % 4 == 0
            assert v['overrides']['n_embd'] < 64  # both are bigger than SA at the same width
            assert abs(size - target) < abs((sa['params_planned'], sa['flops_planned'])[index] * 0.15)
            # the closest multiple of n_head: no neighbour is closer
            for other in {max(4, v['overrides']['n_embd'] - 4), v['overrides']['n_embd'] + 4}:
                cfg = grid.resolve(args.config, args.extra, {**v['overrides'], 'n_embd': other})
                assert abs(grid.model_size(cfg, 20)[index] - target) >= abs(size - target)
    args = grid.parse_args(argv(tiny, '--variants', 'sa,hfa', '--out', str(tmp_path), '--match', 'params',
                                   '--match_by', 'head_dim', '--n_embd=64'))
    sa, hfa = grid.plan(args)
    assert hfa['overrides']['head_dim'] < 16 and hfa['cfg']['n_embd'] == 64


def test_match_tokens_rescales_iterations(tiny, tmp_path):
    args = grid.parse_args(argv(tiny, '--variants', 'sa,short', '--out', str(tmp_path), '--match_tokens',
                                   '--preset', 'short', 'attention=sa', 'block_size=8'))
    sa, short = grid.plan(args)
    assert short['cfg']['max_iters'] == 8 and short['cfg']['lr_decay_iters'] == 8
    assert sa['cfg']['max_iters'] * 4 * 16 == short['cfg']['max_iters'] * 4 * 8


def test_statistics():
    m, s, ci = grid.mean_std_ci([1.0, 2.0, 3.0])
    assert (m, s) == (2.0, 1.0) and ci == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert math.isnan(grid.mean_std_ci([1.0])[1])
    assert grid.welch_p([1.0, 1.1, 0.9], [5.0, 5.2, 4.9]) < 1e-3
    assert grid.welch_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert math.isnan(grid.welch_p([1.0], [2.0, 3.0]))


@pytest.mark.slow
def test_refuses_runs_made_with_other_settings(trained, tiny):
    out, _ = trained
    with pytest.raises(UserError, match='learning_rate'):
        compare.main(argv(tiny, '--variants', 'sa', '--seeds', '1', '--out', str(out), '--learning_rate=0.5'))


def test_welch_p_is_welch_not_student():
    """Unequal variances and sizes: Welch's test (Satterthwaite's df, unpooled variance) and
    Student's (pooled) give different p-values; welch_p must be Welch's, from the formula."""
    a, b = [1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 5.0, 0.5]
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    welch = 2 * stats.t.sf(abs(t), df)
    pooled = ((len(a) - 1) * np.var(a, ddof=1) + (len(b) - 1) * np.var(b, ddof=1)) / (len(a) + len(b) - 2)
    t_s = (np.mean(a) - np.mean(b)) / math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    student = 2 * stats.t.sf(abs(t_s), len(a) + len(b) - 2)
    assert abs(welch - student) > 0.05  # the case tells the two tests apart
    assert grid.welch_p(a, b) == pytest.approx(welch, rel=1e-9)


def test_a_preset_may_carry_its_own_seeds(tiny):
    """`--preset NAME ... seeds=3` trains that variant on seeds 0..2 in a grid of one seed, and
    the seed count never reaches train.py as a setting."""
    args = grid.parse_args(argv(tiny, '--variants', 'sa,more', '--seeds', '1', '--out', str(tiny / 'own'),
                                   '--preset', 'more', 'attention=sa', 'seeds=3'))
    variants = grid.plan(args)
    runs = [(v['variant'], s) for v, s, _, _ in compare.grid_runs(args, variants, args.seeds)]
    assert runs == [('sa', 0), ('more', 0), ('more', 1), ('more', 2)]
    assert 'seeds' not in variants[1]['overrides'] and 'seeds' not in variants[1]['cfg']


def test_the_table_header_names_each_presets_own_seeds(tiny):
    """A grid whose presets carry their own seeds says so above its table, not the grid's --seeds."""
    args = grid.parse_args(argv(tiny, '--variants', 'sa,more', '--seeds', '1', '--out', str(tiny / 'own'),
                                   '--preset', 'more', 'attention=sa', 'seeds=3,4'))
    variants = grid.plan(args)
    rows = compare.summarize(args, variants, args.seeds, {})
    header = compare.markdown_table(args, rows, variants, args.seeds).splitlines()[0]
    assert 'seeds sa [0], more [3, 4];' in header
    args = grid.parse_args(argv(tiny, '--variants', 'sa', '--seeds', '2', '--out', str(tiny / 'own')))
    variants = grid.plan(args)
    assert 'seeds [0, 1];' in compare.markdown_table(args, compare.summarize(args, variants, args.seeds, {}),
                                                     variants, args.seeds).splitlines()[0]


@pytest.mark.slow
def test_runs_recorded_in_results_json_count_as_finished_without_their_folders(trained, tiny, capsys):
    """A fresh clone has results.json (in git) but no runs/: rerunning the grid trains nothing
    and writes the same numbers."""
    out, _ = trained
    clone = tiny / 'clone'
    clone.mkdir()
    (clone / 'results.json').write_text((out / 'results.json').read_text())
    assert compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(clone))) == 0
    assert '0 to train' in capsys.readouterr().out
    assert not (clone / 'runs').exists()
    before, after = (json.loads((d / 'results.json').read_text()) for d in (out, clone))
    for a, b in zip(before, after):
        assert [r['val_loss'] for r in a['runs']] == [r['val_loss'] for r in b['runs']]
        assert a['val_loss_mean'] == b['val_loss_mean'] and a['curves'] == b['curves']


@pytest.mark.slow
def test_collecting_marks_finished_runs_collected_not_unrun(trained, tiny):
    """--collect_only trains nothing; a run whose folder holds a finished log is recorded as
    collected, so results.json never says a finished run did not run."""
    out, _ = trained
    assert compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(out), '--collect_only')) == 0
    rows = json.loads((out / 'results.json').read_text())
    assert {r['status'] for row in rows for r in row['runs']} == {'collected'}


@pytest.mark.slow
def test_a_run_that_fell_back_to_pytorch_is_named_in_the_summary(trained, tiny):
    """A run whose Triton kernel failed its preflight (run.json's kernels path 'pytorch') is
    listed under the table: its speed is not the kernel's."""
    out, _ = trained
    copy = tiny / 'fell_back'
    shutil.copytree(out, copy)
    info_path = copy / 'runs' / 'hybrid' / 'seed1' / 'run.json'
    info = json.loads(info_path.read_text())
    info['kernels']['hfa'] = {'form': 'torch_kron', 'path': 'pytorch', 'why': 'a crash in the preflight'}
    info_path.write_text(json.dumps(info))
    assert compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(copy), '--collect_only')) == 0
    assert ("Runs whose Triton kernel failed its preflight and ran on PyTorch (1): hybrid seed 1 (hfa)."
            in (copy / 'results.md').read_text())
    rows = {r['variant']: r for r in json.loads((copy / 'results.json').read_text())}
    assert rows['hybrid']['runs'][1]['kernels']['hfa'] == {'form': 'torch_kron', 'path': 'pytorch'}


@pytest.mark.slow
def test_a_summary_with_fewer_runs_never_replaces_one_with_more(trained, tiny):
    out, _ = trained
    files = {p: p.read_bytes() for p in (out / 'results.json', out / 'results.md', out / 'results.csv')}
    with pytest.raises(UserError, match=r'holds 4 finished run\(s\) this summary would drop .*max_iters 4 there, 30 asked'):
        compare.main(argv(tiny, '--variants', 'sa,hybrid', '--seeds', '2', '--out', str(out), '--collect_only',
                          '--max_iters=30'))
    assert {p: p.read_bytes() for p in files} == files
    copy = tiny / 'overwritten'
    copy.mkdir()
    (copy / 'results.json').write_text(files[out / 'results.json'].decode())
    assert compare.main(argv(tiny, '--variants', 'sa', '--seeds', '2', '--out', str(copy), '--collect_only',
                             '--max_iters=30', '--overwrite')) == 1  # asked for: nothing finished, so rc 1
    assert json.loads((copy / 'results.json').read_text())[0]['n_seeds'] == 0


@pytest.mark.slow
def test_fewer_than_three_seeds_carry_a_caveat_and_the_difference_its_interval(trained):
    out, _ = trained
    sa, hybrid = json.loads((out / 'results.json').read_text())
    a, b = [r['val_loss'] for r in hybrid['runs']], [r['val_loss'] for r in sa['runs']]
    assert hybrid['delta_ci95'] == pytest.approx(grid.welch_ci(a, b)) and math.isnan(sa['delta_ci95'])
    table = (out / 'results.md').read_text()
    assert 'Fewer than 3 seeds (sa, hybrid)' in table and 'Δ 95% CI' in table


def test_welch_interval_of_a_difference():
    """The half-width is t(0.975, Welch-Satterthwaite df) x the standard error of the difference,
    and a test at the interval's edge has p = 0.05."""
    a, b = [1.0, 1.3, 0.9, 1.25, 1.1], [0.7, 0.95, 0.72]
    half = grid.welch_ci(a, b)
    va, vb = np.var(a, ddof=1) / 5, np.var(b, ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 4 + vb ** 2 / 2)
    assert half == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(va + vb))
    shifted = [x - (np.mean(a) - np.mean(b) - half) for x in a]  # the interval's lower edge at 0
    assert grid.welch_p(shifted, b) == pytest.approx(0.05, rel=1e-6)
    assert math.isnan(grid.welch_ci([1.0], b))


def test_a_preset_with_seeds_0_is_refused_and_the_forms_it_names_run_seed_0_alone(tiny):
    def planned_seeds(form):
        args = grid.parse_args(argv(tiny, '--variants', 'sa', '--out', str(tiny / 'zero'), '--preset', 'sa', form))
        return grid.seeds_of(grid.plan(args)[0], args.seeds)

    with pytest.raises(UserError, match='seeds=0 is a count of no seeds') as refused:
        planned_seeds('seeds=0')
    message = str(refused.value)
    named = re.search(r'for seed 0 alone give the count (\S+) or the list (\S+) or (\S+) \(', message).groups()
    assert named == ('seeds=1', 'seeds=0,', 'seeds=[0]')
    for form in named:  # each form the message names runs seed 0 alone, as configurator.literal reads it
        assert planned_seeds(form) == [0], form
    assert planned_seeds('seeds=0,2') == [0, 2]


def processes_mentioning(text):
    found = []
    for proc in Path('/proc').iterdir():
        try:
            if proc.name.isdigit() and text in (proc / 'cmdline').read_bytes().decode(errors='replace'):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc').is_dir(), reason='reads /proc to find surviving processes')
def test_a_signal_to_compare_stops_its_runs_which_save_and_resume(tiny):
    """SIGTERM to compare.py alone (as a scheduler sends it): every train.py it started saves and
    exits, compare.py exits 0 with one line, and the same command then resumes the run."""
    import signal
    import subprocess
    import sys
    import time
    out = tiny / 'signalled'
    cmd = [sys.executable, str(Path(compare.__file__)), *argv(tiny, '--variants', 'sa', '--seeds', '2', '--out', str(out),
                                                           '--max_iters=100000', '--lr_decay_iters=100000')]
    parent = subprocess.Popen(cmd, cwd=Path(compare.__file__).parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    ckpt = out / 'runs' / 'sa' / 'seed0' / 'ckpt.pt'
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline and parent.poll() is None:
        time.sleep(0.2)
    assert ckpt.exists(), parent.communicate()[1]
    parent.send_signal(signal.SIGTERM)
    stdout, stderr = parent.communicate(timeout=150)
    assert parent.returncode == 0, stderr
    assert 'stopped by SIGTERM' in stdout and 'rerun the same command to continue' in stdout
    assert processes_mentioning(str(out)) == []  # no train.py left behind
    assert not (out / 'results.json').exists()  # nothing summarised from a stopped grid
    assert 'stopped by signal at iteration' in (out / 'runs' / 'sa' / 'seed0' / 'stdout.txt').read_text()
    args = grid.parse_args(cmd[2:])
    states = {(v['variant'], s): state for v, s, _, state in compare.grid_runs(args, grid.plan(args), args.seeds)}
    assert states[('sa', 0)] == 'resume'
    assert torch.load(ckpt, weights_only=True)['iter_num'] > 0


def stop_grid(tiny, out, grace_s, signals=('SIGTERM',), **faults):
    """compare.py with one 2-process run (torchrun), stopped by `signals` (a second one a second after
    the first) once the run is training, with tests/faults' hooks in train.py; returns (compare.py's
    stdout, its exit status)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    root = Path(compare.__file__).parent
    env = dict(os.environ, PYTHONPATH=str(root / 'tests' / 'faults'), TORCH_ELASTIC_SHUTDOWN_TIMEOUT='2',
               **{f'NANOHFA_TEST_{k}': str(v) for k, v in faults.items()})
    cmd = [sys.executable, str(root / 'compare.py'), *argv(tiny, '--variants', 'sa', '--seeds', '1', '--out', str(out),
                                                           '--nproc', '2', '--gradient_accumulation_steps=2',
                                                           '--max_iters=100000', '--lr_decay_iters=100000',
                                                           f'--stop_grace_s={grace_s}')]
    parent = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = out / 'runs' / 'sa' / 'seed0' / 'ckpt.pt'
    deadline = time.time() + 180
    while not ckpt.exists() and time.time() < deadline and parent.poll() is None:
        time.sleep(0.2)
    assert ckpt.exists(), parent.communicate()[1]
    for i, name in enumerate(signals):
        time.sleep(i)
        parent.send_signal(getattr(signal, name))
    stdout, stderr = parent.communicate(timeout=180)
    assert processes_mentioning(str(out)) == []  # no train.py, no torchrun left behind
    return stdout, parent.returncode


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc').is_dir(), reason='reads /proc to find surviving processes')
def test_a_stop_gives_torchrun_workers_the_whole_grace_period_to_save(tiny):
    """The save after the stop takes 8 s, torchrun's own shutdown timeout is 2 s (as its 30 s default is
    for a large checkpoint): the workers are told themselves, torchrun waits --stop_grace_s, the save
    finishes, and compare.py says at which iteration."""
    out = tiny / 'graceful'
    stdout, rc = stop_grid(tiny, out, 60, SLOW_SAVE=8)
    assert rc == 0
    said = re.search(r"sa seed 0: saved at iteration (\d+) \(", stdout)
    assert 'stopped by SIGTERM; rerun the same command to continue' in stdout and said, stdout
    run = out / 'runs' / 'sa' / 'seed0'
    assert torch.load(run / 'ckpt.pt', weights_only=True)['iter_num'] == int(said.group(1))
    assert not (run / 'ckpt.pt.tmp').exists()
    assert f"stopped by signal at iteration {said.group(1)}" in (run / 'stdout.txt').read_text()


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc').is_dir(), reason='reads /proc to find surviving processes')
def test_a_save_slower_than_the_grace_period_is_reported_as_not_saved(tiny):
    """The save takes 60 s, --stop_grace_s is 3: the run is killed mid-save, and compare.py says it
    was not saved and which checkpoint is the last good one (which loads)."""
    out = tiny / 'too_slow'
    stdout, rc = stop_grid(tiny, out, 3, SLOW_SAVE=60)
    assert rc == 0
    said = re.search(r"sa seed 0: NOT saved: killed [34] s after the stop, before its save finished; its last good "
                     r"checkpoint is iteration (\d+) \(", stdout)
    assert said and 'saved at iteration' not in stdout, stdout
    run = out / 'runs' / 'sa' / 'seed0'
    assert torch.load(run / 'ckpt.pt', weights_only=True)['iter_num'] == int(said.group(1))
    assert (run / 'ckpt.pt.tmp').exists()  # the save that was killed
    assert 'stopped by signal' not in (run / 'stdout.txt').read_text()


@pytest.mark.slow
@pytest.mark.skipif(not Path('/proc').is_dir(), reason='reads /proc to find surviving processes')
def test_a_second_ctrl_c_stops_the_runs_at_once_and_says_they_were_not_saved(tiny):
    """Ctrl-C reaches compare.py alone (each run has a session of its own): the first stops the runs as
    SIGTERM does; a second, a second later, kills them without waiting for the 60 s save."""
    import time
    out = tiny / 'two_ctrl_c'
    t0 = time.time()
    stdout, rc = stop_grid(tiny, out, 120, signals=('SIGINT', 'SIGINT'), SLOW_SAVE=60)
    assert rc == 0 and time.time() - t0 < 120
    assert re.search(r"stopped by SIGINT; .*\n  sa seed 0: NOT saved: killed [12] s after the stop, before its save "
                     r"finished; its last good checkpoint is iteration \d+", stdout), stdout
