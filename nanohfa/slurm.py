"""
compare.py --launcher=slurm: every run of the grid that is not finished becomes one SLURM job.

    python compare.py --config config/ia_table.py --out out-ia --launcher=slurm \\
        --slurm_partition=gpu --slurm_time=24:00:00 --nproc 8         # submit and return
    python compare.py ... --launcher=slurm --status                  # the grid's runs: pending / running / done / failed
    python compare.py ... --launcher=slurm --wait                    # submit (or not) and watch until the last run ends
    python compare.py ... --collect_only                             # summarise what has finished

The jobs go through submitit (one job array per submission, --slurm_max_running of them at a
time): a submitted job runs TrainJob below, which starts train.py (under torchrun when --nproc > 1,
one torchrun per node when --slurm_nodes > 1) from scratch or with --init_from=resume, whichever
the run folder calls for when the job starts (node 0 decides, for every node), its stdout/stderr
appended to the run folder's stdout.txt / stderr.txt (node k: stdout.node<k>.txt) as a local run's are.

Time limits and preemption. SLURM sends SIGUSR2 --slurm_signal_s seconds before a job's time limit
(sbatch --signal) to every process of the job. TrainJob handles it on every node (submitit's own
handler acts on node 0 only, and tells a time limit from a preemption by the job's age alone): it
sends SIGTERM to the node's train.py processes themselves (not to torchrun, which would kill them
30 s later), which finish their step, save ckpt.pt and exit, within --slurm_signal_s less
MARGIN_S; node 0 then records the segment and requeues the job (scontrol requeue, retried; the
requeue kills the job step at once, so the record comes first), which resumes the run exactly.
A warning within WARNING_EARLY_S of the time limit is the time limit's; those count toward
--slurm_max_requeue, other warnings (a preemption) do not. A job is not requeued, and
says why in one line (its run folder's slurm_job.json, --status, the summary), when its time
limit has come more than --slurm_max_requeue times, when a whole --slurm_time passed without a
new checkpoint, or when SLURM refuses the requeue. A SIGTERM from SLURM (scancel, a preemption
with a grace time, the time limit itself) reaches train.py directly: it saves, and TrainJob
leaves the job's fate to SLURM. A job that fails otherwise is not requeued: it is reported as
failed, with every node's stderr, and rerunning the command submits it again.

Submitted once. Submitting holds a lock on OUT/slurm; each run folder records its job (slurm_job.json,
written atomically): the submission's unique job name before sbatch, the job id as soon as sbatch
returns, so a crash between the two is recovered from by name. A run whose job SLURM still holds
(pending or running) is never submitted again; a record whose id SLURM now gives to another job
(another name) is recognised as stale. A segment that would resume a run on other code than it
trained with (run.json's code record) refuses with one line: see docs/cluster.md.

Every SLURM command has a timeout (COMMAND_TIMEOUT_S) and is retried with backoff; --wait keeps
watching through a controller that does not answer, and says so when that lasts.
"""

import contextlib
import fcntl
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from nanohfa import grid_runs
from nanohfa.errors import UserError
from nanohfa.grid import gpu_time_text, grid_budget, makespan, seed_text, tokens_text
from nanohfa.data import write_atomic
from nanohfa.run_folder import append_in_place, code_text, code_version, open_in_place

RECORD = 'slurm_job.json'  # in each run folder: the job that runs it, and what its segments did
# SLURM's job states (squeue %T); a state in none of these is shown as it is and waited on
PENDING = {'PENDING', 'REQUEUED', 'REQUEUE_HOLD', 'REQUEUE_FED', 'RESV_DEL_HOLD'}
RUNNING = {'CONFIGURING', 'RUNNING', 'COMPLETING', 'RESIZING', 'SUSPENDED', 'STOPPED', 'SIGNALING', 'STAGE_OUT'}
ENDED = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'OUT_OF_MEMORY', 'NODE_FAIL', 'PREEMPTED', 'BOOT_FAIL',
         'DEADLINE', 'REVOKED'}

COMMAND_TIMEOUT_S = 60  # a SLURM command that has not answered by then is given up and tried again
BACKOFF_S = (1, 2, 4, 8, 16)  # the pauses between tries: 31 s in all before a command is given up
UNREACHABLE_NOTE_S = 300  # --wait says so when squeue has not answered for this long
# sbatch's errors that a later try may not meet (any other is SLURM's answer: a refusal)
TRANSIENT = ('Unable to contact slurm controller', 'Socket timed out', 'Connection refused', 'Zero Bytes were transmitted',
             'Communication connection failure', 'Transport endpoint', 'temporarily unable', 'Temporarily unavailable',
             'Connection timed out', 'timed out', 'Resource temporarily unavailable', 'Slurm backup controller')

