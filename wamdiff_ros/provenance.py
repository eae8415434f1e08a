"""Where a measurement ran: the CPU, its cores, torch, this package and its git commit.

Speeds and real-time scores depend on all of these (a plan landing one sim step after its image or two turns on a
few milliseconds), so every report that holds one records them, and two numbers are compared only where they agree.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# Not code: what a run writes into the checkout (training/results' logs as ``wamdiff-train results evaluate`` fills
# them, one planner after another) and documentation. Changed, they leave the measured code as committed.
NOT_CODE = (":(exclude,top)training/results", ":(exclude,top,glob)**/*.md")


def git_commit(path: Path = PACKAGE_DIR) -> str | None:
    """The checkout's commit (12 hex digits, ``-dirty`` when tracked files other than ``NOT_CODE`` differ from it);
    None outside a git checkout (an installed wheel) or without git."""
    try:
        run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=10, check=True)
        commit = run(["git", "-C", str(path), "rev-parse", "--short=12", "HEAD"]).stdout.strip()
        dirty = run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no", "--", ":/",
                     *NOT_CODE]).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def host_info() -> dict:
    """{cpu, cores, torch, package, commit}: what a timed result depends on besides its own settings."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        package = version("wamdiff_ros")
    except PackageNotFoundError:
        package = None
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__, "package": package,
            "commit": git_commit()}


def same_host(a: dict | None, b: dict | None) -> bool | None:
    """Whether two results ran on the same kind of CPU and core count with the same code; None when either did
    not record it (logs made before this existed)."""
    if not a or not b:
        return None
    return all(a.get(k) == b.get(k) for k in ("cpu", "cores", "torch", "commit"))
