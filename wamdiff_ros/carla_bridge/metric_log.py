"""``metric_info.json`` as Bench2Drive's tools read it (stdlib only, Python 3.7 syntax).

Bench2Drive's ``tools/efficiency_smoothness_benchmark.py`` reads ``<SAVE_PATH>/<save_name>/metric_info.json``: one
JSON object keyed by step, each value holding at least ``acceleration``, ``angular_velocity``, ``forward_vector``,
``right_vector``, ``location`` (x, y, z) and ``rotation`` (roll, pitch, yaw) of the ego in CARLA's frame -- what
Bench2Drive's ``AutonomousAgent.get_metric_info()`` returns. The reference agents rewrite the whole object every step
(quadratic in the route length); this log appends each step in place instead, so the file is a complete JSON object
after every step at a constant cost per step.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

FILE_NAME = "metric_info.json"


class MetricLog(object):
    def __init__(self, directory: str, file_name: str = FILE_NAME) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, file_name)
        self._file = open(self.path, "w+b")
        self._file.write(b"{}\n")
        self._file.flush()
        self._empty = True
        self.entries = 0

    def write(self, step: int, entry: Dict[str, Any]) -> None:
        if self._file is None:
            return
        item = json.dumps({str(step): _finite(entry)}, separators=(",", ":"), allow_nan=False, default=_plain)[1:-1]
        # Overwrite the closing "}\n" with the new item and close the object again.
        self._file.seek(-2, os.SEEK_END)
        self._file.write(((b"" if self._empty else b",\n") + item.encode("utf-8")) + b"}\n")
        self._file.flush()
        self._empty = False
        self.entries += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _finite(value: Any) -> Any:
    """NaN and infinities -> None (strict JSON), through dicts and lists."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (and anything iterable) as JSON values."""
    if hasattr(value, "tolist"):
        return _finite(value.tolist())
    try:
        return list(value)
    except TypeError:
        raise TypeError("not JSON serialisable: %r" % (value,)) from None


def resolve_directory(configured: Optional[str], save_name: Optional[str]) -> Optional[str]:
    """``<dir>/<save_name>`` (the leaderboard's per-route name) or ``<dir>``; None when no directory is set."""
    if not configured:
        return None
    return os.path.join(configured, save_name) if save_name else configured