# scontrol requeue's answers that another try would only repeat
REQUEUE_REFUSED = ('presently disabled', 'Invalid job id', 'no longer pending', 'permission denied', 'Only batch jobs',
                   'not requeue', 'Requeue of job')

MARGIN_S = 5  # of --slurm_signal_s, kept back for requeueing the job after its save
WARNING_EARLY_S = 90  # SLURM checks time limits every 30 s, so its warning can come that much early, or more
PORT_BASE, PORT_SPAN = 20000, 12000  # rendezvous ports, below Linux's ephemeral range (32768 on)
START_WAIT_S = 300  # how long a node waits for node 0's start record on a shared filesystem


# -----------------------------------------------------------------------------
# SLURM commands: each has a timeout and is retried with backoff

class SlurmUnreachable(Exception):
    """A SLURM command that failed every try (or was refused); its message is the last error."""


def transient(text):
    return any(t.lower() in text.lower() for t in TRANSIENT)


def slurm(cmd, refused=(), deadline=None):
    """A SLURM command's stdout. It is given COMMAND_TIMEOUT_S and tried again after each of
    BACKOFF_S while it fails, but not past `deadline` (time.time()), and not after an error that
    `refused` names: SLURM's answer, raised at once (a controller that is away answers with other
    errors, some of them odd: scontrol's "Unexpected message received")."""
    last = ''
    for pause in BACKOFF_S + (None,):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            if r.returncode == 0:
                return r.stdout
            last = (r.stderr.strip() or f'exit {r.returncode}').splitlines()[-1]
        except subprocess.TimeoutExpired:
            last = f"no answer in {COMMAND_TIMEOUT_S} s"
        except OSError as e:
            last = str(e)
        if any(r.lower() in last.lower() for r in refused):
            raise SlurmUnreachable(last) from None
        if pause is None or (deadline is not None and time.time() + pause > deadline):
            break
        time.sleep(pause)
    raise SlurmUnreachable(last)


def job_states():
    """{job id: (SLURM state, job name)} of every job SLURM still holds for this user (array tasks
    one by one). Raises SlurmUnreachable when squeue fails every try."""
    out = slurm(['squeue', '-h', '-r', '--states=all', '-u', str(os.getuid()), '-o', '%i|%T|%j'])
    return {job: (state, name) for job, state, name in (l.split('|', 2) for l in out.splitlines() if l.count('|') >= 2)}


# -----------------------------------------------------------------------------
# a run folder's record of its job (slurm_job.json), written atomically

