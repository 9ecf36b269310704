"""compare.py --launcher=slurm against a real SLURM (the session's `slurm_cluster`: munged, slurmctld and
slurmd on this machine, no mock of sbatch, squeue or submitit), on tiny CPU models: a grid through
SLURM equals the same grid run here; a job told to stop (SLURM's warning signal before a time limit
or a preemption) is requeued and its run ends bit-identical to an uninterrupted one; torchrun inside
one job equals the local 2-process run; resubmitting a running grid submits nothing; a failing job
is reported, not requeued; --status and --collect_only read a half-done grid; bad input is one line."""

import json
import subprocess
import time
from pathlib import Path

import pytest

import tiny_grid

import compare
import grid
import slurm
from errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TINY = """
device = 'cpu'
compile = False
eval_interval = 10
eval_iters = 2
log_interval = 10
gradient_accumulation_steps = 1
batch_size = 4
block_size = 32
n_layer = 1
n_head = 2
n_embd = 32
learning_rate = 1e-2
max_iters = 20
lr_decay_iters = 20
warmup_iters = 2
"""
SLURM = ['--launcher=slurm', '--slurm_gpus_per_node=0', '--slurm_poll_s=0.5']  # the test node has no GPUs


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return tiny_grid.write(tmp_path_factory.mktemp('slurm'), TINY)


def argv(tiny, out, *more):
    return ['--config', str(tiny / 'tiny.py'), f'--data_dir={tiny / "data"}', '--threads', '1', '--out', str(out), *more]


def losses(run_dir):
    """Every evaluation of a run: (iteration, train loss, val loss), all digits."""
    return [(r['iter'], r['train_loss'], r['val_loss']) for r in compare.read_jsonl(run_dir / 'log.jsonl')]


def job_of(run_dir):
    return json.loads((run_dir / slurm.RECORD).read_text())['job_id']


def job_info(job):
    """`scontrol show job` as a dict (JobState, Restarts, ...)."""
    text = subprocess.run(['scontrol', 'show', 'job', '-o', job], capture_output=True, text=True).stdout
    return dict(kv.split('=', 1) for kv in text.split() if '=' in kv)


def wait_for(ready, timeout=120, what=''):
    deadline = time.time() + timeout
    while not ready():
        assert time.time() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_grid_through_slurm_equals_the_grid_run_here(slurm_cluster, tiny, capsys):
    grid_args = ['--variants', 'sa,hfa', '--seeds', '2']
    assert compare.main(argv(tiny, tiny / 'local', *grid_args, '--jobs', '2')) == 0
    assert compare.main(argv(tiny, tiny / 'slurm', *grid_args, *SLURM, '--wait')) == 0
    out = capsys.readouterr().out
    assert 'submitted 4 SLURM jobs' in out and '--status' in out
    for v in ('sa', 'hfa'):
        for s in (0, 1):
            here, there = (tiny / g / 'runs' / v / f'seed{s}' for g in ('local', 'slurm'))
            assert losses(there) == losses(here) and losses(here)[-1][0] == 20
            assert f"(SLURM job {job_of(there).split('_')[0]}" in (there / 'stdout.txt').read_text()
    rows = {g: json.loads((tiny / g / 'results.json').read_text()) for g in ('local', 'slurm')}
    assert [[run['val_loss'] for run in r['runs']] for r in rows['slurm']] == \
        [[run['val_loss'] for run in r['runs']] for r in rows['local']]
    assert all('SLURM job' in run['status'] for r in rows['slurm'] for run in r['runs'])


