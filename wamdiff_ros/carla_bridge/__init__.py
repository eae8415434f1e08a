"""The CARLA / Bench2Drive bridge: the planner server ``wamdiff-serve`` and a thin leaderboard agent.

The agent side (``agent``, ``client``, ``protocol``, ``frames``, ``localization``, ``route``, ``metric_log``) is
stdlib + numpy and Python 3.7 syntax, for the leaderboard's own Python; only ``server`` imports the planner (torch).
This package module imports nothing, so importing the agent pulls in no torch.
"""