def read_record(run_dir):
    try:
        return json.loads((Path(run_dir) / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_record(run_dir, rec):
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / RECORD, json.dumps(rec, indent=1).encode())  # a random temp name, renamed over


def update_record(run_dir, **changes):
    rec = read_record(run_dir) or {}
    rec.update(changes)
    write_record(run_dir, rec)
    return rec


# -----------------------------------------------------------------------------
# the job: one run of the grid, on every node of its job

def ignore_usr2():
    """In train.py: SIGUSR2 (SLURM's warning, sent to every process of the job) is for TrainJob
    alone; train.py hears it as the SIGTERM that TrainJob sends."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(('', port))
            return True
        except OSError:
            return False


def rendezvous_port(job_id):
    """The multi-node rendezvous port of a job: derived from its SLURM id (each array task has its
    own), so that two jobs sharing a first node do not share torchrun's store; the next free one
    if another program holds it."""
    first = int(job_id) % PORT_SPAN
    for i in range(PORT_SPAN):
        port = PORT_BASE + (first + i) % PORT_SPAN
        if port_free(port):
            return port
    raise RuntimeError(f"no free port in {PORT_BASE}-{PORT_BASE + PORT_SPAN - 1} for torchrun's rendezvous")


class TrainJob:
    """One run (variant, seed) inside its SLURM job, on each of its nodes. submitit pickles it at
    submission and calls it in the job; SLURM's warning (SIGUSR2) and SIGTERM are handled here."""

    def __init__(self, args, variant, seed, run_dir):
        self.args, self.variant, self.seed, self.run_dir = args, variant, seed, Path(run_dir)
        self.proc = self.cmd = None

    def __getstate__(self):  # what is pickled: the run, not the process running it
        return {k: v for k, v in self.__dict__.items() if k in ('args', 'variant', 'seed', 'run_dir')}

    def __setstate__(self, state):
        self.__dict__.update(state, proc=None, cmd=None)

    # the signals: every node stops its own train.py processes

    def on_warning(self, signum, frame):
        if self.warned is None:
            self.warned = time.time()
            self.stop()

    def on_term(self, signum, frame):
        if self.terminated is None:
            self.terminated = time.time()
            self.stop()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            grid_runs.stop_workers(self.proc, self.cmd)

    def budget_s(self):
        return max(1, self.args.slurm_signal_s - MARGIN_S)

    # one segment of the run: how it starts, decided once for every node

    def segment_start(self, env):
        """Node 0: whether this segment starts from scratch or resumes (or refuses to resume on
        other code), and where a multi-node rendezvous is, written to the record; the other nodes
        read it there (on a shared filesystem each node's own look at the run folder may differ)."""
        key = {'job': env.job_id, 'restart': int(os.environ.get('SLURM_RESTART_COUNT') or 0)}
        if env.node != 0:
            deadline = time.time() + START_WAIT_S
            while True:
                start = (read_record(self.run_dir) or {}).get('start') or {}
                if all(start.get(k) == v for k, v in key.items()):
                    return start
                if time.time() > deadline:
                    raise RuntimeError(f"node {env.node} of job {env.job_id}: node 0 wrote no start record in "
                                       f"{START_WAIT_S} s ({self.run_dir / RECORD}); is the run folder on a filesystem "
                                       f"every node shares?")
                time.sleep(1)
        state = grid_runs.run_state(self.run_dir, self.variant['cfg']['max_iters'])
        start = {**key, 'state': state, 'iter': grid_runs.saved_iteration(self.run_dir) if state == 'resume' else None}
        if state == 'resume':
            start['refused'] = self.code_changed()
        if env.num_nodes > 1:
            start.update(host=socket.gethostname(), port=rendezvous_port(env.raw_job_id))
        update_record(self.run_dir, start=start, **({'ended': start['refused']} if start.get('refused') else {}))
        return start

    def code_changed(self):
        """One line where this checkout's code is not the code the run trained with ('' if it is)."""
        try:
            had = json.loads((self.run_dir / 'run.json').read_text()).get('code')
        except (OSError, json.JSONDecodeError):
            return ''
        now = code_version()
        if not had or had['files'] == now['files']:
            return ''
        back = f"git checkout {had['commit'][:12]}" if had.get('commit') else 'restore its code'
        return (f"not resumed: the run trained with {code_text(had)}, and the checkout now holds {code_text(now)}; "
                f"resuming would change its code mid-run. {back}{' (and its uncommitted changes)' * bool(had.get('changes'))} "
                f"and rerun the command, or train the run again into another --out")

    def command(self, start, env):
        cmd = grid_runs.train_command(self.args, self.variant, self.seed, self.run_dir, start['state'])
        if env.num_nodes > 1:  # one torchrun per node, ranks by node: node 0 holds the job's own rendezvous
            cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={env.num_nodes}',
                   f'--nproc_per_node={self.args.nproc}', f'--node_rank={env.node}', f"--master_addr={start['host']}",
                   f"--master_port={start['port']}", f'--shutdown_timeout={self.args.slurm_signal_s}'] + \
                cmd[cmd.index(str(grid_runs.TRAIN)):]
        return cmd

    def __call__(self):
        import submitit
        env = submitit.JobEnvironment()
        self.t0, self.warned, self.terminated = time.time(), None, None
        signal.signal(env._usr_sig(), self.on_warning)  # SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise
        signal.signal(signal.SIGTERM, self.on_term)
        start = self.segment_start(env)
        if start['state'] == 'done':  # finished before this job started
            return 'done'
        if start.get('refused'):
            raise RuntimeError(start['refused'])
        self.cmd, node = self.command(start, env), env.node
        suffix = f'.node{node}' if node else ''  # on a shared filesystem, one file per writer
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with append_in_place(self.run_dir / f'stdout{suffix}.txt') as out, \
                append_in_place(self.run_dir / f'stderr{suffix}.txt') as err:
            header = f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {start['state']} (SLURM job {env.job_id}): {' '.join(self.cmd)}\n"
            out.write(header), err.write(header)
            out.flush(), err.flush()
            if self.warned is None and self.terminated is None:  # not told to stop while it started
                self.proc = subprocess.Popen(self.cmd, cwd=grid_runs.ROOT, env=grid_runs.run_env(self.args, None),
                                             stdout=out, stderr=err, preexec_fn=ignore_usr2)
                if self.warned is not None or self.terminated is not None:  # told while it was starting
                    self.stop()
            # the main thread stays free for the signal handlers: it only sleeps between looks
            while self.proc is not None and self.proc.poll() is None:
                if self.warned is not None and time.time() > self.warned + self.budget_s():
                    break  # the save did not finish in time: the last good checkpoint stays
                time.sleep(0.2)
        rc = None if self.proc is None else self.proc.poll()
        if node != 0:  # node 0 reports for the job, and decides what comes next
            if rc and not (self.warned or self.terminated):  # the job ends (srun --kill-on-bad-exit)
                raise RuntimeError(f"node {node}: train.py exited with {rc}: see {self.run_dir}/stderr.node{node}.txt")
            return 'stopped' if self.warned or self.terminated else 'done'
        if grid_runs.run_state(self.run_dir, self.variant['cfg']['max_iters']) == 'done':
            return 'done'
        if self.warned is not None:
            return self.after_warning(start, env, rc)
        if self.terminated is not None:
            return self.after_sigterm(start, env, rc)
        raise RuntimeError(f"train.py {f'exited with {rc}' if rc else 'stopped before max_iters'}:\n"
                           + grid_runs.stderr_tail(self.run_dir))

    # what node 0 does once the run has stopped

    def saved_text(self, rc, saved, what):
        if rc == 0:
            return f"saved at iteration {saved}" if saved is not None else 'nothing to save yet'
        why = f"its save did not finish within {self.budget_s()} s of {what}" if rc is None else \
            f"train.py exited with {rc} while stopping" if self.proc is not None else 'train.py had not started'
        return f"{why}; ckpt.pt holds iteration {saved}" if saved is not None else f"{why}; no checkpoint yet"

    def note(self, text):
        """A line in the run's stdout.txt and stderr.txt, after the segment's own output."""
        for name in ('stdout.txt', 'stderr.txt'):
            with append_in_place(self.run_dir / name) as f:
                f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def segment(self, start, env, stop, rc, saved, **more):
        seg = {'job': env.job_id, 'restart': start['restart'], 'stop': stop, 'start_iter': start['iter'],
               'saved_iter': saved, 'save': 'finished' if rc == 0 else 'unfinished' if rc is None else f'exit {rc}',
               'started': time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.t0)), **more}
        rec = read_record(self.run_dir) or {}
        return update_record(self.run_dir, segments=rec.get('segments', []) + [seg])

    def after_warning(self, start, env, rc):
        """SLURM's warning: requeue the job, unless the time limit has come too often, the segment
        made no progress, or SLURM refuses; then one line says so, and the job fails."""
        saved = grid_runs.saved_iteration(self.run_dir)
        left = slurm_minutes(self.args.slurm_time) * 60 - (self.warned - self.t0)
        kind = 'time limit' if left <= self.args.slurm_signal_s + WARNING_EARLY_S else 'preemption'
        what = f"SLURM's warning ({kind})"
        saved_text = self.saved_text(rc, saved, what)
        rec = read_record(self.run_dir) or {}
        limits = 1 + sum(s.get('stop') == 'time limit' for s in rec.get('segments', []) if s.get('job') == env.job_id)
        ended = ''
        if kind == 'time limit' and (saved is None or saved == start['iter']):
            ended = (f"not requeued: no progress in a whole --slurm_time {self.args.slurm_time} (iteration "
                     f"{start['iter'] if start['iter'] is not None else 'none'} at its start and at its end; {saved_text}); "
                     f"raise --slurm_time{' or --slurm_signal_s' * (rc != 0)} and rerun the command")
        elif kind == 'time limit' and limits > self.args.slurm_max_requeue:
            ended = (f"not requeued: its time limit came {limits} times, more than --slurm_max_requeue "
                     f"{self.args.slurm_max_requeue} allows ({saved_text}); rerun the command to continue it")
        if not ended:  # recorded first: the requeue kills this job step at once
            self.segment(start, env, kind, rc, saved, requeued=True)
            self.note(f"{what}, {saved_text}; requeueing" + (f" (time limit {limits} of --slurm_max_requeue "
                                                           f"{self.args.slurm_max_requeue})" if kind == 'time limit' else ''))
            try:
                slurm(['scontrol', 'requeue', env.job_id], REQUEUE_REFUSED, deadline=self.warned + self.args.slurm_signal_s)
                return 'requeued'
            except SlurmUnreachable as e:
                ended = (f"not requeued: SLURM refused to requeue job {env.job_id} ({e}); {saved_text}; "
                         f"rerun the command to resume it")
            segs = (read_record(self.run_dir) or {}).get('segments', [])
            update_record(self.run_dir, segments=segs[:-1] + [{**segs[-1], 'requeued': False}])
        else:
            self.segment(start, env, kind, rc, saved, requeued=False)
        update_record(self.run_dir, ended=ended)
        self.note(ended)
        raise RuntimeError(ended)

    def after_sigterm(self, start, env, rc):
        """A SIGTERM from SLURM (scancel, a preemption's grace time, the time limit): train.py saved
        (or not: the record says). SLURM decides what becomes of the job (cancelled, or requeued
        when its grace time ends), so the job waits for SLURM to end it."""
        saved = grid_runs.saved_iteration(self.run_dir)
        text = self.saved_text(rc, saved, 'SIGTERM')
        self.segment(start, env, 'SIGTERM', rc, saved)
        self.note(f"SIGTERM from SLURM (a cancel, a preemption, the time limit or a failure on another node), {text}")
        while True:  # a job that ended now would end COMPLETED, and a preemption's requeue with it
            time.sleep(60)


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


