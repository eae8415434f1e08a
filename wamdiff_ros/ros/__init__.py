"""The ROS 2 shell of wamdiff_ros: message conversions, the planning cycle's plain parts and the node."""
