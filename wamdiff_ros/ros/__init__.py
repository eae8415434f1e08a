"""The ROS 2 shell of wamdiff_ros: the planner node and what only it uses (conversions, the planning cycle's plain
parts, the scheduler, outputs, parameters, the black box and bags). ``bridge/``: the simulator side of its topics;
``sim/``: the rigs that run it with a simulator here."""