def trains_on_cpu(variants):
    return bool(variants) and all(str(v['cfg'].get('device', '')).startswith(('cpu', 'mps')) for v in variants)


def gpus_of(args, variants):
    """GPUs per node a job asks for: --slurm_gpus_per_node; by default one per process, and none
    where every run of the grid trains on the CPU (device='cpu')."""
    if args.slurm_gpus_per_node >= 0:
        return args.slurm_gpus_per_node
    return 0 if trains_on_cpu(variants) else args.nproc


def sbatch_options(args):
    extra = {}
    for item in args.slurm_sbatch or []:
        key, eq, value = item.partition('=')
        extra[key.strip().lstrip('-').replace('-', '_')] = value if eq else True
    return extra


def executor_parameters(args, variants, name=None):
    """submitit's SlurmExecutor parameters (sbatch options) shared by every job of the grid."""
    extra = sbatch_options(args)
    if 'no_requeue' not in extra:  # clusters with JobRequeue=0 refuse to requeue a job that did not ask
        extra['requeue'] = True
    if args.slurm_mem:
        extra['mem'] = args.slurm_mem
    minutes = slurm_minutes(args.slurm_time)
    if args.slurm_signal_s >= minutes * 60:
        raise UserError(f"--slurm_signal_s {args.slurm_signal_s} is not shorter than --slurm_time {args.slurm_time}: "
                        f"the job would be told to stop as it starts; lower it or give a longer time")
    params = dict(job_name=name or f'compare-{Path(args.out).name}', time=minutes,
                  nodes=args.slurm_nodes, ntasks_per_node=1, signal_delay_s=args.slurm_signal_s,
                  srun_args=['--kill-on-bad-exit=1'],  # a node whose train.py failed ends the job, not a hang
                  setup=[f'cd {shlex.quote(str(grid_runs.ROOT))}',  # the job imports this module from the checkout
                         f'export PYTHONPATH={shlex.quote(str(grid_runs.ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}'],
                  additional_parameters=extra)
    if gpus_of(args, variants):
        params['gpus_per_node'] = gpus_of(args, variants)
    if args.slurm_cpus_per_task or args.threads:
        params['cpus_per_task'] = args.slurm_cpus_per_task or args.threads * args.nproc
    for key in ('partition', 'account', 'qos'):
        if getattr(args, f'slurm_{key}'):
            params[key] = getattr(args, f'slurm_{key}')
    return params


