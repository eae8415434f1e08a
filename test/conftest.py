import numpy as np
import pytest
from hypothesis import settings

try:
    import torch

    torch.set_num_threads(1)
except ImportError:
    pass

# Bench2Drive's interpreter's tests (Python 3.7): run there by test/test_python37.py, not again here
collect_ignore = ["py37"]

settings.register_profile("ci", deadline=None, derandomize=True, max_examples=200)
settings.load_profile("ci")

# Scaling the final norm scales the (tied) LM head's logits: at 48 the tiny random model's confidences spread
# over roughly 0.6-0.97, so threshold decoding fixes several tokens in some steps and one in others.
LOGIT_SCALE = 48.0


def scaled_tiny(seed: int = 0, **meta_kwargs):
    from wamdiff_ros.model import DecodeMeta, tiny_random

    bundle = tiny_random(seed=seed, meta=DecodeMeta(**meta_kwargs) if meta_kwargs else None)
    with torch.no_grad():
        bundle.model.model.language_model.norm.weight.mul_(LOGIT_SCALE)
    return bundle


@pytest.fixture(scope="session")
def tiny_bundle():
    from wamdiff_ros.model import tiny_random

    return tiny_random()


@pytest.fixture(scope="session")
def scaled_bundle():
    return scaled_tiny()


@pytest.fixture(scope="session")
def road_image() -> np.ndarray:
    from wamdiff_ros.cli import load_rgb, sample_image_path

    return load_rgb(sample_image_path())


# Closed-loop tests run the frozen v1 scenarios with every time limit cut to this, so episodes fit in CI.
SHORT_SCENARIO_S = 3.0


@pytest.fixture(scope="session")
def short_scenario_file(tmp_path_factory):
    """A copy of the frozen v1 scenario file with every ``duration_s`` set to SHORT_SCENARIO_S."""
    from pathlib import Path

    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "wamdiff_ros/world/scenarios_v1.yaml").read_text())
    for spec in raw["scenarios"].values():
        spec["duration_s"] = SHORT_SCENARIO_S
    path = tmp_path_factory.mktemp("scenarios") / "short.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def assert_parsed_plan(plan) -> None:
    """A plan from random or briefly trained weights: the grammar makes it parse; the plan checker may refuse it
    (``implausible_action: fallback``: invalid with the checker's reason)."""
    from wamdiff_ros import format as fmt

    assert fmt.parse_waypoints(plan.text).valid, (plan.reason, plan.text)
    assert plan.valid or plan.reason == plan.implausible, plan.reason
