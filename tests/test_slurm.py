"""compare.py --launcher=slurm against a real SLURM (the session's `slurm_cluster`: munged, slurmctld and
three slurmd on this machine, no mock of sbatch, squeue, scontrol or submitit), on tiny CPU models.

Faults are injected from outside our code: wrapper scripts on PATH (a squeue that fails or hangs, an
sbatch whose caller dies), the cluster itself (a controller restart, a real preemption, a real time
limit, a job that asked not to be requeued), and tests/faults/ on PYTHONPATH for train.py (slow steps,
a slow start, a slow save: tests/train_hooks.py) and for a node's view of the run folder.

The time-limit, preemption, slow-save and requeue scenarios take a minute or two of wall time each,
mostly waiting; they are started together first (`background`) and run while the other tests do,
and each test waits for its own and asserts on it. The controller restart comes last, when they
have ended."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

import tiny_grid

import compare
from nanohfa import grid
from nanohfa import grid_runs
from nanohfa import run_folder
from nanohfa import slurm
from nanohfa.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / 'tests' / 'faults'
TINY = """
device = 'cpu'
compile = False
threads = 1
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
SLURM = ['--launcher=slurm', '--slurm_poll_s=0.5']  # a CPU config: its jobs ask for no GPU by themselves
LONG = ['--variants', 'sa', '--seeds', '1', '--max_iters=300', '--lr_decay_iters=300', '--eval_interval=50']
TWO = ['--gradient_accumulation_steps=2']  # two processes (or nodes) share each iteration


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return tiny_grid.write(tmp_path_factory.mktemp('slurm'), TINY)


def argv(tiny, out, *more):
    return ['--config', str(tiny / 'tiny.py'), f'--data_dir={tiny / "data"}', '--threads', '1', '--out', str(out), *more]


def losses(run_dir):
    """Every evaluation of a run: (iteration, train loss, val loss), all digits."""
    return [(r['iter'], r['train_loss'], r['val_loss']) for r in compare.read_jsonl(run_dir / 'log.jsonl')]


def run_of(out, variant='sa', seed=0):
    return Path(out) / 'runs' / variant / f'seed{seed}'


def record(run_dir):
    return slurm.read_record(run_dir) or {}


def job_of(run_dir):
    return record(run_dir)['job_id']


def job_info(job):
    """`scontrol show job` as a dict (JobState, Restarts, ...)."""
    text = subprocess.run(['scontrol', 'show', 'job', '-o', job], capture_output=True, text=True).stdout
    return dict(kv.split('=', 1) for kv in text.split() if '=' in kv)


def wait_for(ready, timeout=180, what=''):
    deadline = time.time() + timeout
    while not ready():
        assert time.time() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.3)


def fault_env(**faults):
    """This environment with tests/faults on PYTHONPATH and NANOHFA_TEST_<KEY>=value for each fault
    (TORCH_* as they are: torchrun's own settings)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(FAULTS), os.environ.get('PYTHONPATH')])))
    env.update({k if k.startswith('TORCH_') else f'NANOHFA_TEST_{k}': str(v) for k, v in faults.items()})
    return env


def compare_cmd(tiny, out, *more, root=ROOT):
    return [sys.executable, str(root / 'compare.py'), *argv(tiny, out, *more)]


def submit(cmd, env, check=True):
    """compare.py in a process of its own, with its own environment (which its jobs inherit)."""
    r = subprocess.run(cmd, cwd=cmd[1].rsplit('/', 1)[0], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 or not check, r.stdout + r.stderr
    return r


def wrapper(folder, name, script):
    """An executable `name` in folder that runs `script` (bash) in front of the real one (REAL)."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/bash\nREAL={shutil.which(name)}\n{script}\n")
    path.chmod(0o755)
    return folder


def segments(run_dir):
    return record(run_dir).get('segments', [])


# -----------------------------------------------------------------------------
# the scenarios that wait on a time limit, a preemption, a slow save or a requeue: started together,
# each in a thread of its own, and each awaited by its test further down

class Scenarios:
    """Each scenario a thread (compare.py in processes of their own, with their own environments;
    timed actions on the cluster); a test awaits its scenario and asserts on what it left."""

    def __init__(self):
        self.threads, self.errors, self.results = {}, {}, {}

    def start(self, name, fn):
        def run():
            try:
                self.results[name] = fn()
            except BaseException:
                self.errors[name] = traceback.format_exc()
        self.threads[name] = threading.Thread(target=run, daemon=True)
        self.threads[name].start()

    def result(self, name, timeout=600):
        self.threads[name].join(timeout)
        assert not self.threads[name].is_alive(), f"scenario {name} still running after {timeout} s"
        assert name not in self.errors, self.errors[name]
        return self.results.get(name)


