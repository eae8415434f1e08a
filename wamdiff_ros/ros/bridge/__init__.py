"""The simulator side of the planner's topics: ROS 2 nodes a simulator runs to feed the planner node and drive with
its plans (the highway-env bridge; CARLA / Bench2Drive's adapter and control node) and the message and timing
helpers they share."""