# what sbatch's refusal names -> the option to change
REFUSALS = [('generic resource', '--slurm_gpus_per_node (0 for a grid that trains on the CPU)'),
            ('gres', '--slurm_gpus_per_node (0 for a grid that trains on the CPU)'),
            ('partition', '--slurm_partition'), ('account', '--slurm_account'), ('qos', '--slurm_qos'),
            ('time limit', '--slurm_time'), ('memory', '--slurm_mem'), ('node count', '--slurm_nodes'),
            ('processors', '--slurm_cpus_per_task'), ('cpu count', '--slurm_cpus_per_task'),
            ('node configuration', '--slurm_nodes, --slurm_cpus_per_task, --slurm_mem or --slurm_gpus_per_node'),
            ('unrecognized option', '--slurm_sbatch'), ('invalid option', '--slurm_sbatch')]


def refusal(text):
    """sbatch's refusal as one line naming the option to change."""
    reason = text.replace('sbatch: error:', '').replace('Batch job submission failed:', '').strip()
    flag = next((f for key, f in REFUSALS if key in reason.lower()), None)
    return UserError(f"sbatch refused the jobs ({reason})" + (f"; change {flag}" if flag else
                     "; check the --slurm_* options (--dry_run prints the sbatch settings)"))


@contextlib.contextmanager
def sbatch_timeout():
    """submitit runs sbatch without a timeout: while it submits, sbatch runs under coreutils'
    timeout (submitit's array path builds a plain SlurmExecutor, so the class is changed, and put back)."""
    from submitit.slurm.slurm import SlurmExecutor
    plain = SlurmExecutor._make_submission_command
    SlurmExecutor._make_submission_command = \
        lambda self, path: ['timeout', '--kill-after=5', str(COMMAND_TIMEOUT_S), 'sbatch', str(path)]
    try:
        yield
    finally:
        SlurmExecutor._make_submission_command = plain