def copy_checkout(dest):
    """The code train.py runs, and compare.py and slurm.py, in a git repository of their own."""
    for f in ROOT.glob('*.py'):
        shutil.copy(f, dest / f.name)
    shutil.copytree(ROOT / 'attention_kernels', dest / 'attention_kernels', ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copytree(ROOT / 'nanohfa', dest / 'nanohfa', ignore=shutil.ignore_patterns('__pycache__'))
    git = lambda *a: subprocess.run(['git', '-C', str(dest), *a], check=True, capture_output=True)
    git('init', '-q')
    git('add', '-A')
    git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'the code of the run')
    return dest


MID = ['--variants', 'sa', '--seeds', '1', '--max_iters=100', '--lr_decay_iters=100', '--eval_interval=25']
# a 2-minute time limit, warned 30 s (to 60 s) before: the save gets 25 s, which a loaded CI machine needs
LIMITED = ['--slurm_time=2', '--slurm_signal_s=30']


@pytest.fixture(scope='module')
def background(slurm_cluster, tiny, tmp_path_factory):
    env = dict(os.environ)  # as the session left it: no scenario sees a test's wrapper PATH
    scen = Scenarios()
    here = lambda out, *more: submit(compare_cmd(tiny, out, *more), env)
    scen.start('long_local', lambda: here(tiny / 'long_local', *LONG))  # the uninterrupted runs to equal
    scen.start('mid_local', lambda: here(tiny / 'mid_local', *MID))
    scen.start('ddp_mid_local', lambda: here(tiny / 'ddp_mid_local', *MID, '--nproc', '2', *TWO))

    # the time limit itself: the first segment is slow (0.5 s a step), so the 2 minutes run out
    for name, more, faults in [('time_limit', [], dict(SLOW_STEPS=0.5)),
                               ('capped', ['--slurm_max_requeue=0'], dict(SLOW_STEPS=0.5)),
                               ('stuck', [], dict(SLOW_START=400))]:
        scen.start(name, lambda name=name, more=more, faults=faults: submit(
            compare_cmd(tiny, tiny / name, *LONG, *SLURM, *LIMITED, *more, '--wait'), fault_env(**faults), check=False))

    def warned(name, more, faults, then=None):  # SLURM's warning by hand once the run has a checkpoint
        out = tiny / name
        submit(compare_cmd(tiny, out, *MID, *SLURM, *more), fault_env(**faults))
        wait_for(lambda: (run_of(out) / 'ckpt.pt').exists(), what=f'{name}: the first checkpoint')
        subprocess.run(['scancel', '--signal=USR2', job_of(run_of(out))], check=True, env=env)
        if then:
            return then(out)
        return submit(compare_cmd(tiny, out, *MID, *SLURM, *more, '--wait'), env, check=False)
    # the run waits at iteration 30 for the warning (HOLD_AT), which so lands mid-run however loaded the machine
    slow_save = dict(SLOW_STEPS=0.25, SLOW_SAVE=8, TORCH_ELASTIC_SHUTDOWN_TIMEOUT=2, HOLD_AT=30)
    scen.start('ddp_stop', lambda: warned('ddp_stop', ['--nproc', '2', *TWO, '--slurm_signal_s=60'], slow_save))
    scen.start('two_node_stop', lambda: warned('two_node_stop', [*TWO, '--slurm_nodes=2', '--slurm_signal_s=60'],
                                               dict(slow_save, STALE_NODE=1)))

    def not_requeued(out):  # the job ends with its line; the same command then resumes the run
        job = job_of(run_of(out))
        wait_for(lambda: job_info(job).get('JobState') == 'FAILED', what='the job that was not requeued')
        said = submit(compare_cmd(tiny, out, *MID, *SLURM, '--slurm_sbatch', 'no-requeue', '--status'), env)
        return job, record(run_of(out)), said.stdout, \
            submit(compare_cmd(tiny, out, *MID, *SLURM, '--slurm_sbatch', 'no-requeue', '--wait'), env, check=False)
    scen.start('refused', lambda: warned('refused', ['--slurm_sbatch', 'no-requeue'], dict(SLOW_STEPS=0.25, HOLD_AT=30), not_requeued))

    def preempted():  # a job in `spare`, preempted by one in `urgent` once it has a checkpoint
        out = tiny / 'preempted'
        more = ['--slurm_partition=spare', '--slurm_max_requeue=0']
        submit(compare_cmd(tiny, out, *MID, *SLURM, *more), fault_env(SLOW_STEPS=0.25))
        wait_for(lambda: (run_of(out) / 'ckpt.pt').exists(), what='the checkpoint before the preemption')
        r = subprocess.run(['sbatch', '-p', 'urgent', '--exclusive', '-o', '/dev/null', '--wrap', 'sleep 1'],
                           capture_output=True, text=True, env=env, check=True)
        return r.stdout.split()[-1], submit(compare_cmd(tiny, out, *MID, *SLURM, *more, '--wait'), env, check=False)
    scen.start('preempted', preempted)

    code = copy_checkout(tmp_path_factory.mktemp('checkout'))

    def code_changed():  # a run stopped (scancel: it saves), its code changed, the command run again
        out = tiny / 'code'
        submit(compare_cmd(tiny, out, *MID, *SLURM, root=code), fault_env(SLOW_STEPS=0.25))
        wait_for(lambda: (run_of(out) / 'ckpt.pt').exists(), what='the first checkpoint')
        job = job_of(run_of(out))
        subprocess.run(['scancel', job], check=True, env=env)
        wait_for(lambda: job_info(job).get('JobState') == 'CANCELLED', what='the cancelled job')
        trained, ckpt = json.loads((run_of(out) / 'run.json').read_text())['code'], (run_of(out) / 'ckpt.pt').read_bytes()
        with open(code / 'model.py', 'a') as f:
            f.write('\n# a change pulled between two segments\n')
        return trained, ckpt, submit(compare_cmd(tiny, out, *MID, *SLURM, '--wait', root=code), env, check=False)
    scen.start('code', code_changed)

    def crashed():  # compare.py dies as its sbatch returns: before the pickles move, before any job id is recorded
        out = tiny / 'crashed'
        bin_dir = wrapper(tmp_path_factory.mktemp('crash') / 'bin', 'sbatch',
                          '$REAL "$@"; rc=$?\nkill -9 $(awk \'{print $4}\' /proc/$PPID/stat); exit $rc')
        r = submit(compare_cmd(tiny, out, '--variants', 'sa', '--seeds', '1', *SLURM),
                   dict(env, PATH=f"{bin_dir}:{env['PATH']}"), check=False)
        assert r.returncode == -9, r.stdout + r.stderr
        rec = record(run_of(out))
        orphans = subprocess.run(['squeue', '-h', '--states=all', '--name', rec['name'], '-o', '%i'], capture_output=True, text=True,
                                 env=env).stdout.split()
        return rec, orphans, submit(compare_cmd(tiny, out, '--variants', 'sa', '--seeds', '1', *SLURM, '--wait'), env,
                                    check=False)
    scen.start('crashed', crashed)

    scen.start('node1_fails', lambda: submit(compare_cmd(tiny, tiny / 'node1_fails', '--variants', 'sa', '--seeds', '1',
                                                         *TWO, *SLURM, '--slurm_nodes=2', '--wait'),
                                             fault_env(UNREADABLE='1:train.bin'), check=False))
    yield scen
    for t in scen.threads.values():
        t.join(120)


