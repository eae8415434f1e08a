"""The CARLA-side agents (the thin agent, the ROS2Agent) under Bench2Drive's own interpreter: test/py37 run by
.venv37's Python 3.7 (``make py37``: carla==0.9.15, numpy 1.21), against a real ``wamdiff-serve`` started here."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY37 = ROOT / ".venv37" / "bin" / "python"


@pytest.mark.timeout(600)
def test_agents_pass_their_tests_under_python_3_7(tmp_path):
    if not PY37.is_file():
        pytest.skip("no .venv37 (make py37: needs a python3.7 interpreter, e.g. pyenv's 3.7.16)")
    probe = "import sys, carla, numpy; print(sys.version_info[:2], numpy.__version__)"
    version = subprocess.run([str(PY37), "-c", probe], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("(3, 7)"), version.stdout + version.stderr
    from wamdiff_ros.carla_bridge.server import launch

    process, address = launch(["--model", "tiny-random", "--port", "0", "--threads", "1", "--world", "carla"])
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        ini = tmp_path / "pytest.ini"  # not the repository's (its options and plugins are the main venv's)
        ini.write_text("[pytest]\n")
        run = subprocess.run([str(PY37), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-c", str(ini),
                              "--noconftest", str(ROOT / "test" / "py37")],
                             env={**env, "WAMDIFF_TEST_SERVER": address, "OMP_NUM_THREADS": "1"},
                             cwd=str(tmp_path), capture_output=True, text=True, timeout=500)
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
