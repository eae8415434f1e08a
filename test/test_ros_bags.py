"""Bags: the typestore with the package's messages, the bundled sample drive, the BlackBox flight recorder, and
wamdiff-replay -> wamdiff-record between two processes over Fast DDS on loopback."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("rosbags", reason="rosbags not installed")

from rosbags.rosbag2 import Reader  # noqa: E402

from wamdiff_ros.ros import bag_tools, bags  # noqa: E402
from wamdiff_ros.ros.blackbox import BlackBox  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "wamdiff_ros" / "assets" / "sample_drive.mcap"
SAMPLE_IMAGE = ROOT / "wamdiff_ros" / "assets" / "sample_front.png"
SEED = 1_000_009  # the sample drive's episode (scripts/make_sample_bag.py)
NODE = "/wamdiff_planner"
IMAGE, ODOM, COMMAND = f"{NODE}/input/image", f"{NODE}/input/odometry", f"{NODE}/input/command"
ROUTE = "/route/path"  # the route the drive followed (the highway bridge's topic)
T0_NS = 1_700_000_000 * 10**9
S = 10**9


@pytest.fixture(scope="module")
def store():
    return bags.typestore()


def _messages(path, topics=()):
    out: dict[str, list[tuple[int, bytes]]] = {}
    for conn, t, raw in bags.read_messages(path, topics):
        out.setdefault(conn.topic, []).append((t, raw))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Typestore


def test_typestore_has_kilted_and_package_types_with_rosidl_hashes(store):
    assert "sensor_msgs/msg/Image" in store.types and "rosgraph_msgs/msg/Clock" in store.types
    for name in ("DrivingCommand", "PlannerOutput", "Detection2DArray"):
        assert f"wamdiff_ros/msg/{name}" in store.types
    assert store.types["wamdiff_ros/msg/DrivingCommand"].LEFT == 1
    # the hash rosidl generated when the interfaces were built (make setup) must equal the one rosbags computes
    shares = [d / "msg" for d in bags._share_dirs("wamdiff_ros") if (d / "msg" / "DrivingCommand.json").is_file()]
    if not shares:
        pytest.skip("the package's interfaces are not installed (make setup)")
    for name in ("DrivingCommand", "PlannerOutput", "Detection2DArray"):
        desc = json.loads((shares[0] / f"{name}.json").read_text())
        rosidl = {h["type_name"]: h["hash_string"] for h in desc["type_hashes"]}
        assert store.hash_rihs01(f"wamdiff_ros/msg/{name}") == rosidl[f"wamdiff_ros/msg/{name}"]


def test_msg_dir_prefers_the_repository_then_the_installed_share(monkeypatch, tmp_path):
    assert bags.msg_dir() == ROOT / "msg"
    monkeypatch.setattr(bags, "REPO_MSG_DIR", tmp_path / "absent")
    installed = [d for d in bags._share_dirs("wamdiff_ros") if any((d / "msg").glob("*.msg"))]
    if not installed:
        with pytest.raises(FileNotFoundError):
            bags.msg_dir()
        return
    assert bags.msg_dir() == installed[0] / "msg"
    assert (bags.msg_dir() / "DrivingCommand.msg").read_text() == (ROOT / "msg" / "DrivingCommand.msg").read_text()


def test_ensure_type_loads_installed_message_definitions(store):
    assert bags.ensure_type(store, "nav_msgs/msg/Odometry")
    assert not bags.ensure_type(store, "no_such_pkg/msg/Nothing")


# ---------------------------------------------------------------------------------------------------------------
# The sample drive


def test_sample_bag_topics_counts_types_and_stamps(store):
    assert SAMPLE.stat().st_size <= 5 * 2**20
    with Reader(SAMPLE) as reader:
        topics = {t: (i.msgtype, i.msgcount) for t, i in reader.topics.items()}
        assert reader.start_time == T0_NS
        qos = {c.topic: c.ext.offered_qos_profiles for c in reader.connections}
    assert topics == {IMAGE: ("sensor_msgs/msg/Image", 100), ODOM: ("nav_msgs/msg/Odometry", 200),
                      COMMAND: ("wamdiff_ros/msg/DrivingCommand", 1), ROUTE: ("nav_msgs/msg/Path", 100)}
    hashes = bags.type_hashes(SAMPLE)  # rosbag2's metadata record in the file
    assert hashes[COMMAND] == store.hash_rihs01("wamdiff_ros/msg/DrivingCommand")
    assert hashes[IMAGE] == store.hash_rihs01("sensor_msgs/msg/Image")
    assert qos[COMMAND][0].durability.name == "TRANSIENT_LOCAL"
    assert qos[IMAGE][0].reliability.name == "BEST_EFFORT"

    msgs = _messages(SAMPLE)
    for topic, items in msgs.items():
        stamps = [t for t, _ in items]
        assert all(b > a for a, b in zip(stamps, stamps[1:])), topic
        for t, raw in items:  # log time == header stamp
            h = store.deserialize_cdr(raw, topics[topic][0]).header.stamp
            assert h.sec * S + h.nanosec == t
    assert [t for t, _ in msgs[IMAGE]] == [T0_NS + 20_000_000 + k * S // 10 for k in range(100)]
    assert [t for t, _ in msgs[ODOM]] == [T0_NS + k * S // 20 for k in range(200)]
    assert [t for t, _ in msgs[ROUTE]] == [T0_NS + k * S // 10 for k in range(100)]  # each frame's world instant
    assert qos[ROUTE][0].durability.name == "TRANSIENT_LOCAL"
    route = store.deserialize_cdr(msgs[ROUTE][0][1], "nav_msgs/msg/Path")
    ahead = np.array([(p.pose.position.x, p.pose.position.y) for p in route.poses])
    assert route.header.frame_id == "odom" and ahead.shape == (61, 2)  # 0-60 m ahead, the bridge's route/path
    assert np.hypot(*ahead[0]) < 3.0 and 55.0 < ahead[-1, 0] < 61.0  # from the ego's lane centre, forward along x

    cmd = store.deserialize_cdr(msgs[COMMAND][0][1], "wamdiff_ros/msg/DrivingCommand")
    assert msgs[COMMAND][0][0] == T0_NS and cmd.command == 0  # LANE_FOLLOW: the highway route's command

    odom = [store.deserialize_cdr(raw, "nav_msgs/msg/Odometry") for _, raw in msgs[ODOM]]
    assert all((o.header.frame_id, o.child_frame_id) == ("odom", "base_link") for o in odom)
    x = np.array([o.pose.pose.position.x for o in odom])
    y = np.array([o.pose.pose.position.y for o in odom])
    vx = np.array([o.twist.twist.linear.x for o in odom])
    assert (x[0], y[0], odom[0].pose.pose.orientation.w) == (0.0, 0.0, 1.0)  # odom = the ego's start pose
    assert vx[0] == pytest.approx(24.0) and 14.0 < vx.min() and vx.max() < 26.0  # the scenario's highway speeds
    assert 150.0 < x[-1] < 250.0 and 3.5 < y[-1] < 4.5  # ~10 s of driving, one lane (4 m) to the left
    assert np.diff(x) == pytest.approx(0.05 * vx[:-1], abs=0.1)  # the pose advances by the twist

    frames = []
    for _, raw in msgs[IMAGE]:
        img = store.deserialize_cdr(raw, "sensor_msgs/msg/Image")
        assert (img.width, img.height, img.encoding, img.step, img.header.frame_id) == (256, 128, "rgb8", 768,
                                                                                          "camera")
        frames.append(img.data.reshape(128, 256, 3))
    assert all(not np.array_equal(a, b) for a, b in zip(frames, frames[1:]))  # moving
    assert np.ptp(np.stack(frames).astype(np.int16), axis=0).max() > 100  # real motion, not noise
    assert 60 < frames[0][:40].mean() < 240  # sky at the top
    with Image.open(SAMPLE_IMAGE) as im:  # the CLI's default image is one frame of the drive
        assert np.array_equal(np.asarray(im.convert("RGB")), frames[20])


def test_sample_bag_is_the_data_exports_drive(store):
    """The bag's frames are the ones ``wamdiff-train data`` would export for that episode (its rollout, no
    perturbations, sampled at 10 Hz), and the node's ego estimate from the bag's odometry is the export's velocity /
    acceleration."""
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    from wamdiff_ros.ros.conversions import EgoEstimator, yaw_from_quaternion
    pytest.importorskip("wamdiff_training", reason="the training package is not installed")
    from wamdiff_training.world.demonstrations import NoiseConfig, RolloutConfig, rollout
    from wamdiff_ros.world.scenarios import load_scenarios

    scenarios = load_scenarios()
    episode = rollout(scenarios.get("highway"), SEED, RolloutConfig(
        sample_period_s=0.1, noise=NoiseConfig(fraction=0.0), questions_per_frame=0, max_seconds=10.0), scenarios)
    msgs = _messages(SAMPLE)
    images = [store.deserialize_cdr(raw, "sensor_msgs/msg/Image").data.reshape(128, 256, 3) for _, raw in msgs[IMAGE]]
    assert len(episode.frames) == len(images) == 100
    estimator, states = EgoEstimator(time_constant=0.0), []  # raw finite differences: the world's own definition
    for _, raw in msgs[ODOM]:
        o = store.deserialize_cdr(raw, "nav_msgs/msg/Odometry")
        states.append(estimator.update(o.header.stamp.sec + o.header.stamp.nanosec * 1e-9,
                                       (o.twist.twist.linear.x, o.twist.twist.linear.y),
                                       yaw=yaw_from_quaternion(o.pose.pose.orientation)))
    for k, frame in enumerate(episode.frames):
        assert frame.t == pytest.approx(0.1 * k)
        assert np.array_equal(frame.image, images[k]), k
        assert states[2 * k].velocity == pytest.approx(frame.velocity, abs=1e-9)
        assert states[2 * k].acceleration == pytest.approx(frame.acceleration, abs=1e-4)  # float stamps ~1.7e9 s
        assert frame.command.value == "follow"
    assert any(abs(f.acceleration[0]) > 1.0 for f in episode.frames)  # it brakes for the slow car


def test_sample_bag_deserializes_with_rclpy():
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    msgs = pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Image as ImageMsg

    from wamdiff_ros.ros.conversions import image_to_rgb

    data = _messages(SAMPLE)
    assert deserialize_message(data[COMMAND][0][1], msgs.DrivingCommand).command == msgs.DrivingCommand.LANE_FOLLOW
    rgb = image_to_rgb(deserialize_message(data[IMAGE][3][1], ImageMsg))
    assert rgb.shape == (128, 256, 3)


def test_sample_bag_script_is_deterministic(tmp_path):
    out, png = tmp_path / "again.mcap", tmp_path / "again.png"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_sample_bag.py"), str(out), "--image", str(png)],
                   check=True, capture_output=True, timeout=120)
    assert out.read_bytes() == SAMPLE.read_bytes()
    assert png.read_bytes() == SAMPLE_IMAGE.read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# McapFile


def test_mcap_file_refuses_existing_and_aborts_cleanly(tmp_path, store):
    path = tmp_path / "x.mcap"
    with pytest.raises(RuntimeError):
        with bags.McapFile(path, store) as out:
            out.write("/a", "std_msgs/msg/String", 1, bytes(store.serialize_cdr(store.types["std_msgs/msg/String"](
                data="hi"), "std_msgs/msg/String")))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    with bags.McapFile(path, store, compress=False) as out:
        with pytest.raises(KeyError):
            out.write("/b", "no_such_pkg/msg/Nothing", 1, b"\0\1\0\0")
    assert bags.topic_counts(path) == {}
    with pytest.raises(FileExistsError):
        bags.McapFile(path, store)
    with pytest.raises(ValueError):
        bags.McapFile(tmp_path / "x.bag", store)


# ---------------------------------------------------------------------------------------------------------------
# BlackBox


def _payload(i: int, size: int = 100) -> bytes:
    return bytes([i % 256]) * size


def test_blackbox_keeps_only_the_last_seconds():
    box = BlackBox(seconds=2.0, max_bytes=10**9, keep_latest=False)
    for k in range(50):  # 10 Hz for 5 s
        box.add("/a", "std_msgs/msg/String", k * S // 10, _payload(k))
    kept = box.snapshot()
    assert [e.stamp_ns for _, e in kept] == [k * S // 10 for k in range(29, 50)]  # 4.9 - 2.0 = 2.9 s onwards
    assert box.stats().dropped_old == 29 and box.nbytes == 21 * 100


def test_blackbox_keeps_the_latest_of_a_quiet_topic():
    box = BlackBox(seconds=1.0, max_bytes=10**9)
    box.add(COMMAND, "wamdiff_ros/msg/DrivingCommand", 0, b"cmd0")
    box.add(COMMAND, "wamdiff_ros/msg/DrivingCommand", 1, b"cmd1")
    for k in range(30):
        box.add("/a", "std_msgs/msg/String", k * S // 10, _payload(k))
    assert box.stats().topics == {COMMAND: 1, "/a": 11}
    assert [e.data for t, e in box.snapshot() if t == COMMAND] == [b"cmd1"]


def test_blackbox_byte_cap_drops_the_oldest():
    box = BlackBox(seconds=100.0, max_bytes=1000)
    box.add(COMMAND, "wamdiff_ros/msg/DrivingCommand", 0, b"x" * 10)
    for k in range(1, 31):
        box.add("/img", "sensor_msgs/msg/Image", k * S, _payload(k, 100))
        assert box.nbytes <= 1000
    st = box.stats()
    assert st.topics == {COMMAND: 1, "/img": 9}  # 10 + 9 * 100 <= 1000; the command outlived older images
    assert [e.stamp_ns for t, e in box.snapshot() if t == "/img"] == [k * S for k in range(22, 31)]
    assert st.dropped_cap == 21 and st.dropped_old == 0
    box.add("/big", "std_msgs/msg/String", 31 * S, b"b" * 5000)  # alone over the cap: it cannot be kept
    assert box.nbytes <= 1000


def test_blackbox_time_jumping_back_starts_over():
    box = BlackBox(seconds=5.0)
    for k in range(10):
        box.add("/a", "std_msgs/msg/String", 100 * S + k * S // 10, b"a")
    box.add("/a", "std_msgs/msg/String", 100 * S + 5 * S // 10, b"late")  # small disorder: kept
    assert len(box) == 11
    box.add("/a", "std_msgs/msg/String", 1 * S, b"again")  # a looping bag under sim time
    assert [e.data for _, e in box.snapshot()] == [b"again"]


def test_blackbox_dump_round_trip_identical_bytes_and_custom_type(tmp_path, store):
    box = BlackBox(seconds=3.0, max_bytes=10**8, store=store)
    src = _messages(SAMPLE)
    fed = []
    for topic, items in src.items():
        msgtype = {IMAGE: "sensor_msgs/msg/Image", ODOM: "nav_msgs/msg/Odometry",
                   COMMAND: "wamdiff_ros/msg/DrivingCommand", ROUTE: "nav_msgs/msg/Path"}[topic]
        for t, raw in items:
            fed.append((t, topic, msgtype, raw))
    for t, topic, msgtype, raw in sorted(fed, key=lambda x: x[0]):
        box.add(topic, msgtype, t, raw)
    path = box.dump(tmp_path / "incident.mcap")
    assert path == tmp_path / "incident.mcap"
    with Reader(path) as reader:
        conns = {c.topic: c for c in reader.connections}
        assert conns[COMMAND].msgtype == "wamdiff_ros/msg/DrivingCommand"
        assert "uint8 LEFT=1" in conns[COMMAND].msgdef.data
    assert bags.type_hashes(path)[COMMAND] == store.hash_rihs01("wamdiff_ros/msg/DrivingCommand")
    got = _messages(path)
    end = max(t for t, *_ in fed)
    for topic, items in src.items():
        want = [(t, raw) for t, raw in items if t >= end - 3 * S] or items[-1:]
        assert got[topic] == want, topic  # same stamps, identical raw bytes
    cmd = store.deserialize_cdr(got[COMMAND][0][1], "wamdiff_ros/msg/DrivingCommand")
    assert cmd.command == 0  # LANE_FOLLOW
    assert box.dump(tmp_path).parent == tmp_path  # into a folder: a fresh timestamped name
    with pytest.raises(FileExistsError):
        box.dump(path)


def test_blackbox_dump_is_capped(tmp_path, store):
    box = BlackBox(seconds=100.0, max_bytes=10**6, max_dump_bytes=5000, store=store)
    String = store.types["std_msgs/msg/String"]
    box.add("/cmd", "std_msgs/msg/String", 0, bytes(store.serialize_cdr(String(data="left"), "std_msgs/msg/String")))
    raws = [bytes(store.serialize_cdr(String(data=f"{k:04d}" * 250), "std_msgs/msg/String")) for k in range(20)]
    for k, raw in enumerate(raws):
        box.add("/text", "std_msgs/msg/String", (k + 1) * S, raw)
    got = _messages(box.dump(tmp_path / "capped.mcap"))
    assert [raw for _, raw in got["/text"]] == raws[-4:]  # 1009 bytes each: 4 of them and the command fit in 5000
    assert len(got["/cmd"]) == 1
    assert sum(len(r) for v in got.values() for _, r in v) <= 5000


def test_blackbox_is_thread_safe(tmp_path, store):
    box = BlackBox(seconds=0.05, max_bytes=200_000, store=store)
    errors = []

    def feed(i: int) -> None:
        try:
            for k in range(2000):
                box.add(f"/t{i}", "std_msgs/msg/String", time.monotonic_ns(), _payload(k, 50 + i))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=feed, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    dumps = [box.dump(tmp_path / f"d{n}.mcap") for n in range(3)]
    for th in threads:
        th.join()
    assert not errors
    snap = box.snapshot()
    assert box.nbytes == sum(len(e.data) for _, e in snap) <= 200_000
    for d in dumps:
        for topic, items in _messages(d).items():
            assert all(raw == _payload(raw[0], len(raw)) for _, raw in items)


# ---------------------------------------------------------------------------------------------------------------
# wamdiff-replay -> wamdiff-record between two processes


def _env(k: int) -> dict[str, str]:
    env = dict(os.environ)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env["ROS_DOMAIN_ID"] = str(10 + (os.getpid() % 45) * 2 + k)  # 10-99: apart from the node tests' 100-199
    return env


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "wamdiff_ros.ros.bag_tools", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def _interrupt(proc: subprocess.Popen, seconds: float = 15.0) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.mark.ros
@pytest.mark.timeout(120)
def test_replay_to_record_round_trip(tmp_path):
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    msgs = pytest.importorskip("wamdiff_ros.msg", reason="the package's interfaces are not built (make setup)")
    from rclpy.serialization import deserialize_message

    env, out = _env(0), tmp_path / "recorded.mcap"
    rec = _start(["record", str(out), "--topics", IMAGE, ODOM, COMMAND, "--duration", "60", "--quiet"], env,
                 tmp_path / "record.log")
    try:
        time.sleep(0.5)
        play = _start(["replay", str(SAMPLE), "--rate", "2", "--wait-for-subscribers", "30", "--delay", "1",
                       "--quiet"], env, tmp_path / "replay.log")
        assert play.wait(60) == 0, (tmp_path / "replay.log").read_text()
        time.sleep(0.5)
    finally:
        rc = _interrupt(rec)
    log = (tmp_path / "record.log").read_text()
    assert rc == 0, log
    assert "recorded" in log and f"{IMAGE}: " in log
    assert "replayed 401 messages" in (tmp_path / "replay.log").read_text()

    src, got = _messages(SAMPLE), _messages(out)
    counts = {t: len(v) for t, v in got.items()}
    assert counts.get(COMMAND) == 1
    assert counts.get(ODOM, 0) >= 0.9 * 200 and counts.get(IMAGE, 0) >= 0.9 * 100, counts
    originals = [raw for _, raw in src[IMAGE]]
    recorded = [raw for _, raw in got[IMAGE]]
    positions = [originals.index(raw) for raw in recorded]  # every image payload is byte-identical to one sent
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    sent_odom = [raw for _, raw in src[ODOM]]
    positions = [sent_odom.index(raw) for _, raw in got[ODOM]]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    sent_cmd, got_cmd = src[COMMAND][0][1], got[COMMAND][0][1]
    # DDS pads a sample to a multiple of 4 bytes and notes the padding in the CDR header's options (27 -> 28 bytes)
    assert got_cmd[4:len(sent_cmd)] == sent_cmd[4:] and len(got_cmd) == (len(sent_cmd) + 3) // 4 * 4
    assert deserialize_message(got[COMMAND][0][1], msgs.DrivingCommand).command == msgs.DrivingCommand.LANE_FOLLOW
    stamps = [t for v in got.values() for t, _ in v]  # receive times: wall clock now, not the bag's 2023 stamps
    assert min(stamps) > T0_NS + 10 * S
    with Reader(out) as reader:
        qos = {c.topic: c.ext.offered_qos_profiles[0] for c in reader.connections}
    assert qos[COMMAND].durability.name == "TRANSIENT_LOCAL" and qos[IMAGE].reliability.name == "BEST_EFFORT"


@pytest.mark.ros
@pytest.mark.timeout(120)
def test_replay_loop_clock_remap_and_ctrl_c(tmp_path, store):
    pytest.importorskip("rclpy", reason="rclpy (ROS 2 wheels) not installed")
    env, out = _env(1), tmp_path / "clock.mcap"
    rec = _start(["record", str(out), "--topics", "/clock", "/odom", "--duration", "60", "--quiet"], env,
                 tmp_path / "record.log")
    play_log = tmp_path / "replay.log"
    try:
        play = _start(["replay", str(SAMPLE), "--rate", "5", "--wait-for-subscribers", "30", "--delay", "0.5",
                       "--loop", "--clock", "--quiet",
                       "--topics", ODOM, "--remap", f"{ODOM}:=/odom"], env, play_log)
        try:
            end = time.monotonic() + 30
            while "loop 1 done" not in play_log.read_text() and time.monotonic() < end:
                time.sleep(0.1)
            time.sleep(0.8)
        finally:
            assert _interrupt(play) == 0, play_log.read_text()
        time.sleep(0.3)
    finally:
        rc = _interrupt(rec)
    assert rc == 0, (tmp_path / "record.log").read_text()
    text = play_log.read_text()
    assert "loop 1 done" in text and "(interrupted)" in text

    got = _messages(out)
    assert len(got.get("/odom", [])) > 200 * 1.2  # more than one pass
    clock = [store.deserialize_cdr(raw, "rosgraph_msgs/msg/Clock").clock for _, raw in got["/clock"]]
    ns = [c.sec * S + c.nanosec for c in clock]
    assert all(T0_NS <= t <= T0_NS + 995 * S // 100 for t in ns)
    jumps = [i for i, (a, b) in enumerate(zip(ns, ns[1:])) if b < a]
    assert len(jumps) >= 1 and ns[jumps[0]] - ns[jumps[0] + 1] > 9 * S  # back to the start of the bag
    odom = "nav_msgs/msg/Odometry"
    sent_x = [store.deserialize_cdr(raw, odom).pose.pose.position.x for _, raw in _messages(SAMPLE)[ODOM]]
    got_x = [store.deserialize_cdr(raw, odom).pose.pose.position.x for _, raw in got["/odom"]]
    assert got_x[0] <= sent_x[3] and max(got_x) == sent_x[-1]  # from the bag's start to its end


def test_module_usage_without_a_command():
    assert bag_tools.main([]) == 2
    with pytest.raises(SystemExit):
        bag_tools.replay_main(["--rate", "0", str(SAMPLE)])
