"""Training stages: each turns a batch of samples into a loss through the engine's ``Runner`` (``engine.Stage``).

``STAGES`` maps the CLI's stage names to factories ``(config, bundle) -> Stage``; the stages not built yet are
listed in ``PLANNED`` so the CLI can say so.
"""

from __future__ import annotations

from wamdiff_training.stages.ar import ArStage

STAGES = {"ar": ArStage}
PLANNED = ("adapt", "distill", "cross-scale")  # progressive block adaptation, block-wise JSD, cross-scale
NAMES = ("ar", *PLANNED)