def submit(args, variants, todo, name):
    """One job array for the runs `todo`, named `name`: sbatch is retried with backoff while it fails
    as a lost controller does, after cancelling whatever of the submission reached SLURM; a refusal
    is one line."""
    import submitit
    from submitit.core.utils import FailedJobError, FailedSubmissionError
    ex = submitit.SlurmExecutor(folder=Path(args.out) / 'slurm' / '%j')
    ex.update_parameters(**executor_parameters(args, variants, name),
                         array_parallelism=args.slurm_max_running or max(1, len(todo)))
    for pause in BACKOFF_S + (None,):
        said = io.StringIO()
        try:
            with sbatch_timeout(), contextlib.redirect_stderr(said):  # submitit prints sbatch's error itself
                with ex.batch():
                    return [ex.submit(TrainJob(args, v, s, run_dir)) for v, s, run_dir in todo]
        except (FailedJobError, FailedSubmissionError) as e:  # coreutils' timeout: no message
            text = (str(e).strip() or said.getvalue().strip() or f'no answer in {COMMAND_TIMEOUT_S} s').splitlines()[-1]
        if not (transient(text) or text.startswith('no answer')):
            raise refusal(text)
        try:  # a submission that reached SLURM before the error is cancelled, not run twice
            slurm(['scancel', '--name', name, '-u', str(os.getuid())])
        except SlurmUnreachable:
            pass
        if pause is None:
            raise UserError(f"sbatch failed {len(BACKOFF_S) + 1} times over {sum(BACKOFF_S)} s ({text}): SLURM's "
                            f"controller is not answering; rerun the same command later")
        time.sleep(pause)


@contextlib.contextmanager
def submitting(out):
    """The grid's submission lock (OUT/slurm/submit.lock): two compare.py submitting the same grid
    take turns, so the second finds the first's jobs queued."""
    path = Path(out) / 'slurm' / 'submit.lock'
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(open_in_place(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), 'a+') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            print(f"waiting for another compare.py submitting this grid ({f.read().strip() or 'starting'})", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0), f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        yield


def recover(args, runs):
    """Runs whose record names a submission but no job id (compare.py ended between sbatch and the
    record): the job is found by the submission's name. One whose submitit pickle never reached its
    folder cannot run (it fails after a minute of looking for it): it is cancelled, if still
    queued, and the run is submitted again."""
    pending = [(run_dir, rec) for run_dir in runs if (rec := read_record(run_dir)) and rec.get('name')
               and not rec.get('job_id')]
    found = {}
    for name in {rec['name'] for _, rec in pending}:
        out = slurm(['squeue', '-h', '-r', '--states=all', '--name', name, '-u', str(os.getuid()), '-o', '%i|%T'])
        found[name] = {int(j.split('_')[1]) if '_' in j else 0: (j, st) for j, st in (l.split('|') for l in out.split())}
    for run_dir, rec in pending:
        job, state = found[rec['name']].get(rec['index'], (None, None))
        if job and (Path(args.out) / 'slurm' / job / f'{job}_submitted.pkl').exists():
            write_record(run_dir, {**rec, 'job_id': job, 'recovered': True})
            continue
        if job and state in PENDING | RUNNING:
            try:
                slurm(['scancel', job], refused=('already completing', 'Invalid job id'))
            except SlurmUnreachable:
                pass  # it ends by itself, without its pickle
        (run_dir / RECORD).unlink(missing_ok=True)