@pytest.mark.slow
def test_the_long_scenarios_start_while_the_other_tests_run(background):
    assert len(background.threads) == 13


# -----------------------------------------------------------------------------
# a grid through SLURM; what a job asks for; sbatch's refusals

@pytest.mark.slow
def test_a_grid_through_slurm_equals_the_grid_run_here(slurm_cluster, tiny, capsys):
    grid_args = ['--variants', 'sa,hfa', '--seeds', '1']
    assert compare.main(argv(tiny, tiny / 'local', *grid_args, '--jobs', '2')) == 0
    assert compare.main(argv(tiny, tiny / 'slurm', *grid_args, *SLURM, '--wait')) == 0
    out = capsys.readouterr().out
    assert 'submitted 2 SLURM jobs' in out and '--status' in out
    for v in ('sa', 'hfa'):
        for s in (0,):
            here, there = (run_of(tiny / g, v, s) for g in ('local', 'slurm'))
            assert losses(there) == losses(here) and losses(here)[-1][0] == 20
            assert f"(SLURM job {job_of(there).split('_')[0]}" in (there / 'stdout.txt').read_text()
            code = json.loads((there / 'run.json').read_text())['code']  # the code it trained with
            assert code == run_folder.code_version() and code['files']
    rows = {g: json.loads((tiny / g / 'results.json').read_text()) for g in ('local', 'slurm')}
    assert [[run['val_loss'] for run in r['runs']] for r in rows['slurm']] == \
        [[run['val_loss'] for run in r['runs']] for r in rows['local']]
    assert all('SLURM job' in run['status'] for r in rows['slurm'] for run in r['runs'])
    info = job_info(job_of(run_of(tiny / 'slurm')))  # a CPU grid, on a cluster without GPUs: none asked for
    assert 'gres' not in info['TRES'] and info['Requeue'] == '1'


