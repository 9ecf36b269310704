"""
compare.py --launcher=slurm: every run of the grid that is not finished becomes one SLURM job.

    python compare.py --config config/ia_table.py --out out-ia --launcher=slurm \\
        --slurm_partition=gpu --slurm_time=24:00:00 --nproc 8         # submit and return
    python compare.py ... --launcher=slurm --status                  # the grid's runs: pending / running / done / failed
    python compare.py ... --launcher=slurm --wait                    # submit (or not) and watch until the last run ends
    python compare.py ... --collect_only                             # summarise what has finished

The jobs go through submitit (one job array per submission, --slurm_max_running of them at a
time): a submitted job runs TrainJob below, which starts train.py (under torchrun when --nproc > 1)
from scratch or with --init_from=resume, whichever the run folder calls for when the job starts,
its stdout/stderr appended to the run folder's stdout.txt / stderr.txt as a local run's are.

Time limits and preemption. SLURM sends SIGUSR2 --slurm_signal_s seconds before a job's time
limit (sbatch --signal, submitit's own), and to a job about to be preempted; submitit then calls
TrainJob.checkpoint, which passes it on to train.py as the SIGTERM it handles (finish the step,
save ckpt.pt, exit), and requeues the job (scontrol requeue), which resumes the run exactly. A
run is requeued at most --slurm_max_requeue times for its time limit (submitit's count; a
preemption does not count); a job that fails for any other reason is not requeued: it is
reported as failed, with its stderr, and rerunning the command submits it again.

Each run folder records its job id (slurm_job.json); a run whose job SLURM still holds (pending
or running) is never submitted again, so resubmitting the same command submits only what is
neither finished nor queued.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import compare
from errors import UserError
from grid import gpu_time_text, grid_budget, makespan, seed_text, tokens_text

RECORD = 'slurm_job.json'  # in each run folder: the job that runs it
ALIVE = {'PENDING': 'pending', 'REQUEUED': 'pending', 'REQUEUE_HOLD': 'pending', 'REQUEUE_FED': 'pending',
         'CONFIGURING': 'running', 'RUNNING': 'running', 'COMPLETING': 'running', 'RESIZING': 'running',
         'SUSPENDED': 'running', 'STOPPED': 'running', 'SIGNALING': 'running', 'STAGE_OUT': 'running'}


# -----------------------------------------------------------------------------
# the job: one run of the grid

def ignore_usr2():
    """In train.py: SIGUSR2 (SLURM's warning, sent to every process of the job) is for submitit
    alone; train.py hears it as the SIGTERM that TrainJob.checkpoint sends."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainJob:
    """One run (variant, seed) inside its SLURM job. submitit pickles it at submission, calls it in
    the job, and calls checkpoint() on SLURM's warning signal before it requeues the job."""

    def __init__(self, args, variant, seed, run_dir):
        self.args, self.variant, self.seed, self.run_dir = args, variant, seed, Path(run_dir)
        self.proc = self.waiter = None

    def __getstate__(self):  # what is pickled: the run, not the process running it
        return {**self.__dict__, 'proc': None, 'waiter': None}

    def command(self, state, env):
        cmd = compare.train_command(self.args, self.variant, self.seed, self.run_dir, state)
        if env.num_nodes > 1:  # torchrun on every node, one rendezvous on the job's first node
            cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={env.num_nodes}',
                   f'--nproc_per_node={self.args.nproc}', '--rdzv_backend=c10d',
                   f'--rdzv_endpoint={env.hostnames[0]}:29400', f'--rdzv_id={env.job_id}'] + \
                cmd[cmd.index(str(compare.TRAIN)):]
        return cmd

    def __call__(self):
        import submitit
        env = submitit.JobEnvironment()
        max_iters = self.variant['cfg']['max_iters']
        state = compare.run_state(self.run_dir, max_iters)
        if state == 'done':  # finished before this job started
            return 'done'
        cmd, node = self.command(state, env), env.node
        suffix = f'.node{node}' if node else ''  # on a shared filesystem, one file per writer
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / f'stdout{suffix}.txt', 'a') as out, open(self.run_dir / f'stderr{suffix}.txt', 'a') as err:
            header = f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {state} (SLURM job {env.job_id}): {' '.join(cmd)}\n"
            out.write(header), err.write(header)
            out.flush(), err.flush()
            self.proc = subprocess.Popen(cmd, cwd=compare.ROOT, env=compare.run_env(self.args, None), stdout=out,
                                         stderr=err, preexec_fn=ignore_usr2)
            # waited for in a thread: the main thread stays free for submitit's signal handler
            self.waiter = threading.Thread(target=self.proc.wait, daemon=True)
            self.waiter.start()
            while self.waiter.is_alive():
                self.waiter.join(1.0)
        rc = self.proc.returncode
        if node == 0 and (rc != 0 or compare.run_state(self.run_dir, max_iters) != 'done'):
            raise RuntimeError(f"train.py {f'exited with {rc}' if rc else 'stopped before max_iters'}:\n"
                               + compare.stderr_tail(self.run_dir))
        return 'done'

    def checkpoint(self, *args, **kwargs):
        """SLURM's warning before the time limit, or before a preemption: train.py saves and exits
        (the SIGTERM it handles), and the requeued job runs this run again, resumed."""
        import submitit
        if self.waiter is not None and self.waiter.is_alive():
            self.proc.send_signal(signal.SIGTERM)
            self.waiter.join(max(10, self.args.slurm_signal_s - 15))  # saved well before SLURM's kill
        return submitit.helpers.DelayedSubmission(TrainJob(self.args, self.variant, self.seed, self.run_dir))


