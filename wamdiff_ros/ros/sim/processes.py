"""Child ROS 2 processes of the demo and the closed-loop runner: their environment, start and stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def share_file(name: str) -> Path:
    """``config/<name>`` from the repository, else from the installed share folder."""
    repo = Path(__file__).resolve().parents[3] / "config" / name
    return repo if repo.is_file() else Path(sys.prefix) / "share" / "wamdiff_ros" / "config" / name


def ros_environment() -> dict:
    """The environment for child ROS 2 processes: loopback discovery in a domain of this process's own, the
    package's Fast DDS profile, one OpenMP thread each (the caller's settings win)."""
    env = dict(os.environ)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.setdefault("ROS_DOMAIN_ID", str(200 + os.getpid() % 30))
    env.setdefault("FASTDDS_DEFAULT_PROFILES_FILE", str(share_file("fastdds.xml")))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def python_module(*args: str) -> list[str]:
    """The command line running ``python -m <args>`` with this interpreter."""
    return [sys.executable, "-m", *args]


def stop(proc: subprocess.Popen, seconds: float = 15.0) -> None:
    """Ctrl-C, then kill after ``seconds``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(seconds)
        except subprocess.TimeoutExpired:
            proc.kill()


def shut_down(procs: list[subprocess.Popen], logs: dict) -> None:
    """Stop ``procs`` in order and close their log files."""
    for proc in procs:
        stop(proc)
    for f in logs.values():
        f.close()