def run_statuses(args, variants, seeds, states):
    """[(variant, seed, run_dir, status, job id, SLURM state)] with status one of done / pending /
    running / failed / not submitted / unknown (a SLURM state this module does not know), or
    'kept' (finished, as the committed results.json records)."""
    kept = grid_runs.recorded_runs(args.out, variants)
    rows = []
    for v, s, run_dir, state in grid_runs.grid_runs(args, variants, seeds):
        rec = read_record(run_dir) or {}
        job = rec.get('job_id')
        held = states.get(job) if job else None
        if held and rec.get('name') and held[1] != rec['name']:  # the id now names another job: not this run's
            slurm_state, held = f'stale ({held[1]})', None
        else:
            slurm_state = held[0] if held else 'gone' if job else ''
        if state == 'done':
            status = 'done'
        elif state == 'scratch' and (v['variant'], s) in kept and not (run_dir / 'log.jsonl').exists():
            status = 'kept'
        elif held and held[0] in PENDING:
            status = 'pending'
        elif held and held[0] in RUNNING:
            status = 'running'
        elif held and held[0] not in ENDED:
            status = 'unknown'
        else:
            status = 'failed' if job else 'not submitted'
        rows.append((v, s, run_dir, status, job, slurm_state))
    return rows


def states_or_refuse():
    try:
        return job_states()
    except SlurmUnreachable as e:
        raise UserError(f"squeue failed {len(BACKOFF_S) + 1} times over {sum(BACKOFF_S)} s ({e}): SLURM's controller "
                        f"is not answering; try again later")


