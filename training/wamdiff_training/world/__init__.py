"""The CPU driving world as a source of training data and probes: dataset export, demonstrations and DAgger,
lane recoveries, privileged questions, the lane and lead probes and the plan trace (``wamdiff-train data``,
``wamdiff-train probe``, ``wamdiff-train trace``)."""
