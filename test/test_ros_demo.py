"""The README's demo end to end: node + sample bag replay with /clock + recording + drawn plans, then one closed-loop
episode through real topics, and the model's measured score from its folder."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")

from PIL import Image  # noqa: E402

from rclpy.serialization import deserialize_message  # noqa: E402
from sensor_msgs.msg import Image as Image_msg  # noqa: E402

from wamdiff_ros.msg import PlannerOutput  # noqa: E402
from wamdiff_ros.ros.bags import read_messages, topic_counts  # noqa: E402
from wamdiff_ros.ros.conversions import stamp_to_sec  # noqa: E402
from wamdiff_ros.ros.sim.demo import _wait_until_recording, main, measured_score  # noqa: E402

BAG = Path(__file__).resolve().parents[1] / "wamdiff_ros" / "assets" / "sample_drive.mcap"


def _first_stamp(path, topic, cls):
    return min(stamp_to_sec(deserialize_message(bytes(raw), cls).header.stamp)
               for _, _, raw in read_messages(path, [topic]))


def test_the_replay_waits_until_every_output_is_recorded(tmp_path):
    log = tmp_path / "record.log"
    alive = SimpleNamespace(poll=lambda: None)
    log.write_text("[INFO] [1.0] [wamdiff_record]: recording /a (std_msgs/msg/String)\n")
    assert _wait_until_recording(log, ("/a",), alive, 1.0)
    assert not _wait_until_recording(log, ("/a", "/b"), alive, 0.3)  # /b never came
    assert not _wait_until_recording(log, ("/b",), SimpleNamespace(poll=lambda: 1), 5.0)  # the recorder died


@pytest.mark.ros
@pytest.mark.timeout(600)
def test_demo_replays_records_and_draws(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", "231")
    assert main(["--model", "tiny-random", "--out", str(tmp_path), "--settle", "2", "--no-drive"]) == 0
    out = capsys.readouterr().out
    assert "100 camera frames replayed" in out and "plans recorded" in out and "latency: inference p50" in out
    assert "closed-loop drive" not in out and not (tmp_path / "closed_loop").exists()
    counts = {topic: n for topic, (_, n) in topic_counts(tmp_path / "outputs.mcap").items()}
    assert counts["/wamdiff_planner/output/plan"] >= 20 and counts["/diagnostics"] >= 1  # of 100 frames
    # detection at 1 Hz and the description at 0.5 Hz over the 10 s bag, drawn under the plans of later frames
    assert counts["/wamdiff_planner/output/boxes"] >= 3 and counts["/wamdiff_planner/output/description"] >= 2
    assert "detections (" in out and "descriptions" in out
    assert "plans stepping back in x (> 0.5 m): " in out and "after reflection" in out
    # the replay starts once the recorder hears the node's outputs, so the first frame's plan is in the recording
    assert _first_stamp(BAG, "/wamdiff_planner/input/image", Image_msg) == _first_stamp(
        tmp_path / "outputs.mcap", "/wamdiff_planner/output/plan", PlannerOutput)
    strip = Image.open(tmp_path / "demo_strip.png")
    assert strip.size[1] > 2 * strip.size[0] / 2  # several frames stacked
    assert Image.open(tmp_path / "demo.gif").n_frames >= 5


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_drives_a_closed_loop_episode_after_the_bag(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", "231")
    assert main(["--model", "tiny-random", "--out", str(tmp_path), "--settle", "1", "--drive-seconds", "2"]) == 0
    out = capsys.readouterr().out
    assert "plans recorded" in out and (tmp_path / "demo_strip.png").is_file()
    episode, = json.loads((tmp_path / "closed_loop" / "results.json").read_text())["episodes"]
    assert 0.0 < episode["sim_s"] <= 2.0 + 1e-6 and episode["plans_applied"] >= 5
    assert (f"closed-loop drive (highway, seed 1000000): {episode['end_reason']} after {episode['sim_s']:.1f} s, "
            f"Bench2Drive driving score {episode['driving_score']:.1f}") in out
    assert "measured closed-loop driving score" not in out  # tiny-random has no eval_summary.json


def test_measured_score_comes_from_the_model_folder(tmp_path, capsys):
    assert measured_score("tiny-random") is None
    assert measured_score(str(tmp_path)) is None  # no eval_summary.json: no line
    (tmp_path / "eval_summary.json").write_text(json.dumps(
        {"driving_score": 61.234, "ci90": [55.0, 67.5], "episodes": 100, "mode": "paused",
         "source": "training/RESULTS.md"}))
    assert measured_score(str(tmp_path)) == (f"{tmp_path}: measured closed-loop driving score 61.2 (90 % CI "
                                             "55.0-67.5, 100 episodes, paused mode; training/RESULTS.md)")
    (tmp_path / "eval_summary.json").write_text("{}")
    assert measured_score(str(tmp_path)) is None and "not a readable score summary" in capsys.readouterr().err


def test_demo_refuses_an_unknown_model_before_starting_anything(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tmp_path / "absent"), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and not (tmp_path / "out").exists()
