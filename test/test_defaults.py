"""Package defaults equal the shipped model's: one home per fact, checked against the shipped wamdiff.json."""

import dataclasses
import json
from pathlib import Path

import pytest

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.model import META_FILE, DecodeMeta
from wamdiff_ros.model_names import DEFAULT_MODEL, resolve

SHIPPED = Path(resolve(DEFAULT_MODEL))


def test_decode_meta_defaults_are_the_shipped_models():
    shipped = json.loads((SHIPPED / META_FILE).read_text())
    defaults = dataclasses.asdict(DecodeMeta())
    assert {k: v for k, v in defaults.items() if v is not None} == shipped  # unset optional keys are not saved
    assert fmt.FORMAT_VERSION == shipped["format_version"]


def test_decode_settings_fit_the_shipped_model():
    meta = DecodeMeta(**json.loads((SHIPPED / META_FILE).read_text()))
    assert DecodeSettings().block_size == meta.trained_block_size


def test_the_shipped_recipe_trains_what_the_package_decodes():
    pytest.importorskip("wamdiff_training", reason="the training package is not installed")
    from wamdiff_training.hierarchy import load_plan

    plan = load_plan(Path(__file__).resolve().parents[1] / "training" / "configs" / "tiny_hierarchy.yaml")
    meta = DecodeMeta()
    assert plan.format_version == meta.format_version and plan.route_points == meta.route_points
    assert plan.curriculum[-1] == meta.trained_block_size == DecodeSettings().block_size