def test_a_cpu_grid_asks_for_no_gpu_and_every_job_for_requeue(tiny):
    """device='cpu' in the config: no --gpus-per-node (a cluster without GPUs refuses it); and
    --requeue, which a cluster with JobRequeue=0 needs before it requeues a job at all."""
    args = grid.parse_args(argv(tiny, tiny / 'slurm', '--variants', 'sa', '--launcher=slurm', '--dry_run'))
    params = slurm.executor_parameters(args, grid.plan(args))
    assert 'gpus_per_node' not in params and params['additional_parameters']['requeue'] is True
    args = grid.parse_args(argv(tiny, tiny / 'slurm', '--variants', 'sa', '--launcher=slurm', '--dry_run', '--device=cuda'))
    assert slurm.executor_parameters(args, grid.plan(args))['gpus_per_node'] == 1  # a GPU config: one per process
    args = grid.parse_args(argv(tiny, tiny / 'slurm', '--variants', 'sa', '--launcher=slurm', '--dry_run',
                                '--slurm_sbatch', 'no-requeue'))
    assert 'requeue' not in slurm.executor_parameters(args, grid.plan(args))['additional_parameters']


def test_an_sbatch_refusal_is_one_line_naming_the_flag(slurm_cluster, tiny, capfd):
    out = tiny / 'refused_gpus'
    with pytest.raises(UserError, match=r"^sbatch refused the jobs \(Invalid generic resource \(gres\) specification\); "
                                        r"change --slurm_gpus_per_node"):
        compare.main(argv(tiny, out, '--variants', 'sa', '--seeds', '1', *SLURM, '--slurm_gpus_per_node=1'))
    assert capfd.readouterr().err == ''  # submitit's own copy of sbatch's error is not printed
    assert not (run_of(out) / slurm.RECORD).exists()  # nothing recorded as submitted


# -----------------------------------------------------------------------------
# torchrun in a job; several nodes: a rendezvous of each job's own, one start decision, every node's stderr

@pytest.fixture(scope='module')
def ddp_local(tiny):
    """Two-process runs (torchrun, gloo) trained here, seeds 0 and 1."""
    assert compare.main(argv(tiny, tiny / 'ddp_local', '--variants', 'sa', '--seeds', '2', '--nproc', '2', *TWO,
                             '--jobs', '2')) == 0
    return tiny / 'ddp_local'


@pytest.mark.slow
def test_torchrun_inside_one_job_equals_the_local_two_process_run(slurm_cluster, tiny, ddp_local):
    two = ['--variants', 'sa', '--seeds', '1', '--nproc', '2', *TWO]
    assert compare.main(argv(tiny, tiny / 'ddp_slurm', *two, *SLURM, '--wait')) == 0
    here, there = run_of(ddp_local), run_of(tiny / 'ddp_slurm')
    assert '2 processes' in (there / 'stdout.txt').read_text()
    assert losses(there) == losses(here) and losses(here)[-1][0] == 20
    assert job_info(job_of(there))['NumCPUs'] == '2'  # --threads 1 x --nproc 2


@pytest.mark.slow
def test_two_node_jobs_on_one_node_pair_rendezvous_apart_and_equal_the_local_runs(slurm_cluster, tiny, ddp_local):
    """Two runs of two nodes each, at once on the same two nodes (one array): each job's torchrun
    store is on a port of its own, derived from its job id, not torchrun's 29400."""
    out = tiny / 'two_nodes'
    assert compare.main(argv(tiny, out, '--variants', 'sa', '--seeds', '2', *TWO, *SLURM, '--slurm_nodes=2', '--wait')) == 0
    starts = [record(run_of(out, seed=s))['start'] for s in (0, 1)]
    assert len({st['port'] for st in starts}) == 2 and 29400 not in {st['port'] for st in starts}
    for s, st in zip((0, 1), starts):
        run = run_of(out, seed=s)
        raw = job_info(job_of(run))['JobId']
        assert st['port'] >= slurm.PORT_BASE + int(raw) % slurm.PORT_SPAN  # its own, or the next free one
        assert f"--node_rank=1 --master_addr={st['host']} --master_port={st['port']}" in \
            (run / 'stdout.node1.txt').read_text()
        assert losses(run) == losses(run_of(ddp_local, seed=s)) and losses(run)[-1][0] == 20
    spans = [(job_info(job_of(run_of(out, seed=s)))['StartTime'], job_info(job_of(run_of(out, seed=s)))['EndTime'])
             for s in (0, 1)]
    assert spans[0][0] <= spans[1][1] and spans[1][0] <= spans[0][1]  # they ran at the same time


