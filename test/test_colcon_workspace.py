"""The standard workspace path: the package copied into a fresh ROS 2 workspace, built with `colcon build`
(colcon-common-extensions from PyPI on top of the ROS 2 wheels, whose prefix is the venv), and the planner node
started from the install space's own executable (lib/wamdiff_ros/wamdiff_planner_node) answers a frame with a plan.
Also: package.xml declares, with its rosdep key, every ROS package and Python distribution the runtime imports."""

import ast
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
# import name -> rosdep key, for the non-ROS Python the runtime (setup.py's install_requires + [ros]) imports
PYTHON_KEYS = {"numpy": "python3-numpy", "PIL": "python3-pil", "tqdm": "python3-tqdm", "yaml": "python3-yaml",
               "torch": "python3-pytorch-pip", "transformers": "python3-transformers-pip",
               "safetensors": "python3-safetensors-pip", "tokenizers": "python3-tokenizers-pip",
               "rosbags": "python3-rosbags-pip"}
OPTIONAL = {"flashinfer": "setup.py's [gpu], CUDA only", "ruamel": "rosbags' own dependency"}
NOT_RUNTIME = ("world", "bench", "carla_bridge")  # the [sim] world, benchmarks, the CARLA side: not the node's


def _declared() -> set[str]:
    root = ET.parse(ROOT / "package.xml").getroot()
    return {e.text.strip() for e in root if e.tag in ("depend", "exec_depend")}


def _runtime_imports() -> set[str]:
    names = set()
    for path in (ROOT / "wamdiff_ros").rglob("*.py"):
        rel = path.relative_to(ROOT / "wamdiff_ros").parts
        if rel[0] in NOT_RUNTIME or rel[:2] in (("ros", "bridge"), ("ros", "sim")):  # simulator side; carla_msgs
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_package_xml_declares_every_runtime_dependency():
    declared, imports = _declared(), _runtime_imports()
    ros = {n for n in imports if n.endswith("_msgs") or n in ("rclpy", "rcl_interfaces", "builtin_interfaces",
                                                              "ament_index_python")}
    assert ros and ros <= declared, ros - declared
    python = {PYTHON_KEYS[n] for n in imports if n in PYTHON_KEYS}
    assert python <= declared, python - declared
    unknown = {n for n in imports if n not in PYTHON_KEYS and n not in ros and n != "wamdiff_ros"
               and n not in sys.stdlib_module_names and n not in OPTIONAL}
    assert not unknown, f"imported by the runtime, no rosdep key here: {unknown}"


def _copy_package(dest: Path) -> None:
    """The package's tracked files (a clean clone's content), or the tree without build outputs."""
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in files.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
    if not names:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".venv", "build", "out", ".git", "__pycache__"))
        return
    for name in names:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.ros
@pytest.mark.timeout(900)
def test_colcon_builds_a_workspace_whose_install_space_runs_the_node(tmp_path):
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    bindir = Path(sys.executable).parent
    colcon = shutil.which("colcon", path=str(bindir)) or shutil.which("colcon")
    if colcon is None:
        pytest.skip("colcon is not installed (colcon-common-extensions, in requirements.lock)")
    ws = tmp_path / "ws"
    _copy_package(ws / "src" / "wamdiff_ros")
    env = {**os.environ, "AMENT_PREFIX_PATH": sys.prefix, "CMAKE_PREFIX_PATH": sys.prefix,
           "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "COLCON_LOG_PATH": str(ws / "log")}
    build = subprocess.run([colcon, "build", "--event-handlers", "console_direct-", "--cmake-args",
                            f"-DPython3_EXECUTABLE={sys.executable}", "-DBUILD_TESTING=OFF"],
                           cwd=ws, env=env, capture_output=True, text=True, timeout=800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    install = ws / "install"
    assert not (install / "carla_msgs").exists()  # test/interfaces is COLCON_IGNOREd: no stand-in in a workspace
    exe = install / "wamdiff_ros" / "lib" / "wamdiff_ros" / "wamdiff_planner_node"
    assert exe.is_file() and os.access(exe, os.X_OK)
    share = install / "wamdiff_ros" / "share" / "wamdiff_ros"
    for shipped in ("package.xml", "config/planner.yaml", "launch/planner.launch.py", "rviz/wamdiff.rviz",
                    "msg/Detection2DArray.msg"):
        assert (share / shipped).is_file(), shipped

    from ros_harness import Harness, round_trip, ros_environment, start  # rclpy: imported past the skip above

    sourced = f"source {install / 'local_setup.bash'} && "
    where = subprocess.run(["bash", "-c", sourced + "python3 -c 'import wamdiff_ros.msg, wamdiff_ros.ros.node as n; "
                            "print(wamdiff_ros.msg.__file__); print(n.__file__)'"],
                           cwd=ws, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    # the install space's, not the repository's (cwd: the workspace, as a user's shell)
    assert all(line.startswith(str(install)) for line in where.stdout.split()), where.stdout

    log = tmp_path / "node.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", sourced + f"exec {exe} --autostart --ros-args -p model:=tiny-random "
                                 "-p steps:=2 -p schedule:=static -p default_command:=follow -p blackbox_dir:=none "
                                 "-p deadline_ms:=30000.0 -p diagnostics_period_s:=0.5"],
                                cwd=ws, env={**ros_environment(), "PATH": env["PATH"], "OMP_NUM_THREADS": "1",
                                             "AMENT_PREFIX_PATH": sys.prefix}, stdout=out,
                                stderr=subprocess.STDOUT)
    h = Harness()
    try:
        start(h, SimpleNamespace(proc=proc, log=log))
        _, plan = round_trip(h)
        assert plan is not None, log.read_text()
    finally:
        proc.terminate()
        proc.wait(15)
        h.close()
