from setuptools import find_packages, setup

setup(
    name="wamdiff_ros",
    version="0.1.0",
    description="WAM-Diff2-style block-diffusion driving VLA planner for ROS 2",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["wamdiff_ros", "wamdiff_ros.*"]),
    package_data={"wamdiff_ros": ["assets/*.png", "assets/*.mcap", "assets/wamdiff-tiny/*", "control_gains.yaml", "world/scenarios_v*.yaml"]},
    install_requires=[
        "numpy>=1.26",
        "torch>=2.4",
        "transformers>=5.24,<5.25",
        "tokenizers>=0.22",
        "safetensors>=0.5",
        "pillow>=10",
        "tqdm>=4.66",
        "pyyaml>=6",
    ],
    # sim: the CPU driving world (wamdiff-eval, wamdiff-demo, the highway bridge), which uses highway-env's road and
    # vehicle classes directly, draws its plots with matplotlib and writes videos with imageio-ffmpeg
    # ros: ROS 2 Kilted's Python runtime from PyPI, for a machine without a ROS install (the node, bags, bridges)
    # carla (the CARLA client's value types) and vermin (the agent's Python 3.7 check) are for the tests only
    # gpu: FlashInfer's block-causal attention for the CUDA Graph decode path (JIT-compiles its kernels with nvcc)
    extras_require={
        "sim": ["highway-env>=1.12.1,<1.13", "matplotlib>=3.8", "imageio-ffmpeg>=0.5"],
        "ros": ["ros-rclpy", "ros-rmw-fastrtps-cpp", "ros-std-msgs", "ros-geometry-msgs", "ros-nav-msgs",
                "ros-sensor-msgs", "ros-visualization-msgs", "ros-diagnostic-msgs", "ros-builtin-interfaces",
                "ros-lifecycle-msgs", "ros-rosgraph-msgs", "rosbags"],
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "carla==0.9.16", "vermin"],
        "gpu": ["flashinfer-python==0.7.4"],
    },
    entry_points={
        "console_scripts": [
            "wamdiff-plan = wamdiff_ros.cli:plan_main",
            "wamdiff-bench = wamdiff_ros.bench.__main__:main",
            "wamdiff_planner_node = wamdiff_ros.ros.node:main",
            "wamdiff-replay = wamdiff_ros.ros.bag_tools:replay_main",
            "wamdiff-record = wamdiff_ros.ros.bag_tools:record_main",
            "wamdiff-demo = wamdiff_ros.ros.sim.demo:main",
            "wamdiff-eval = wamdiff_ros.world.evaluate:main",
            "wamdiff-serve = wamdiff_ros.carla_bridge.server:main",
            "wamdiff_highway_bridge = wamdiff_ros.ros.bridge.highway:main",
            "wamdiff_carla_control = wamdiff_ros.ros.bridge.carla_control:main",
            "wamdiff_bench2drive_adapter = wamdiff_ros.ros.bridge.bench2drive_adapter:main",
            "wamdiff-closed-loop-ros = wamdiff_ros.ros.sim.closed_loop:main",
        ]
    },
)