def launch(args, variants, seeds, argv):
    """Submit every run that is neither finished nor held by SLURM; then return (printing the job
    ids and the command that watches them), or with --wait watch them to the end. Returns the
    outcomes for compare.summarize (with --wait), else None."""
    check_slurm()
    jobs = []
    with submitting(args.out):
        recover(args, [run_dir for _, _, run_dir, _ in grid_runs.grid_runs(args, variants, seeds)])
        rows = run_statuses(args, variants, seeds, states_or_refuse())
        todo = [(v, s, run_dir) for v, s, run_dir, status, _, _ in rows if status in ('failed', 'not submitted')]
        queued = [r for r in rows if r[3] in ('pending', 'running', 'unknown')]
        if todo:
            name = f'compare-{Path(args.out).name}-{uuid.uuid4().hex[:8]}'  # found by it after a crash
            before = [read_record(run_dir) for _, _, run_dir in todo]
            for i, (_, _, run_dir) in enumerate(todo):
                write_record(run_dir, {'name': name, 'index': i, 'submitting': time.strftime('%Y-%m-%d %H:%M:%S')})
            try:
                jobs = submit(args, variants, todo, name)
            except UserError:
                for (_, _, run_dir), rec in zip(todo, before):  # nothing was submitted
                    write_record(run_dir, rec) if rec else (run_dir / RECORD).unlink(missing_ok=True)
                raise
            for i, ((_, _, run_dir), job) in enumerate(zip(todo, jobs)):
                write_record(run_dir, {'job_id': job.job_id, 'name': name, 'index': i,
                                       'submitted': time.strftime('%Y-%m-%d %H:%M:%S'),
                                       'log': str(job.paths.stdout), 'errors': str(job.paths.stderr)})
    print(f"{len(rows)} runs: submitted {len(jobs)} SLURM job{'s' * (len(jobs) != 1)}"
          + (f" (array {jobs[0].job_id.split('_')[0]}: {', '.join(j.job_id for j in jobs)})" if jobs else '')
          + f", {len(queued)} already queued or running, {len(rows) - len(todo) - len(queued)} finished")
    watch = ' '.join(shlex.quote(a) for a in [sys.executable, str(grid_runs.ROOT / 'compare.py'), *argv]
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
    """A progress bar until no run of the grid is pending, running or in a state SLURM's launcher
    does not know, and no job of it is alive; the outcomes for the summary. A squeue that fails
    (a controller restarting or gone) is waited through, on the last states it gave."""
    from tqdm import tqdm
    states, lost_since, said = {}, None, False
    bar = tqdm(total=None, desc='runs', unit='run')
    while True:
        asked = time.time()
        try:
            states, lost_since = job_states(), None
        except SlurmUnreachable as e:
            lost_since = lost_since or asked
            if time.time() - lost_since >= UNREACHABLE_NOTE_S and not said:
                tqdm.write(f"SLURM's controller has not answered for {(time.time() - lost_since) / 60:.0f} min "
                           f"(squeue: {e}); still waiting: the jobs run on without it")
                said = True
        rows = run_statuses(args, variants, seeds, states)
        c = counts(rows)
        bar.total, bar.n = len(rows), c.get('done', 0) + c.get('failed', 0)
        unknown = sorted({r[5] for r in rows if r[3] == 'unknown'})
        bar.set_postfix_str(', '.join(f"{c.get(k, 0)} {k}" for k in ('pending', 'running', 'done', 'failed'))
                            + (f", {c['unknown']} in SLURM state {'/'.join(unknown)}" if unknown else '')
                            + (' (controller not answering)' if lost_since else ''))
        alive = any(st in PENDING | RUNNING for st, _ in (states.get(r[4], ('', '')) for r in rows if r[4]))
        if lost_since is None and not any(c.get(k) for k in ('pending', 'running', 'unknown')) and not alive:
            break  # every run ended, and every job with it (a finished run's job may still be closing)
        time.sleep(args.slurm_poll_s)
    bar.close()
    return outcomes(rows)


def outcomes(rows):
    """compare.summarize's status of each run, with the job that ran it and, for a job that ended
    itself, its one line."""
    out = {}
    for v, s, run_dir, status, job, slurm_state in rows:
        rec = read_record(run_dir) or {}
        if status == 'failed':
            why = rec.get('ended') or f"its log: {rec.get('errors')}"
            out[v['variant'], s] = f"FAILED (SLURM job {job} {slurm_state}; {why})"
        elif status != 'kept':
            out[v['variant'], s] = f"{status} (SLURM job {job}{f' {slurm_state}' * (status == 'unknown')})" if job else status
    return out


def print_status(args, variants, seeds):
    check_slurm()
    rows = run_statuses(args, variants, seeds, states_or_refuse())
    c = counts(rows)
    print(f"{len(rows)} runs: " + ', '.join(f"{c.get(k, 0)} {k}" for k in ('pending', 'running', 'done', 'failed',
                                                                            'not submitted', 'unknown')))
    print(f"{'variant':>12} {'seed':>4}  {'status':<13} {'job':<14} {'SLURM':<11} iter")
    for v, s, run_dir, status, job, slurm_state in rows:
        log = grid_runs.read_jsonl(run_dir / 'log.jsonl')
        it = f"{log[-1]['iter']}/{v['cfg']['max_iters']}" if log else f"-/{v['cfg']['max_iters']}"
        ended = (read_record(run_dir) or {}).get('ended') if status == 'failed' else None
        print(f"{v['variant']:>12} {s:>4}  {status:<13} {job or '-':<14} {slurm_state or '-':<11} {it}"
              + (f"  {ended}" if ended else ''))
    return rows


# -----------------------------------------------------------------------------
# before launch: every job's sbatch settings and command, the grid's GPU-hours and wall time

def dry_run(args, variants, seeds):
    from submitit.slurm.slurm import _make_sbatch_string
    per_variant, total = grid_budget(args, variants, seeds)
    runs = grid_runs.grid_runs(args, variants, seeds)
    params = executor_parameters(args, variants)
    n_run = args.slurm_max_running or len(runs)
    gpus = max(1, gpus_of(args, variants)) * args.slurm_nodes
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
              f"{args.slurm_time}\n  {' '.join(grid_runs.train_command(args, v, s, run_dir, state))}")
    print(f"\ntotal: {gpu_time_text(total['gpu_hours'])} on {args.est_gpu} at {args.est_mfu:.0%} MFU; "
          f"{gpu_time_text(makespan(hours, n_run), unit='')} of wall time with {n_run} job{'s' * (n_run > 1)} "
          f"at a time (--slurm_max_running), queueing not counted")
