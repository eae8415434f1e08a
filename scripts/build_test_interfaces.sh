#!/usr/bin/env bash
# Build the TEST-ONLY interface packages (test/interfaces/*: carla_msgs, whose field lists the Bench2Drive adapter
# uses; carla_msgs has no wheel) into the venv like the package's own msg/ (scripts/build_interfaces.sh): libraries in
# $VENV/lib, the Python part in $VENV/lib/wamdiff_test_interfaces, which is NOT on sys.path: only the tests that need
# it add it (test/conftest.py: TEST_INTERFACES), so the runtime never imports a stand-in carla_msgs.
# Only where the real carla_msgs is not installed (scripts/install_ros2_tools.sh, from ../shared/vendor/ros2): the
# stand-in's libraries have the real one's names and would replace them.
# Usage: scripts/build_test_interfaces.sh VENV [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "$1" && pwd)
BUILD=${2:-build/test_interfaces}
PY_DIR=lib/wamdiff_test_interfaces
if [ -f "$VENV/share/carla_msgs/srv/SpawnObject.srv" ]; then  # the real one (the stand-in has no services)
  echo "the real carla_msgs is installed in $VENV: the test-only stand-in (test/interfaces) is not built"
  rm -rf "$VENV/$PY_DIR"
  exit 0
fi
mkdir -p "$BUILD"
for pkg in test/interfaces/*/; do
  name=$(basename "$pkg")
  echo "building the test-only interfaces $name into $VENV/$PY_DIR (log: $BUILD/$name.log)"
  ( set -e
    export AMENT_PREFIX_PATH=$VENV CMAKE_PREFIX_PATH=$VENV
    cmake -S "$pkg" -B "$BUILD/$name" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
      -DCMAKE_INSTALL_PREFIX="$VENV" -DPython3_EXECUTABLE="$VENV/bin/python" -DPYTHON_INSTALL_DIR=$PY_DIR
    cmake --build "$BUILD/$name" --parallel "$(nproc 2>/dev/null || echo 2)"
    cmake --install "$BUILD/$name" ) > "$BUILD/$name.log" 2>&1 \
    || { tail -n 40 "$BUILD/$name.log"; echo "test interface build failed, see $BUILD/$name.log"; exit 1; }
done
PYTHONPATH="$VENV/$PY_DIR" "$VENV/bin/python" -c 'import carla_msgs.msg as m; m.CarlaEgoVehicleControl(); m.CarlaRoute()'