@pytest.mark.slow
def test_a_job_stopped_before_its_time_limit_is_requeued_and_resumes_exactly(slurm_cluster, tiny, capsys):
    """SIGUSR2 to the job is what SLURM sends --slurm_signal_s before the time limit (sbatch --signal)
    and before a preemption: train.py saves, submitit requeues the job, the job resumes the run."""
    long = ['--variants', 'sa', '--seeds', '1', '--max_iters=1000', '--lr_decay_iters=1000', '--eval_interval=50']
    assert compare.main(argv(tiny, tiny / 'uninterrupted', *long)) == 0
    out = tiny / 'requeued'
    assert compare.main(argv(tiny, out, *long, *SLURM)) == 0
    run = out / 'runs' / 'sa' / 'seed0'
    job = job_of(run)
    wait_for(lambda: (run / 'ckpt.pt').exists(), what='the first checkpoint')  # 950 iterations to go
    subprocess.run(['scancel', '--signal=USR2', job], check=True)
    wait_for(lambda: job_info(job).get('Restarts') == '1', what='the requeue')  # it starts again after cred_expire
    assert compare.main(argv(tiny, out, *long, *SLURM, '--wait')) == 0
    stdout = (run / 'stdout.txt').read_text()
    assert 'stopped by signal at iteration' in stdout and stdout.count(f'(SLURM job {job})') == 2
    assert 'resume (SLURM job' in stdout
    assert job_info(job)['JobState'] == 'COMPLETED' and job_info(job)['Restarts'] == '1'
    interrupted, uninterrupted = losses(run), losses(tiny / 'uninterrupted' / 'runs' / 'sa' / 'seed0')
    stopped_at = stdout.split('stopped by signal at iteration ')[1].split(';')[0]
    with capsys.disabled():
        print(f"\nrequeued run (stopped at iteration {stopped_at}), final (iter, train loss, val loss): {interrupted[-1]}"
              f"\nuninterrupted run, final (iter, train loss, val loss):                         {uninterrupted[-1]}")
    assert interrupted == uninterrupted and interrupted[-1][0] == 1000


@pytest.mark.slow
def test_torchrun_inside_one_job_equals_the_local_two_process_run(slurm_cluster, tiny):
    two = ['--variants', 'sa', '--seeds', '1', '--nproc', '2', '--gradient_accumulation_steps=2']
    assert compare.main(argv(tiny, tiny / 'ddp_local', *two)) == 0
    assert compare.main(argv(tiny, tiny / 'ddp_slurm', *two, *SLURM, '--wait')) == 0
    here, there = (tiny / g / 'runs' / 'sa' / 'seed0' for g in ('ddp_local', 'ddp_slurm'))
    assert '2 processes' in (there / 'stdout.txt').read_text()
    assert losses(there) == losses(here) and losses(here)[-1][0] == 20
    assert job_info(job_of(there))['NumCPUs'] == '2'  # --threads 1 x --nproc 2


@pytest.mark.slow
def test_resubmitting_a_running_grid_submits_nothing_and_status_and_collect_read_it(slurm_cluster, tiny, capsys):
    out = tiny / 'half'
    half = ['--variants', 'sa,endless', '--seeds', '1', '--preset', 'endless', 'attention=sa',
            'max_iters=1000000', 'lr_decay_iters=1000000', *SLURM]
    assert compare.main(argv(tiny, out, *half)) == 0
    assert 'submitted 2 SLURM jobs' in capsys.readouterr().out
    endless = out / 'runs' / 'endless' / 'seed0'
    wait_for(lambda: compare.run_state(out / 'runs' / 'sa' / 'seed0', 20) == 'done' and (endless / 'ckpt.pt').exists(),
             what='one run done and the other running')
    job = job_of(endless)

    assert compare.main(argv(tiny, out, *half)) == 0  # the same command again
    said = capsys.readouterr().out
    assert 'submitted 0 SLURM jobs, 1 already queued or running, 1 finished' in said
    assert job_of(endless) == job

    assert compare.main(argv(tiny, out, *half, '--status')) == 0
    table = capsys.readouterr().out
    assert '2 runs: 0 pending, 1 running, 1 done, 0 failed' in table
    assert any(l.split()[:3] == ['endless', '0', 'running'] and job in l for l in table.splitlines())

    assert compare.main(argv(tiny, out, *half, '--collect_only')) == 1  # one run unfinished
    rows = {r['variant']: r for r in json.loads((out / 'results.json').read_text())}
    assert rows['sa']['n_seeds'] == 1 and rows['endless']['n_seeds'] == 0 and len(rows['endless']['failed']) == 1

    subprocess.run(['scancel', job], check=True)  # train.py saves on SLURM's SIGTERM; the job ends cancelled
    wait_for(lambda: job_info(job).get('JobState') == 'CANCELLED', what='the cancelled job')
    compare.main(argv(tiny, out, *half, '--status'))
    assert any(l.split()[:3] == ['endless', '0', 'failed'] and 'CANCELLED' in l for l in capsys.readouterr().out.splitlines())


