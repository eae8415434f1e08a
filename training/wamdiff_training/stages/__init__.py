"""Training stages: each turns a batch of samples into a loss through the engine's ``Runner`` (``engine.Stage``).

``STAGES`` maps the CLI's stage names to factories ``(config, bundle) -> Stage``.
"""

from __future__ import annotations

from wamdiff_training.stages import adapt, cross_scale, distill
from wamdiff_training.stages.ar import ArStage

# phase 1 AR pretraining; Stage I progressive block adaptation; Stage II block-wise distillation; Stage III
# cross-scale (model-wise) distillation
STAGES = {"ar": ArStage, "adapt": adapt.from_config, "distill": distill.from_config,
          "cross-scale": cross_scale.from_config}
NAMES = tuple(STAGES)
