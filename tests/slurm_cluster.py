"""A throwaway single-node SLURM cluster for the tests: munged, slurmctld and slurmd started in the
foreground (so their pids are ours to stop) with a generated slurm.conf, their key, state, spool and
logs in one temporary folder; one node with this machine's CPUs and memory, one partition.

    with SlurmCluster() as cluster:   # sets SLURM_CONF for sbatch / squeue / scontrol, restores it after
        subprocess.run(['sbatch', ...])

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


def missing():
    """Why a cluster cannot start here ('' if it can)."""
    absent = [b for b in BINARIES if not shutil.which(b, path=os.environ.get('PATH', '') + ':/usr/sbin:/sbin')]
    if absent:
        return f"SLURM not installed ({', '.join(absent)} missing): apt-get install -y {PACKAGES}"
    if os.geteuid() != 0:
        return "a test SLURM cluster needs root (slurmd starts jobs as their user)"
    return ''


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def memory_mb():
    for line in Path('/proc/meminfo').read_text().splitlines():
        if line.startswith('MemTotal:'):
            return int(line.split()[1]) // 1024 * 9 // 10  # slurmd refuses a node larger than it measures
    return 1024


class SlurmCluster:
    def __init__(self, partition='debug'):
        self.partition = partition
        self.dir = Path(tempfile.mkdtemp(prefix='nanohfa-slurm-'))
        self.procs = []
        self.env_before = os.environ.get('SLURM_CONF')

    def conf(self):
        # cred_expire: how long a requeued job waits before it may start again (120 s by default)
        d, host = self.dir, socket.gethostname().split('.')[0]
        return f"""ClusterName=nanohfa
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
DefMemPerCPU=2048
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory_mb()} State=UNKNOWN
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def start(self, timeout=60):
        d = self.dir
        for sub in ('state', 'spool', 'munge'):
            (d / sub).mkdir()
        (d / 'munge.key').write_bytes(os.urandom(1024))
        os.chmod(d / 'munge.key', 0o400)
        (d / 'slurm.conf').write_text(self.conf())
        os.environ['SLURM_CONF'] = str(d / 'slurm.conf')  # every SLURM command below (and in jobs) reads it
        log = open(d / 'daemons.out', 'w')
        sbin = lambda b: shutil.which(b, path=os.environ.get('PATH', '') + ':/usr/sbin:/sbin')
        self.procs.append(subprocess.Popen(
            [sbin('munged'), '-F', '--force', f'--socket={d}/munge.sock', f'--key-file={d}/munge.key',
             f'--pid-file={d}/munge/munged.pid', f'--log-file={d}/munge/munged.log', f'--seed-file={d}/munge/seed'],
            stdout=log, stderr=log))
        self._wait_for(lambda: (d / 'munge.sock').exists(), timeout, 'munged')
        self.procs.append(subprocess.Popen([sbin('slurmctld'), '-D', '-i', '-f', str(d / 'slurm.conf')], stdout=log, stderr=log))
        self.procs.append(subprocess.Popen([sbin('slurmd'), '-D', '-f', str(d / 'slurm.conf')], stdout=log, stderr=log))
        self._wait_for(self.node_ready, timeout, 'slurmd to register its node')
        return self

    def node_ready(self):
        r = subprocess.run(['sinfo', '-h', '-o', '%T'], capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() in ('idle', 'mixed', 'allocated')

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
            time.sleep(1)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs = []
        if self.env_before is None:
            os.environ.pop('SLURM_CONF', None)
        else:
            os.environ['SLURM_CONF'] = self.env_before

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
