"""The CPU closed-loop world: highway-env scenarios, a rendered front camera, a privileged expert, dataset export and
a Bench2Drive-style evaluator. No ROS imports here."""
