#!/usr/bin/env bash
# Build the package's ROS 2 interfaces (msg/) into a venv that the ROS 2 wheels from PyPI made an ament prefix
# ($VENV/lib, $VENV/share, the ament index), with ament_cmake + rosidl (CMakeLists.txt). The generated Python package
# goes to $VENV/lib/wamdiff_ros_interfaces/wamdiff_ros, NOT site-packages: an editable install keeps serving
# wamdiff_ros from the repository, and a wamdiff_ros.pkg file in site-packages makes pkgutil.extend_path (in
# wamdiff_ros/__init__.py) add the generated part (wamdiff_ros.msg) to the package's __path__.
# Usage: scripts/build_interfaces.sh VENV [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
VENV=$(cd "$1" && pwd)
BUILD=${2:-build/ros}
PY_DIR=lib/wamdiff_ros_interfaces
mkdir -p "$BUILD"
echo "building the ROS 2 interfaces into $VENV (log: $BUILD/build.log)"
rm -rf "$VENV/$PY_DIR" "$VENV/share/wamdiff_ros/config" "$VENV/share/wamdiff_ros/launch" "$VENV/share/wamdiff_ros/rviz"
( set -e
  export AMENT_PREFIX_PATH=$VENV CMAKE_PREFIX_PATH=$VENV
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DCMAKE_INSTALL_PREFIX="$VENV" -DPython3_EXECUTABLE="$VENV/bin/python" \
    -DPYTHON_INSTALL_DIR=$PY_DIR -DWAMDIFF_ROS_INSTALL_PYTHON_SOURCES=OFF
  cmake --build "$BUILD" --parallel "$(nproc 2>/dev/null || echo 2)"
  cmake --install "$BUILD" ) > "$BUILD/build.log" 2>&1 \
  || { tail -n 40 "$BUILD/build.log"; echo "ROS 2 interface build failed, see $BUILD/build.log"; exit 1; }
"$VENV/bin/python" -c 'import sys, sysconfig; open(sysconfig.get_path("purelib") + "/wamdiff_ros.pkg", "w").write(sys.argv[1])' \
  "$VENV/$PY_DIR/wamdiff_ros"
cd / && "$VENV/bin/python" -c 'import sys, wamdiff_ros, wamdiff_ros.format, wamdiff_ros.msg
assert wamdiff_ros.__file__ == sys.argv[1], "wamdiff_ros imported from " + wamdiff_ros.__file__' \
  "$REPO/wamdiff_ros/__init__.py"
