"""wamdiff_ros: a WAM-Diff2-style block-diffusion driving VLA planner, with its ROS 2 shell."""

# The ROS build installs generated interfaces (wamdiff_ros.msg) into another prefix under the same package name.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

__version__ = "0.1.0"
