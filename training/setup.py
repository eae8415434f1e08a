"""``wamdiff-training``: the companion training package; imports ``wamdiff_ros``, never imported by it."""

from setuptools import find_packages, setup

setup(
    name="wamdiff-training",
    version="0.1.0",
    description="WAM-Diff2-style hierarchical distillation training for the wamdiff_ros planner",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["wamdiff_training", "wamdiff_training.*"]),
    # the CPU world's data export, probes and trace need what wamdiff_ros's sim extra installs
    install_requires=["wamdiff_ros", "pyyaml>=6", "tensorboard>=2.16", "highway-env>=1.12.1,<1.13",
                      "matplotlib>=3.8", "imageio-ffmpeg>=0.5"],
    entry_points={"console_scripts": ["wamdiff-train = wamdiff_training.cli:main"]},
)