def test_a_rendezvous_port_another_program_holds_is_passed_over():
    import socket
    first = slurm.PORT_BASE + 4321 % slurm.PORT_SPAN
    if not slurm.port_free(first):
        pytest.skip(f"port {first} is in use on this machine")
    with socket.socket() as held:
        held.bind(('', first))
        held.listen()
        port = slurm.rendezvous_port(4321)
    assert port != first and slurm.PORT_BASE <= port < slurm.PORT_BASE + slurm.PORT_SPAN and slurm.port_free(port)
    assert slurm.rendezvous_port(4322) != slurm.rendezvous_port(4323)


# -----------------------------------------------------------------------------
# submitted once; a grid half done; states the launcher does not know; stale records

@pytest.mark.slow
def test_two_submissions_at_once_submit_each_run_once(slurm_cluster, tiny, tmp_path):
    """Two compare.py on one grid at once, with an sbatch that takes 10 s (a busy controller): the
    second waits for the first's submission, then finds its jobs queued."""
    cmd = compare_cmd(tiny, tiny / 'twice', '--variants', 'sa,hfa', '--seeds', '1', *SLURM)
    slow_sbatch = wrapper(tmp_path / 'bin', 'sbatch', 'sleep 10; exec $REAL "$@"')
    env = dict(os.environ, PATH=f"{slow_sbatch}:{os.environ['PATH']}")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    said = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    first, second = sorted((o for o, _ in said), key=lambda o: 'waiting for another' in o)
    assert 'submitted 2 SLURM jobs' in first
    assert 'waiting for another compare.py submitting this grid' in second
    assert 'submitted 0 SLURM jobs, 2 already queued or running' in second
    jobs = {job_of(run_of(tiny / 'twice', v)) for v in ('sa', 'hfa')}
    named = subprocess.run(['squeue', '-h', '-r', '--states=all', '--name', record(run_of(tiny / 'twice'))['name'],
                            '-o', '%i'], capture_output=True, text=True).stdout.split()  # finished ones too
    assert len(jobs) == 2 and sorted(named) == sorted(jobs)  # two jobs in all, each recorded by its run
    subprocess.run(['scancel', *jobs], check=True)


