"""Smoke run of ``wamdiff-bench node``: a few seconds of small images; checks behaviour (JSON, delivery), not speed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"frames_published", "frames_delivered_pct", "publish_rate_hz", "plans", "plans_per_s", "frame_to_plan_ms",
        "node", "ros_overhead_ms", "rss_mb", "profile"}


def test_bench_cli_lists_the_node_benchmark(capsys):
    from wamdiff_ros.bench.__main__ import BENCHMARKS, main

    assert "node" in BENCHMARKS
    assert main(["nope"]) == 2
    assert "node" in capsys.readouterr().err


@pytest.mark.ros
@pytest.mark.timeout(120)
def test_node_bench_smoke_run(tmp_path):
    out = tmp_path / "node.json"
    cmd = [sys.executable, "-m", "wamdiff_ros.bench", "node", "--seconds", "4", "--rate", "10", "--width", "64",
           "--height", "48", "--warmup", "1", "--threads", "1", "--no-progress", "--json", str(out),
           "--node-log", str(tmp_path / "node.log")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=110)
    log = (tmp_path / "node.log").read_text() if (tmp_path / "node.log").exists() else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{log}"
    assert "frames delivered" in proc.stdout and "%" in proc.stdout
    r = json.loads(out.read_text())
    assert KEYS <= r.keys()
    assert set(r["frame_to_plan_ms"]) == {"p50", "p99"} and set(r["ros_overhead_ms"]) == {"p50", "p99"}
    assert set(r["rss_mb"]) == {"start", "end", "growth_pct"} and r["rss_mb"]["start"] > 0
    assert r["profile"] is True and r["profile_file"].endswith("fastdds.xml")
    assert r["frames_published"] >= 20  # 4 s at 10 Hz, allowing for a slow machine
    assert 0 < r["frames_delivered_pct"] <= 100.0
    assert r["plans"] > 0 and r["frame_to_plan_ms"]["p50"] > 0
    for key in ("frames", "planned", "inference_p50_ms", "frame_to_plan_p50_ms", "ros_overhead_p50_ms"):
        assert key in r["node"]
    assert r["node"]["planned"] > 0