@pytest.mark.slow
def test_a_job_that_fails_is_reported_not_requeued(slurm_cluster, tiny, capsys):
    out = tiny / 'broken'
    rc = compare.main(argv(tiny, out, '--variants', 'broken', '--seeds', '1', *SLURM, '--wait',
                           '--preset', 'broken', 'attention=sa', 'block_size=5000'))  # longer than the data
    assert rc == 1
    row, = json.loads((out / 'results.json').read_text())
    assert row['n_seeds'] == 0 and 'block_size=5000' in row['failed'][0]['stderr_tail']
    assert 'FAILED (SLURM job' in row['failed'][0]['status']
    info = job_info(job_of(out / 'runs' / 'broken' / 'seed0'))
    assert info['JobState'] == 'FAILED' and info['Restarts'] == '0'
    assert 'FAILED' in capsys.readouterr().out


def test_launcher_slurm_without_sbatch_is_one_line(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))  # no sbatch there
    with pytest.raises(UserError, match="^--launcher=slurm: sbatch is not on PATH; run compare.py on the cluster"):
        grid.parse_args(argv(tiny, tmp_path, '--launcher=slurm'))
    grid.parse_args(argv(tiny, tmp_path, '--launcher=slurm', '--dry_run'))  # a dry run needs no cluster


@pytest.mark.parametrize('bad, says', [(['--wait'], 'need --launcher=slurm'),
                                       (['--slurm_partition=gpu'], 'need --launcher=slurm'),
                                       (['--launcher=slurm', '--dry_run', '--slurm_nodes=0'], '--slurm_nodes'),
                                       (['--launcher=slurm', '--dry_run', '--gpus', '0-3'], 'drop --gpus')])
def test_bad_slurm_options_are_refused(tiny, tmp_path, bad, says):
    with pytest.raises(UserError, match=says):
        grid.parse_args(argv(tiny, tmp_path, *bad))


@pytest.mark.parametrize('text, minutes', [('90', 90), ('1:30:00', 90), ('2-00:00:00', 2880), ('1-12', 2160),
                                           ('00:00:30', 1), ('10:30', 11)])
def test_slurm_time_formats(text, minutes):
    assert slurm.slurm_minutes(text) == minutes


@pytest.mark.parametrize('text', ['', 'soon', '0', '1:2:3:4'])
def test_a_bad_slurm_time_is_refused(text):
    with pytest.raises(UserError, match='--slurm_time'):
        slurm.slurm_minutes(text)


def test_the_cpu_grids_route_their_steps_through_the_launcher(tmp_path):
    """tools/cpu_grids.py --slurm=OPTIONS: each compare.py step submits its runs as CPU jobs and waits."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('cpu_grids', ROOT / 'tools' / 'cpu_grids.py')
    cpu_grids = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu_grids)
    cmd = cpu_grids.command('lr_sweep', 2, slurm='--slurm_partition=cpu --slurm_time=4:00:00')
    args = grid.parse_args(cmd[2:] + ['--dry_run'])  # --dry_run: parsed where sbatch is missing too
    assert (args.launcher, args.wait, args.slurm_partition, args.slurm_time, args.slurm_gpus_per_node) == \
        ('slurm', True, 'cpu', '4:00:00', 0)
    assert slurm.executor_parameters(args)['cpus_per_task'] == 1
    assert '--launcher=slurm' not in cpu_grids.command('lr_sweep', 2)


def test_a_warning_signal_longer_than_the_time_limit_is_refused(tiny, tmp_path):
    args = grid.parse_args(argv(tiny, tmp_path, '--launcher=slurm', '--dry_run', '--slurm_time=2', '--slurm_signal_s=120'))
    with pytest.raises(UserError, match='--slurm_signal_s 120 is not shorter than --slurm_time 2'):
        slurm.executor_parameters(args)