@pytest.mark.slow
def test_resubmitting_a_running_grid_submits_nothing_and_status_and_collect_read_it(slurm_cluster, tiny, capsys):
    out = tiny / 'half'
    half = ['--variants', 'sa,endless', '--seeds', '1', '--preset', 'endless', 'attention=sa',
            'max_iters=1000000', 'lr_decay_iters=1000000', *SLURM]
    assert compare.main(argv(tiny, out, *half)) == 0
    assert 'submitted 2 SLURM jobs' in capsys.readouterr().out
    endless = run_of(out, 'endless')
    wait_for(lambda: compare.run_state(run_of(out), 20) == 'done' and (endless / 'ckpt.pt').exists(),
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
    assert segments(endless)[-1]['stop'] == 'SIGTERM' and segments(endless)[-1]['save'] == 'finished'


@pytest.mark.slow
def test_a_state_the_launcher_does_not_know_is_shown_and_not_taken_for_an_ended_job(slurm_cluster, tiny, tmp_path,
                                                                                   monkeypatch, capsys):
    """squeue reports a state of a newer SLURM (a wrapper renames RUNNING): --status shows it, and
    the run is neither resubmitted (as dead) nor counted finished."""
    out = tiny / 'unknown'
    grid_args = ['--variants', 'sa', '--seeds', '1', '--max_iters=100000', '--lr_decay_iters=100000', *SLURM]
    assert compare.main(argv(tiny, out, *grid_args)) == 0
    job = job_of(run_of(out))
    wait_for(lambda: job_info(job).get('JobState') == 'RUNNING', what='the job to run')
    wrapper(tmp_path / 'bin', 'squeue', '$REAL "$@" | sed "s/|RUNNING|/|POWERED_DOWN_FUTURE|/"')
    monkeypatch.setenv('PATH', f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    capsys.readouterr()
    assert compare.main(argv(tiny, out, *grid_args, '--status')) == 0
    table = capsys.readouterr().out
    assert any(l.split()[:5] == ['sa', '0', 'unknown', job, 'POWERED_DOWN_FUTURE'] for l in table.splitlines()), table
    assert compare.main(argv(tiny, out, *grid_args)) == 0
    assert 'submitted 0 SLURM jobs, 1 already queued or running' in capsys.readouterr().out
    subprocess.run(['scancel', job], check=True)


@pytest.mark.slow
def test_a_record_whose_job_id_now_names_another_job_is_stale(slurm_cluster, tiny, capsys):
    """A controller that lost its state gives old ids to new jobs: the record's job name tells them apart."""
    other = subprocess.run(['sbatch', '--job-name', 'someone-else', '-o', '/dev/null', '--wrap', 'sleep 120'],
                           capture_output=True, text=True, check=True).stdout.split()[-1]
    out = tiny / 'stale'
    grid_args = ['--variants', 'sa', '--seeds', '1', *SLURM]
    slurm.write_record(run_of(out), {'job_id': other, 'name': 'compare-stale-0123abcd', 'index': 0})
    assert compare.main(argv(tiny, out, *grid_args, '--status')) == 0
    assert any(l.split()[:4] == ['sa', '0', 'failed', other] and 'stale' in l for l in capsys.readouterr().out.splitlines())
    assert compare.main(argv(tiny, out, *grid_args, '--wait')) == 0
    assert job_of(run_of(out)) != other and compare.run_state(run_of(out), 20) == 'done'
    assert job_info(other)['JobState'] == 'RUNNING'  # someone else's job, untouched
    subprocess.run(['scancel', other], check=True)


@pytest.mark.slow
def test_a_job_that_fails_is_reported_not_requeued(slurm_cluster, tiny, capsys):
    out = tiny / 'broken'
    rc = compare.main(argv(tiny, out, '--variants', 'broken', '--seeds', '1', *SLURM, '--wait',
                           '--preset', 'broken', 'attention=sa', 'block_size=5000'))  # longer than the data
    assert rc == 1
    row, = json.loads((out / 'results.json').read_text())
    assert row['n_seeds'] == 0 and 'block_size=5000' in row['failed'][0]['stderr_tail']
    assert 'FAILED (SLURM job' in row['failed'][0]['status']
    info = job_info(job_of(run_of(out, 'broken')))
    assert info['JobState'] == 'FAILED' and info['Restarts'] == '0'
    assert 'FAILED' in capsys.readouterr().out


# -----------------------------------------------------------------------------
# the background scenarios: a warning to torchrun's workers on one and two nodes; a node that fails

def assert_stopped_saved_and_resumed(background, name, reference):
    """A run told to stop by SLURM's warning: its save finished though torchrun's own shutdown timeout
    (2 s) is shorter than it (8 s); the job was requeued and the run ends bit-identical."""
    done = background.result(name)
    assert done.returncode == 0, done.stdout + done.stderr
    run = run_of(done.args[done.args.index('--out') + 1])
    first, = segments(run)
    assert first['stop'] == 'preemption' and first['save'] == 'finished' and first['requeued']
    stdout = (run / 'stdout.txt').read_text()
    assert f"stopped by signal at iteration {first['saved_iter']}" in stdout
    assert f"SLURM's warning (preemption), saved at iteration {first['saved_iter']}; requeueing" in stdout
    assert losses(run) == local_losses(background, reference)
    for err in run.glob('stderr*.txt'):  # every worker got the warning itself, none waited for it in vain
        assert 'HOLD_AT: no stop signal' not in err.read_text(), err
    return run


@pytest.mark.slow
def test_a_two_process_job_gets_the_whole_warning_to_save_and_resumes_exactly(background):
    assert_stopped_saved_and_resumed(background, 'ddp_stop', 'ddp_mid_local')


@pytest.mark.slow
def test_a_two_node_job_stops_on_both_nodes_saves_and_resumes_on_one_decision(background):
    """Both nodes get the warning and stop their own worker; the requeued job resumes on both nodes
    although node 1's view of the run folder shows no checkpoint (NANOHFA_TEST_STALE_NODE): node 0
    decides, node 1 reads the decision."""
    run = assert_stopped_saved_and_resumed(background, 'two_node_stop', 'ddp_mid_local')
    assert record(run)['start']['state'] == 'resume' and record(run)['start']['restart'] == 1
    node1 = (run / 'stdout.node1.txt').read_text()
    assert node1.count('\n=== ') == 2 and 'resume (SLURM job' in node1.rsplit('\n=== ', 1)[1]
    assert 'stopped by signal' not in node1  # rank 1 stopped with rank 0, which saved for both


@pytest.mark.slow
def test_a_failure_on_node_1_ends_the_job_and_reaches_the_summary(background, tiny):
    done = background.result('node1_fails')
    assert done.returncode == 1, done.stdout + done.stderr
    row, = json.loads((tiny / 'node1_fails' / 'results.json').read_text())
    tail = row['failed'][0]['stderr_tail']
    assert '[node 1: stderr.node1.txt]' in tail and 'train.bin' in tail.split('[node 1')[1]
    assert job_info(job_of(run_of(tiny / 'node1_fails')))['JobState'] == 'FAILED'


# -----------------------------------------------------------------------------
# time limits, preemption, requeues refused, code changed, a submitter killed (the background scenarios)

def outcome(background, name):
    done = background.result(name)
    out = Path(done.args[done.args.index('--out') + 1])
    rows = json.loads((out / 'results.json').read_text()) if (out / 'results.json').exists() else []
    return done, run_of(out), rows


@pytest.mark.slow
def test_a_job_that_reaches_its_time_limit_is_requeued_and_ends_bit_identical(background):
    done, run, _ = outcome(background, 'time_limit')
    assert done.returncode == 0, done.stdout + done.stderr
    first, = segments(run)
    assert first['stop'] == 'time limit' and first['save'] == 'finished' and first['requeued']
    assert 0 < first['saved_iter'] < 300
    stdout = (run / 'stdout.txt').read_text()
    assert "SLURM's warning (time limit), saved at iteration" in stdout
    assert "(time limit 1 of --slurm_max_requeue 20)" in stdout
    info = job_info(job_of(run))
    assert info['JobState'] == 'COMPLETED' and info['Restarts'] == '1'
    assert losses(run) == local_losses(background, 'long_local')


@pytest.mark.slow
def test_time_limits_count_toward_max_requeue_and_the_last_is_one_line(background):
    done, run, rows = outcome(background, 'capped')
    assert done.returncode == 1, done.stdout + done.stderr
    status = rows[0]['failed'][0]['status']
    assert 'not requeued: its time limit came 1 times, more than --slurm_max_requeue 0 allows (saved at iteration' in status
    assert '\n' not in status and grid_runs.saved_iteration(run) == segments(run)[0]['saved_iter'] > 0
    assert status in done.stdout  # the summary compare.py printed
    info = job_info(job_of(run))
    assert info['JobState'] == 'FAILED' and info['Restarts'] == '0'


@pytest.mark.slow
def test_a_run_that_makes_no_progress_in_a_time_limit_is_not_requeued(background):
    """train.py takes longer to start than the whole time limit: requeueing it would loop forever."""
    done, run, rows = outcome(background, 'stuck')
    assert done.returncode == 1, done.stdout + done.stderr
    status = rows[0]['failed'][0]['status']
    assert 'not requeued: no progress in a whole --slurm_time 2 (iteration none at its start and at its end' in status
    assert '\n' not in status and job_info(job_of(run))['Restarts'] == '0'


def local_losses(background, name):
    done = background.result(name)
    assert done.returncode == 0, done.stdout + done.stderr
    return losses(run_of(done.args[done.args.index('--out') + 1]))


@pytest.mark.slow
def test_a_real_preemption_saves_and_requeues_without_counting(background):
    """A job in `spare` preempted by one in `urgent` (SIGTERM, then SLURM requeues it after its grace
    time), with --slurm_max_requeue=0: a preemption is not a time limit."""
    urgent, done = background.result('preempted')
    assert done.returncode == 0, done.stdout + done.stderr
    run = run_of(done.args[done.args.index('--out') + 1])
    first, = segments(run)
    assert first['stop'] == 'SIGTERM' and first['save'] == 'finished' and first['saved_iter'] > 0
    assert 'SIGTERM from SLURM' in (run / 'stdout.txt').read_text()
    assert job_info(job_of(run))['Restarts'] == '1' and job_info(urgent)['JobState'] == 'COMPLETED'
    assert losses(run) == local_losses(background, 'mid_local')


@pytest.mark.slow
def test_where_slurm_refuses_the_requeue_the_run_ends_in_one_line_and_resumes_when_rerun(background):
    job, rec, status, rerun = background.result('refused')
    ended = rec['ended']
    assert rec['segments'][-1]['requeued'] is False  # recorded as requeued before the refusal, then corrected
    assert ended.startswith(f'not requeued: SLURM refused to requeue job {job} (Requested operation is presently '
                            f'disabled') and ended.endswith('rerun the command to resume it') and '\n' not in ended
    assert ended in status  # --status shows it
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    run = run_of(rerun.args[rerun.args.index('--out') + 1])
    assert 'resume (SLURM job' in (run / 'stdout.txt').read_text() and losses(run) == local_losses(background, 'mid_local')


@pytest.mark.slow
def test_a_segment_that_would_resume_on_other_code_refuses_in_one_line(background):
    trained, ckpt, rerun = background.result('code')
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    out = Path(rerun.args[rerun.args.index('--out') + 1])
    row, = json.loads((out / 'results.json').read_text())
    status = row['failed'][0]['status']
    assert f"not resumed: the run trained with commit {trained['commit'][:12]}, and the checkout now holds commit " \
           f"{trained['commit'][:12]} + uncommitted changes" in status
    assert f"git checkout {trained['commit'][:12]} and rerun the command" in status and '\n' not in status
    assert (run_of(out) / 'stdout.txt').read_text().count(' (SLURM job ') == 1  # the refused segment started no train.py
    assert (run_of(out) / 'ckpt.pt').read_bytes() == ckpt


@pytest.mark.slow
def test_a_submitter_killed_as_sbatch_returns_is_recovered_by_name_and_the_run_trains_once(background):
    rec, orphans, rerun = background.result('crashed')
    assert rec['name'].startswith('compare-crashed-') and 'job_id' not in rec
    assert len(orphans) == 1  # submitted, though its submitter never learnt the id
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    # its pickle never reached its folder: it could not run (cancelled, or failed looking for it)
    assert job_info(orphans[0])['JobState'] in ('CANCELLED', 'FAILED')
    run = run_of(rerun.args[rerun.args.index('--out') + 1])
    stdout = (run / 'stdout.txt').read_text()
    assert stdout.count(' (SLURM job ') == 1 and f'(SLURM job {orphans[0]})' not in stdout
    assert compare.run_state(run, 20) == 'done'


# -----------------------------------------------------------------------------
# a controller that restarts, a squeue that fails or hangs (last: the scenarios above have ended)

@pytest.mark.slow
def test_wait_survives_a_controller_restart_and_says_when_it_is_gone_long(slurm_cluster, tiny, capsys, monkeypatch):
    monkeypatch.setattr(slurm, 'BACKOFF_S', ())  # each poll tries squeue once (which itself tries for ~9 s)...
    monkeypatch.setattr(slurm, 'UNREACHABLE_NOTE_S', 3)  # ...and the wait says so after 3 s without an answer
    for key, value in fault_env(SLOW_STEPS=0.1).items():  # 20 s of training: the restart comes in the middle
        monkeypatch.setenv(key, value)
    out = tiny / 'restart'
    restarted = []

    def restart_when_running():
        wait_for(lambda: (run_of(out) / 'stdout.txt').exists(), what='the job to start')
        slurm_cluster.restart_controller(down_s=12)
        restarted.append(time.time())
    t = threading.Thread(target=restart_when_running, daemon=True)
    t.start()
    assert compare.main(argv(tiny, out, '--variants', 'sa', '--seeds', '1', '--max_iters=200',
                             '--lr_decay_iters=200', *SLURM, '--wait')) == 0
    t.join(60)
    assert restarted
    said = capsys.readouterr()
    assert "SLURM's controller has not answered for" in said.out + said.err and 'still waiting' in said.out + said.err
    assert compare.run_state(run_of(out), 200) == 'done' and job_info(job_of(run_of(out)))['JobState'] == 'COMPLETED'


@pytest.mark.slow
def test_wait_survives_a_squeue_that_fails_and_one_that_hangs(slurm_cluster, tiny, tmp_path, monkeypatch):
    """squeue's 2nd-4th calls fail as a lost controller does, its 5th hangs: each call is given
    COMMAND_TIMEOUT_S and retried, and the grid ends as if nothing had happened."""
    calls = tmp_path / 'calls'
    wrapper(tmp_path / 'bin', 'squeue', f"""n=$(( $(cat {calls} 2>/dev/null || echo 0) + 1 )); echo $n > {calls}
if [ $n -ge 2 ] && [ $n -le 4 ]; then
  echo "squeue: error: slurm_load_jobs error: Unable to contact slurm controller (connect failure)" >&2; exit 1
fi
if [ $n -eq 5 ]; then exec sleep 600; fi
exec $REAL "$@"
""")
    monkeypatch.setenv('PATH', f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm, 'COMMAND_TIMEOUT_S', 3)
    monkeypatch.setattr(slurm, 'BACKOFF_S', (0.2, 0.2, 0.2, 0.2, 0.2))
    out = tiny / 'flaky'
    t0 = time.time()
    assert compare.main(argv(tiny, out, '--variants', 'sa', '--seeds', '1', *SLURM, '--wait')) == 0
    assert int(calls.read_text()) > 5 and time.time() - t0 < 120
    assert compare.run_state(run_of(out), 20) == 'done'


# -----------------------------------------------------------------------------
# options, without a cluster

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
    assert (args.launcher, args.wait, args.slurm_partition, args.slurm_time) == ('slurm', True, 'cpu', '4:00:00')
    params = slurm.executor_parameters(args, [])
    assert params['cpus_per_task'] == 1 and 'gpus_per_node' not in params
    assert '--launcher=slurm' not in cpu_grids.command('lr_sweep', 2)


def test_a_warning_signal_longer_than_the_time_limit_is_refused(tiny, tmp_path):
    args = grid.parse_args(argv(tiny, tmp_path, '--launcher=slurm', '--dry_run', '--slurm_time=2', '--slurm_signal_s=120'))
    with pytest.raises(UserError, match='--slurm_signal_s 120 is not shorter than --slurm_time 2'):
        slurm.executor_parameters(args, [])
