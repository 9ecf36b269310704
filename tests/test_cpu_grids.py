"""tools/cpu_grids.py, the driver of the CPU grids: how it hands signals to the step it runs."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / 'tools'


@pytest.mark.skipif(os.name != 'posix', reason='POSIX signals')
def test_a_sigterm_to_the_driver_alone_reaches_its_step_and_nothing_more_starts(tmp_path):
    """A scheduler signals the driver only: the step (compare.py in a grid) gets the SIGTERM, the
    driver waits for it to finish and exits non-zero with one line, and no step is left running."""
    step = textwrap.dedent(f"""
        import os, signal, sys, time
        def stop(signum, frame):
            open({str(tmp_path / 'stopped')!r}, 'w').write('saved')
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))
        time.sleep(120)
    """)
    driver = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TOOLS)!r})
        import cpu_grids
        rc = cpu_grids.run_step([sys.executable, '-c', {step!r}])
        open({str(tmp_path / 'next_step')!r}, 'w').write(str(rc))  # what the driver would do next
    """)
    proc = subprocess.Popen([sys.executable, '-c', driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (tmp_path / 'pid').exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the step's handler is installed before it writes its pid
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert stderr.strip().splitlines()[-1] == 'stopped by SIGTERM: rerun the same command to resume'
    assert (tmp_path / 'stopped').read_text() == 'saved'
    assert not (tmp_path / 'next_step').exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / 'pid').read_text()), 0)


def test_a_step_that_ends_on_its_own_gives_its_exit_code_and_the_old_handler_back():
    sys.path.insert(0, str(TOOLS))
    before = signal.getsignal(signal.SIGTERM)
    try:
        import cpu_grids
        assert cpu_grids.run_step([sys.executable, '-c', 'import sys; sys.exit(3)']) == 3
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        sys.path.remove(str(TOOLS))
