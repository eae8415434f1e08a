"""The node's parameter table is the one source of config/planner.yaml and docs/parameters.md."""

import yaml

from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.ros.parameters import (DECODE_PARAMS, PARAMS_DOC, PARAMS_FILE, ROOT, parameters, params_doc,
                                        params_table, params_yaml)


def test_param_file_is_written_from_the_table():
    assert PARAMS_FILE.read_text() == params_yaml(), "run: python -m wamdiff_ros.ros.parameters --write"
    values = yaml.safe_load(PARAMS_FILE.read_text())["/**"]["ros__parameters"]
    assert values == {p.name: list(p.default) if isinstance(p.default, tuple) else p.default for p in parameters()}


def test_parameter_doc_is_written_from_the_table():
    assert PARAMS_DOC.read_text() == params_doc(), "run: python -m wamdiff_ros.ros.parameters --write"
    assert all(f"| `{p.name}` |" in params_table() for p in parameters())
    assert "docs/parameters.md" in (ROOT / "README.md").read_text()


def test_decode_parameters_take_the_decode_defaults():
    defaults, table = DecodeSettings(), {p.name: p for p in parameters()}
    for name in DECODE_PARAMS:
        assert table[name].default == getattr(defaults, name), name
        assert table[name].changes == "live"
    assert table["schedule"].description == "threshold | static"
    assert len(table) == len(parameters())  # names are unique