# -----------------------------------------------------------------------------
# submitting

def check_slurm():
    """One line, before anything is submitted, where this machine cannot reach a SLURM cluster."""
    absent = [b for b in ('sbatch', 'squeue', 'srun', 'scontrol') if shutil.which(b) is None]
    if absent:
        raise UserError(f"--launcher=slurm: {', '.join(absent)} not on PATH; run compare.py on the cluster's "
                        f"login node (or leave out --launcher=slurm to train here)")
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise UserError("--launcher=slurm needs submitit: pip install -r requirements.txt -c constraints.txt")


def slurm_minutes(text):
    """SLURM's time formats (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) -> whole minutes."""
    days, dash, rest = str(text).strip().rpartition('-')
    try:
        parts = [int(p) for p in rest.split(':')]
        if dash:
            h, m, s = (parts + [0, 0])[:3]
            minutes = int(days) * 1440 + h * 60 + m + s / 60
        else:
            h, m, s = ([0, 0] + parts)[-3:] if len(parts) == 3 else (0, parts[0], parts[1] if len(parts) > 1 else 0)
            minutes = h * 60 + m + s / 60
        assert len(parts) <= 3 and minutes > 0
    except (ValueError, AssertionError):
        raise UserError(f"--slurm_time {text!r} is not a SLURM time: give minutes (90), HH:MM:SS or D-HH:MM:SS")
    return max(1, round(minutes + 0.49))


def gpus_of(args):
    """GPUs per node a job asks for: --slurm_gpus_per_node, by default one per process."""
    return args.nproc if args.slurm_gpus_per_node < 0 else args.slurm_gpus_per_node


def executor_parameters(args):
    """submitit's SlurmExecutor parameters (sbatch options) shared by every job of the grid."""
    extra = {}
    for item in args.slurm_sbatch or []:
        key, eq, value = item.partition('=')
        extra[key.strip().lstrip('-').replace('-', '_')] = value if eq else True
    if args.slurm_mem:
        extra['mem'] = args.slurm_mem
    minutes = slurm_minutes(args.slurm_time)
    if args.slurm_signal_s >= minutes * 60:
        raise UserError(f"--slurm_signal_s {args.slurm_signal_s} is not shorter than --slurm_time {args.slurm_time}: "
                        f"the job would be told to stop as it starts; lower it or give a longer time")
    params = dict(job_name=f'compare-{Path(args.out).name}', time=minutes,
                  nodes=args.slurm_nodes, ntasks_per_node=1, signal_delay_s=args.slurm_signal_s,
                  setup=[f'cd {shlex.quote(str(compare.ROOT))}',  # the job imports this module from the checkout
                         f'export PYTHONPATH={shlex.quote(str(compare.ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}'],
                  additional_parameters=extra)
    if gpus_of(args):
        params['gpus_per_node'] = gpus_of(args)
    if args.slurm_cpus_per_task or args.threads:
        params['cpus_per_task'] = args.slurm_cpus_per_task or args.threads * args.nproc
    for key in ('partition', 'account', 'qos'):
        if getattr(args, f'slurm_{key}'):
            params[key] = getattr(args, f'slurm_{key}')
    return params


