#!/usr/bin/env bash
# Install the upstream ROS 2 Python tools that PyPI lacks -- launch, launch_ros (ros2 launch), the ros2 CLI,
# rosidl_runtime_py -- and the interface packages they and Bench2Drive need -- composition_interfaces (launch_ros
# imports it) and carla-ros-bridge's carla_msgs (leaderboard-2.0) -- into a venv that the ROS 2 wheels made an ament
# prefix, from their source archives in VENDOR (../shared/vendor/ros2; its README says which commits and why each step
# is needed). Never copied into the repository. Without VENDOR: one line, nothing installed (a ROS install has them).
#   Python packages: pip install --no-deps --no-build-isolation ./<folder> (their PyPI dependencies are in
#     requirements.lock); data files land in $VENV/share (the ament index), `ros2` in $VENV/bin.
#   Interface packages: cmake into the venv prefix like msg/ (scripts/build_interfaces.sh), with the wheels' include
#     fix-up (cmake/ros_wheels_include_fixup.cmake) appended to their CMakeLists.txt; carla_msgs finds
#     ros_environment (no wheel): an empty config file with ROS_VERSION=2 stands in.
# With the real carla_msgs installed, the test-only stand-in (scripts/build_test_interfaces.sh) is removed from the
# venv: its libraries have the same names.
# Usage: scripts/install_ros2_tools.sh VENV [BUILD_DIR] [VENDOR]   (VENDOR default: $WAMDIFF_ROS2_VENDOR, else
#   ../shared/vendor/ros2 beside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd -P)
VENV=$(cd "$1" && pwd)
BUILD=${2:-build/ros2_tools}
VENDOR=${3:-${WAMDIFF_ROS2_VENDOR:-../shared/vendor/ros2}}
ARCHIVES="launch-3.7.1.tar.gz launch_ros.tar.gz ros2cli.tar.gz rosidl_runtime_py.tar.gz composition_interfaces.tar.gz
  carla_msgs-leaderboard-2.0.tar.gz"
missing=""
for a in $ARCHIVES; do [ -f "$VENDOR/$a" ] || missing="$missing $a"; done
if [ ! -d "$VENDOR" ] || [ -n "$missing" ]; then
  [ -d "$VENDOR" ] && where="$VENDOR lacks$missing" || where="no folder $VENDOR"
  echo "ROS 2 tools not installed ($where): ros2 launch, the ros2 CLI and carla_msgs are not added to $VENV (a ROS" \
    "install has them); the launch tests skip, the Bench2Drive tests use the test-only carla_msgs"
  exit 0
fi
VENDOR=$(cd "$VENDOR" && pwd)
rm -rf "$BUILD" && mkdir -p "$BUILD/src"
BUILD=$(cd "$BUILD" && pwd)
LOG=$BUILD/install.log
echo "installing the ROS 2 tools from $VENDOR into $VENV (log: $LOG)"
for a in $ARCHIVES; do tar -xzf "$VENDOR/$a" -C "$BUILD/src"; done

PY_PACKAGES="launch/launch launch/launch_xml launch/launch_yaml rosidl_runtime_py ros2cli/ros2cli launch_ros/launch_ros
  launch_ros/ros2launch ros2cli/ros2pkg ros2cli/ros2topic ros2cli/ros2node ros2cli/ros2lifecycle ros2cli/ros2param
  ros2cli/ros2run ros2cli/ros2service ros2cli/ros2interface"
mkdir -p "$BUILD/ros_environment"
echo 'set(ros_environment_FOUND TRUE)' > "$BUILD/ros_environment/ros_environmentConfig.cmake"
( set -e
  cd "$BUILD/src"
  # shellcheck disable=SC2046
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
    $(for p in $PY_PACKAGES; do echo "./$p"; done)
  export AMENT_PREFIX_PATH=$VENV CMAKE_PREFIX_PATH=$VENV ROS_VERSION=2
  for pkg in rcl_interfaces/composition_interfaces carla_msgs; do
    name=$(basename "$pkg")
    printf '\n# added at install (scripts/install_ros2_tools.sh): the ROS 2 wheels include paths\ninclude(%s)\n' \
      "$REPO/cmake/ros_wheels_include_fixup.cmake" >> "$pkg/CMakeLists.txt"
    cmake -S "$pkg" -B "$BUILD/$name" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
      -DCMAKE_INSTALL_PREFIX="$VENV" -DPython3_EXECUTABLE="$VENV/bin/python" \
      -Dros_environment_DIR="$BUILD/ros_environment"
    cmake --build "$BUILD/$name" --parallel "$(nproc 2>/dev/null || echo 2)"
    cmake --install "$BUILD/$name"
  done ) > "$LOG" 2>&1 \
  || { tail -n 40 "$LOG"; echo "ROS 2 tools install failed, see $LOG"; exit 1; }
rm -rf "$VENV/lib/wamdiff_test_interfaces"  # the stand-in carla_msgs' Python part (its libraries were replaced)
cd / && "$VENV/bin/python" -c '
import launch, launch_ros, rosidl_runtime_py, ros2cli, composition_interfaces.srv
from carla_msgs.msg import CarlaEgoVehicleControl, CarlaRoute, CarlaGnssRoute, CarlaSpeedometer
from carla_msgs.srv import SpawnObject, DestroyObject'
test -x "$VENV/bin/ros2"
