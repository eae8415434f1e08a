"""Rigs that start the planner node with a simulator on this machine: the demo and the ROS closed loop on the CPU
world, and the child-process handling they share."""