def executor(args, n_jobs):
    import submitit
    ex = submitit.SlurmExecutor(folder=Path(args.out) / 'slurm' / '%j', max_num_timeout=args.slurm_max_requeue)
    ex.update_parameters(**executor_parameters(args),
                         array_parallelism=args.slurm_max_running or max(1, n_jobs))
    return ex


def job_states():
    """{job id: SLURM state} of every job SLURM still holds for this user (array tasks one by one)."""
    r = subprocess.run(['squeue', '-h', '-r', '--states=all', '-u', str(os.getuid()), '-o', '%i|%T'],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"squeue failed ({r.stderr.strip() or r.returncode}): is the SLURM controller reachable?")
    return dict(line.split('|', 1) for line in r.stdout.split() if '|' in line)


def read_record(run_dir):
    try:
        return json.loads((run_dir / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_statuses(args, variants, seeds):
    """[(variant, seed, run_dir, status, job id, SLURM state)] with status one of done / pending /
    running / failed / not submitted (or 'kept': finished, as the committed results.json records)."""
    states = job_states()
    kept = compare.recorded_runs(args.out, variants)
    rows = []
    for v, s, run_dir, state in compare.grid_runs(args, variants, seeds):
        rec = read_record(run_dir)
        job = rec and rec['job_id']
        slurm_state = states.get(job, 'gone') if job else ''
        if state == 'done':
            status = 'done'
        elif state == 'scratch' and (v['variant'], s) in kept and not (run_dir / 'log.jsonl').exists():
            status = 'kept'
        elif job and slurm_state in ALIVE:
            status = ALIVE[slurm_state]
        else:
            status = 'failed' if job else 'not submitted'
        rows.append((v, s, run_dir, status, job, slurm_state))
    return rows


def launch(args, variants, seeds, argv):
    """Submit every run that is neither finished nor held by SLURM; then return (printing the job
    ids and the command that watches them), or with --wait watch them to the end. Returns the
    outcomes for compare.summarize (with --wait), else None."""
    check_slurm()
    rows = run_statuses(args, variants, seeds)
    todo = [(v, s, run_dir) for v, s, run_dir, status, _, _ in rows if status in ('failed', 'not submitted')]
    queued = [r for r in rows if r[3] in ('pending', 'running')]
    jobs = []
    if todo:
        ex = executor(args, len(todo))
        with ex.batch():
            jobs = [ex.submit(TrainJob(args, v, s, run_dir)) for v, s, run_dir in todo]
        for (v, s, run_dir), job in zip(todo, jobs):
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / RECORD).write_text(json.dumps({'job_id': job.job_id, 'submitted': time.strftime('%Y-%m-%d %H:%M:%S'),
                                                      'log': str(job.paths.stdout), 'errors': str(job.paths.stderr)}))
    print(f"{len(rows)} runs: submitted {len(jobs)} SLURM job{'s' * (len(jobs) != 1)}"
          + (f" (array {jobs[0].job_id.split('_')[0]}: {', '.join(j.job_id for j in jobs)})" if jobs else '')
          + f", {len(queued)} already queued or running, {len(rows) - len(todo) - len(queued)} finished")
    watch = ' '.join(shlex.quote(a) for a in [sys.executable, str(compare.ROOT / 'compare.py'), *argv]
                     if a not in ('--wait',)) + ' --status'
    print(f"watch: {watch}")
    if not args.wait:
        return None
    return wait(args, variants, seeds)


# -----------------------------------------------------------------------------
# watching

def counts(rows):
    out = {}
    for r in rows:
        key = 'done' if r[3] in ('done', 'kept') else r[3]
        out[key] = out.get(key, 0) + 1
    return out


def wait(args, variants, seeds):
    """A progress bar until no run of the grid is pending or running; the outcomes for the summary."""
    from tqdm import tqdm
    rows = run_statuses(args, variants, seeds)
    bar = tqdm(total=len(rows), desc='runs', unit='run')
    while True:
        c = counts(rows)
        bar.n = c.get('done', 0) + c.get('failed', 0)
        bar.set_postfix_str(', '.join(f"{c.get(k, 0)} {k}" for k in ('pending', 'running', 'done', 'failed')))
        if not c.get('pending') and not c.get('running') and not any(r[5] in ALIVE for r in rows):
            break  # every run ended, and every job with it (a finished run's job may still be closing)
        time.sleep(args.slurm_poll_s)
        rows = run_statuses(args, variants, seeds)
    bar.close()
    return outcomes(rows)


def outcomes(rows):
    """compare.summarize's status of each run, with the job that ran it."""
    out = {}
    for v, s, run_dir, status, job, slurm_state in rows:
        if status == 'failed':
            rec = read_record(run_dir) or {}
            out[v['variant'], s] = f"FAILED (SLURM job {job} {slurm_state}; its log: {rec.get('errors')})"
        elif status != 'kept':
            out[v['variant'], s] = f"{status} (SLURM job {job})" if job else status
    return out


def print_status(args, variants, seeds):
    check_slurm()
    rows = run_statuses(args, variants, seeds)
    c = counts(rows)
    print(f"{len(rows)} runs: " + ', '.join(f"{c.get(k, 0)} {k}" for k in ('pending', 'running', 'done', 'failed', 'not submitted')))
    print(f"{'variant':>12} {'seed':>4}  {'status':<13} {'job':<14} {'SLURM':<11} iter")
    for v, s, run_dir, status, job, slurm_state in rows:
        log = compare.read_jsonl(run_dir / 'log.jsonl')
        it = f"{log[-1]['iter']}/{v['cfg']['max_iters']}" if log else f"-/{v['cfg']['max_iters']}"
        print(f"{v['variant']:>12} {s:>4}  {status:<13} {job or '-':<14} {slurm_state or '-':<11} {it}")
    return rows


# -----------------------------------------------------------------------------
# before launch: every job's sbatch settings and command, the grid's GPU-hours and wall time

def dry_run(args, variants, seeds):
    from submitit.slurm.slurm import _make_sbatch_string
    per_variant, total = grid_budget(args, variants, seeds)
    runs = compare.grid_runs(args, variants, seeds)
    params = executor_parameters(args)
    n_run = args.slurm_max_running or len(runs)
    gpus = max(1, gpus_of(args)) * args.slurm_nodes
    script = _make_sbatch_string(command='python -u -m submitit.core._submit ...', folder=Path(args.out) / 'slurm' / '%j',
                                 **params, map_count=len(runs), array_parallelism=n_run)
    print(f"\n{len(runs)} SLURM jobs (one array; {len(variants)} variants x {seed_text(variants, seeds)}), each with these "
          f"sbatch settings:\n" + '\n'.join(l for l in script.splitlines() if l.startswith('#SBATCH')))
    hours = []
    for i, (v, s, run_dir, state) in enumerate(runs):
        b = per_variant[v['variant']]
        hours.append(b['gpu_hours'] / gpus)
        segments = -(-hours[-1] * 60 // params['time']) if hours[-1] else 1
        print(f"\njob {i}: {v['variant']} seed {s} [{state}]: {tokens_text(b['tokens'])} tokens, "
              f"{gpu_time_text(b['gpu_hours'])} on {gpus} GPU{'s' * (gpus > 1)}, about {int(segments)} x --slurm_time "
              f"{args.slurm_time}\n  {' '.join(compare.train_command(args, v, s, run_dir, state))}")
    print(f"\ntotal: {gpu_time_text(total['gpu_hours'])} on {args.est_gpu} at {args.est_mfu:.0%} MFU; "
          f"{gpu_time_text(makespan(hours, n_run), unit='')} of wall time with {n_run} job{'s' * (n_run > 1)} "
          f"at a time (--slurm_max_running), queueing not counted")
