"""A throwaway SLURM cluster on this one machine for the tests: munged, slurmctld and one slurmd per
node started in the foreground (so their pids are ours to stop) with a generated slurm.conf, their
key, state, spool and logs in one temporary folder. Three nodes, each a slurmd of its own on this
machine (`slurmd -N`; Debian's build allows several) declaring CPUS_PER_NODE CPUs (more than the
machine has, config_overrides: tiny test jobs share the cores, and many can run at once):

- partition `debug` (the default): nodes n0 and n1, so a job may span two nodes;
- partition `spare` (node n2) and `urgent` (the same node, a higher priority tier): a job in `urgent`
  preempts what runs in `spare` (PreemptMode=REQUEUE, GraceTime PREEMPT_GRACE_S: SLURM sends
  SIGTERM, then requeues the job when the grace time ends), as on a cluster with preemption.

JobRequeue=0, as on many clusters: a job is requeued only if it asked for it (sbatch --requeue).

    with SlurmCluster() as cluster:   # sets SLURM_CONF for sbatch / squeue / scontrol, restores it after
        subprocess.run(['sbatch', ...])
        cluster.restart_controller(down_s=5)   # slurmctld stopped, and started again from its saved state

Debian/Ubuntu: apt-get install -y slurm-wlm munge. Started as root (slurmd must start job steps as
their user); tests/conftest.py's `slurm_cluster` fixture skips, or fails under CI=true, without them.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ('munged', 'slurmctld', 'slurmd', 'sbatch', 'srun', 'squeue', 'scontrol', 'scancel', 'sinfo')
PACKAGES = 'slurm-wlm munge'
NODES = ('n0', 'n1', 'n2')
CPUS_PER_NODE = 8
MEM_PER_CPU_MB = 512
PREEMPT_GRACE_S = 30


def missing():
    """Why a cluster cannot start here ('' if it can)."""
    absent = [b for b in BINARIES if not shutil.which(b, path=os.environ.get('PATH', '') + ':/usr/sbin:/sbin')]
    if absent:
        return f"SLURM not installed ({', '.join(absent)} missing): apt-get install -y {PACKAGES}"
    if os.geteuid() != 0:
        return "a test SLURM cluster needs root (slurmd starts jobs as their user)"
    usage = subprocess.run([sbin('slurmd'), '-h'], capture_output=True, text=True)
    if ' -N ' not in usage.stdout + usage.stderr:
        return "this slurmd cannot run several nodes on one machine (slurmd -N: built without multiple-slurmd)"
    return ''


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def sbin(binary):
    return shutil.which(binary, path=os.environ.get('PATH', '') + ':/usr/sbin:/sbin')


class SlurmCluster:
    def __init__(self, partition='debug'):
        self.partition = partition
        self.dir = Path(tempfile.mkdtemp(prefix='nanohfa-slurm-'))
        self.procs = []
        self.env_before = os.environ.get('SLURM_CONF')

    def conf(self):
        # cred_expire: how long a requeued job waits before it may start again (120 s by default)
        d, host = self.dir, socket.gethostname().split('.')[0]
        nodes = '\n'.join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={CPUS_PER_NODE} "
                          f"RealMemory={CPUS_PER_NODE * MEM_PER_CPU_MB} State=UNKNOWN" for n in NODES)
        return f"""ClusterName=nanohfa
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=0
KillWait=10
MinJobAge=600
DefMemPerCPU={MEM_PER_CPU_MB}
InactiveLimit=0
{nodes}
PartitionName={self.partition} Nodes=n0,n1 Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=spare Nodes=n2 MaxTime=INFINITE State=UP PriorityTier=1 GraceTime={PREEMPT_GRACE_S}
PartitionName=urgent Nodes=n2 MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""

    def start(self, timeout=60):
        d = self.dir
        for sub in ['state', 'munge'] + [f'spool/{n}' for n in NODES]:
            (d / sub).mkdir(parents=True)
        (d / 'munge.key').write_bytes(os.urandom(1024))
        os.chmod(d / 'munge.key', 0o400)
        (d / 'slurm.conf').write_text(self.conf())
        os.environ['SLURM_CONF'] = str(d / 'slurm.conf')  # every SLURM command below (and in jobs) reads it
        self.log = open(d / 'daemons.out', 'w')
        self.procs.append(subprocess.Popen(
            [sbin('munged'), '-F', '--force', f'--socket={d}/munge.sock', f'--key-file={d}/munge.key',
             f'--pid-file={d}/munge/munged.pid', f'--log-file={d}/munge/munged.log', f'--seed-file={d}/munge/seed'],
            stdout=self.log, stderr=self.log))
        self._wait_for(lambda: (d / 'munge.sock').exists(), timeout, 'munged')
        self.controller = self._controller()
        self.procs.append(self.controller)
        for n in NODES:
            self.procs.append(subprocess.Popen([sbin('slurmd'), '-D', '-N', n, '-f', str(d / 'slurm.conf')],
                                               stdout=self.log, stderr=self.log))
        self._wait_for(self.node_ready, timeout, 'slurmd to register its nodes')
        return self

    def _controller(self):
        return subprocess.Popen([sbin('slurmctld'), '-D', '-i', '-f', str(self.dir / 'slurm.conf')],
                                stdout=self.log, stderr=self.log)

    def restart_controller(self, down_s):
        """slurmctld stopped (SIGTERM: it saves its state), down for down_s seconds, started again
        from its saved state; the jobs run on meanwhile (slurmd and slurmstepd do not need it)."""
        self.controller.send_signal(signal.SIGTERM)
        self.controller.wait(timeout=30)
        time.sleep(down_s)
        new = self._controller()
        self.procs[self.procs.index(self.controller)] = new
        self.controller = new
        self._wait_for(self.node_ready, 60, 'slurmctld to come back')

    def node_ready(self):
        r = subprocess.run(['sinfo', '-h', '-N', '-o', '%N %T'], capture_output=True, text=True)
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return r.returncode == 0 and set(states) == set(NODES) and \
            all(st.rstrip('*') in ('idle', 'mixed', 'allocated') for st in states.values())

    def _wait_for(self, ready, timeout, what):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            if ready():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"test SLURM cluster: waited for {what} in vain; see {self.dir}/daemons.out and *.log")

    def stop(self):
        """Cancel what is left, then stop the daemons (ours, by pid), newest first."""
        if self.procs and self.procs[-1].poll() is None:
            subprocess.run(['scancel', '--full', '--user', str(os.geteuid())], capture_output=True)
            deadline = time.time() + 30  # KillWait (10 s) for what ignores SIGTERM, then SIGKILL
            while time.time() < deadline and subprocess.run(['squeue', '-h', '-t', 'running,completing'],
                                                            capture_output=True, text=True).stdout.strip():
                time.sleep(0.5)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []
        if getattr(self, 'log', None):
            self.log.close()
        if self.env_before is None:
            os.environ.pop('SLURM_CONF', None)
        else:
            os.environ['SLURM_CONF'] = self.env_before

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
