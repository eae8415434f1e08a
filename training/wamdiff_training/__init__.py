"""WAM-Diff2-style training for the ``wamdiff_ros`` planner (anchors §1): data and task-mixed sampling, the BD3-LM
training layout with its batched forward (``layout``), losses (``losses``) and model-vs-model metrics (``overlap``).
Imports ``wamdiff_ros`` (model, format, the one mask rule in ``wamdiff_ros.decoding.masks``), never the reverse."""
