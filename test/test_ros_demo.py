"""The README's demo end to end: node + sample bag replay with /clock + recording + drawn plans."""

import pytest

pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from PIL import Image  # noqa: E402

from wamdiff_ros.ros.bags import topic_counts  # noqa: E402
from wamdiff_ros.ros.demo import main  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(600)]


def test_demo_replays_records_and_draws(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", "231")
    assert main(["--out", str(tmp_path), "--settle", "2"]) == 0
    out = capsys.readouterr().out
    assert "plans recorded" in out and "latency: inference p50" in out
    counts = {topic: n for topic, (_, n) in topic_counts(tmp_path / "outputs.mcap").items()}
    assert counts["/wamdiff_planner/output/plan"] >= 20 and counts["/diagnostics"] >= 1  # of 100 frames
    strip = Image.open(tmp_path / "demo_strip.png")
    assert strip.size[1] > 2 * strip.size[0] / 2  # several frames stacked
    assert Image.open(tmp_path / "demo.gif").n_frames >= 5
