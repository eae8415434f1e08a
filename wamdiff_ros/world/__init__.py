"""The CPU closed-loop world: highway-env scenarios, a rendered front camera, a privileged expert, the closed-loop
episode loop and a Bench2Drive-style evaluator (its data export and probes are ``wamdiff_training.world``). No ROS
imports here."""
