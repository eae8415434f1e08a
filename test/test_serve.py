"""wamdiff-serve and its wire format: framing errors, a real server subprocess (tiny-random), newest-wins, status;
the optional route_xy, passed on to the planner as route points."""

import dataclasses
import io
import json
import socket
import struct
import threading
import time

import numpy as np
import pytest

from wamdiff_ros.carla_bridge import messages, protocol
from wamdiff_ros.carla_bridge.client import PlannerClient, RemoteError
from wamdiff_ros.carla_bridge.protocol import ErrorCode, MessageType

EGO = messages.ego_fields((5.0, 0.0), (0.2, 0.0), 5.0, (10.0, -3.0, 0.3), 12.5)


def _image(height=128, width=256):
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, size=(height, width, 3), dtype=np.uint8)


def _plan_frame(request_id, image=None, command="left", ego=EGO, **extra):
    image = _image() if image is None else image
    header, payload = messages.plan_request(image.tobytes(), image.shape[0], image.shape[1], ego, command)
    header.update(extra)
    return protocol.encode_frame(MessageType.PLAN, request_id, header, payload)


def _connect(address):
    sock = protocol.connect(address, timeout_s=5.0)
    return sock, protocol.FrameReader(sock, frame_timeout_s=30.0)


# ----------------------------------------------------------------------------------------------------------------
# The wire format


def test_frame_round_trip():
    header = {"command": "left", "ego": EGO, "nested": {"a": [1, 2.5]}}
    data = protocol.encode_frame(MessageType.PLAN, 2**40 + 7, header, b"\x00\x01\xff")
    frame = protocol.decode_frame(data)
    assert frame.msg_type is MessageType.PLAN and frame.request_id == 2**40 + 7
    assert frame.header == header and frame.payload == b"\x00\x01\xff"
    magic, version, *_ = struct.unpack_from(">4sHHQII", data)
    assert (magic, version) == (protocol.MAGIC, protocol.PROTOCOL_VERSION)


def test_reader_over_a_socket_splits_and_joins_frames():
    a, b = socket.socketpair()
    with a, b:
        frames = [protocol.encode_frame(MessageType.STATUS, i, {"i": i}, bytes(range(i))) for i in range(1, 4)]
        blob = b"".join(frames)
        a.sendall(blob[:30])  # a frame split across reads
        reader = protocol.FrameReader(b)
        with pytest.raises(protocol.ReplyTimeoutError):
            reader.next(0.05)
        a.sendall(blob[30:])
        got = [reader.next(1.0)] + reader.drain()
        assert [(f.request_id, f.header["i"], f.payload) for f in got] == [(i, i, bytes(range(i))) for i in (1, 2, 3)]
        a.close()
        with pytest.raises(protocol.ConnectionClosedError):
            reader.next(1.0)


def test_wrong_version_names_both_versions():
    data = bytearray(protocol.encode_frame(MessageType.STATUS, 1, {}))
    struct.pack_into(">H", data, 4, protocol.PROTOCOL_VERSION + 1)
    with pytest.raises(protocol.VersionMismatchError) as err:
        protocol.decode_frame(bytes(data))
    assert err.value.ours == protocol.PROTOCOL_VERSION and err.value.theirs == protocol.PROTOCOL_VERSION + 1
    assert f"version {protocol.PROTOCOL_VERSION + 1}" in str(err.value)
    assert f"version {protocol.PROTOCOL_VERSION}" in str(err.value) and err.value.field == "version"
    assert not err.value.recoverable


def test_wrong_magic_rejected():
    with pytest.raises(protocol.BadMagicError) as err:
        protocol.decode_frame(b"HTTP" + protocol.encode_frame(MessageType.STATUS, 1, {})[4:])
    assert err.value.field == "magic"


@pytest.mark.parametrize("cut, field", [(10, "fixed header"), (protocol.FIXED_HEADER_SIZE + 3, "json header"),
                                        (-5, "payload")])
def test_truncated_frames_rejected(cut, field):
    data = protocol.encode_frame(MessageType.PLAN, 9, {"command": "left"}, b"x" * 64)
    with pytest.raises(protocol.TruncatedFrameError) as err:
        protocol.decode_frame(data[:cut])
    assert err.value.field == field
    assert err.value.received < err.value.announced


def test_truncated_stream_rejected():
    a, b = socket.socketpair()
    with a, b:
        data = protocol.encode_frame(MessageType.PLAN, 9, {"command": "left"}, b"x" * 64)
        a.sendall(data[:-10])
        a.close()
        with pytest.raises(protocol.TruncatedFrameError) as err:
            protocol.FrameReader(b).next(1.0)
        assert err.value.field == "payload" and err.value.request_id == 9
        assert (err.value.announced, err.value.received) == (64, 54)


def test_stalled_frame_rejected():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(protocol.encode_frame(MessageType.STATUS, 3, {"x": 1})[:-2])
        with pytest.raises(protocol.FrameStalledError) as err:
            protocol.FrameReader(b, frame_timeout_s=0.1).next(5.0)
        assert isinstance(err.value, protocol.TruncatedFrameError) and err.value.field == "json header"


def test_oversized_frames_rejected():
    data = protocol.encode_frame(MessageType.PLAN, 1, {}, b"x" * 1000)
    with pytest.raises(protocol.FrameTooLargeError) as err:
        protocol.decode_frame(data, max_payload_bytes=999)
    assert (err.value.field, err.value.size, err.value.limit) == ("payload length", 1000, 999)
    with pytest.raises(protocol.FrameTooLargeError):
        protocol.encode_frame(MessageType.PLAN, 1, {}, b"x" * 1000, max_payload_bytes=999)
    huge_header = bytearray(data)
    struct.pack_into(">I", huge_header, 16, protocol.MAX_HEADER_BYTES + 1)
    with pytest.raises(protocol.FrameTooLargeError) as err:
        protocol.decode_frame(bytes(huge_header))
    assert err.value.field == "header length"


def test_malformed_json_and_unknown_type_are_recoverable():
    good = protocol.encode_frame(MessageType.STATUS, 5, {})
    bad_json = bytearray(protocol.encode_frame(MessageType.STATUS, 5, {"a": 1}))
    bad_json[protocol.FIXED_HEADER_SIZE] = ord("[")
    for data, cls, field in ((bytes(bad_json), protocol.MalformedMessageError, "json header"),
                             (protocol.encode_frame(77, 5, {}), protocol.UnknownMessageTypeError, "message type")):
        with pytest.raises(cls) as err:
            protocol.decode_frame(data)
        assert err.value.recoverable and err.value.request_id == 5 and err.value.field == field
    not_object = good[:protocol.FIXED_HEADER_SIZE - 8] + struct.pack(">II", 2, 0) + b"[]"
    with pytest.raises(protocol.MalformedMessageError, match="JSON object"):
        protocol.decode_frame(not_object)


def test_message_field_checks_name_the_field():
    with pytest.raises(protocol.MalformedMessageError) as err:
        messages.check_ego({"ego": dict(EGO, velocity=[1.0, float("nan")])})
    assert err.value.field == "ego.velocity"
    with pytest.raises(protocol.MalformedMessageError) as err:
        messages.check_ego({"ego": dict(EGO, pose=[1.0, 2.0])})
    assert err.value.field == "ego.pose"
    with pytest.raises(protocol.MalformedMessageError) as err:
        messages.check_command({"command": "uturn"})
    assert err.value.field == "command"
    header = {"image": {"encoding": "rgb8", "height": 4, "width": 4}}
    assert messages.check_image(header, b"\x00" * 48) == ("rgb8", 4, 4)
    with pytest.raises(protocol.MalformedMessageError) as err:
        messages.check_image(header, b"\x00" * 47)
    assert err.value.field == "payload"


def test_commands_match_the_text_format():
    from wamdiff_ros.format import Command

    assert set(protocol.COMMANDS) == {c.value for c in Command}


def test_png_encoder_round_trips_through_pil():
    from PIL import Image

    image = _image(37, 53)
    png = messages.encode_png(image.tobytes(), 37, 53)
    with Image.open(io.BytesIO(png)) as img:
        assert np.array_equal(np.asarray(img.convert("RGB")), image)


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:8799", ("tcp", ("127.0.0.1", 8799))),
    ("tcp://localhost:1", ("tcp", ("localhost", 1))),
    ("unix:///tmp/w.sock", ("unix", "/tmp/w.sock")),
    ("unix:/tmp/w.sock", ("unix", "/tmp/w.sock")),
])
def test_parse_address(text, expected):
    assert protocol.parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "localhost", "host:port", "host:70000", "unix:"])
def test_parse_address_rejects(text):
    with pytest.raises(protocol.FieldError) as err:
        protocol.parse_address(text)
    assert err.value.field == "server"


# ----------------------------------------------------------------------------------------------------------------
# A real server (subprocess, tiny-random)


@pytest.fixture(scope="module")
def server():
    from wamdiff_ros.carla_bridge.server import launch

    # random weights: their plans are drafts the plan checker would refuse (no reflection: published as drafted)
    process, address = launch(["--model", "tiny-random", "--port", "0", "--threads", "1", "--no-reflect"])
    yield address
    process.terminate()
    assert process.wait(timeout=20) == 0  # SIGTERM: clean shutdown
    process.output_thread.join(timeout=5)
    assert "wamdiff-serve: stopped" in "".join(process.output)


def _check_control(control):
    assert 0.0 <= control["throttle"] <= 1.0 and 0.0 <= control["brake"] <= 1.0 and -1.0 <= control["steer"] <= 1.0
    assert not (control["throttle"] > 0.0 and control["brake"] > 0.0)


def test_server_plans_and_controls(server):
    image = _image()
    with PlannerClient(server, timeout_s=30.0) as client:
        reply = client.plan(image.tobytes(), 128, 256, EGO, "left")
        plan = reply["plan"]
        assert plan["valid"], plan["reason"]
        assert np.asarray(plan["waypoints"]).shape == (8, 2) and len(plan["confidence"]) == 8
        assert plan["stamp"] == EGO["t"] and plan["stats"]["new_tokens"] > 0
        _check_control(reply["control"])
        assert reply["latency"]["plan_s"] > 0 and reply["latency"]["server_s"] >= reply["latency"]["plan_s"]
        later = messages.ego_fields((5.0, 0.0), (0.0, 0.0), 5.0, (10.25, -3.0, 0.3), EGO["t"] + 0.05)
        control = client.control(later)
        _check_control(control["control"])
        assert control["plan_age_s"] == pytest.approx(0.05)
        png = client.plan(image.tobytes(), 128, 256, EGO, "follow", encoding="png")
        assert png["plan"]["valid"]


def test_server_reset_drops_the_plan(server):
    with PlannerClient(server, timeout_s=30.0) as client:
        client.plan(_image().tobytes(), 128, 256, EGO, "straight")
        before = client.status()["values"]["resets"]
        assert client.reset("new route") == {"reset": True}
        reply = client.control(EGO)
        assert reply["control"]["braking"] and reply["control"]["reason"] == "brake: no plan"
        assert reply["control"]["brake"] == 1.0 and reply["plan_age_s"] is None
        assert client.status()["values"]["resets"] == before + 1


def test_malformed_frame_gets_an_error_and_the_server_goes_on(server):
    sock, reader = _connect(server)
    with sock:
        bad = bytearray(protocol.encode_frame(MessageType.PLAN, 41, {"command": "left"}))
        bad[protocol.FIXED_HEADER_SIZE] = ord("]")  # JSON broken, framing intact
        sock.sendall(bytes(bad))
        reply = reader.next(10.0)
        assert reply.msg_type is MessageType.ERROR and reply.request_id == 41
        assert reply.header["code"] == ErrorCode.BAD_FRAME.value and reply.header["field"] == "json header"
        sock.sendall(protocol.encode_frame(MessageType.PLAN, 42, {"command": "left", "ego": EGO}))  # no image
        reply = reader.next(10.0)
        assert reply.header["code"] == ErrorCode.BAD_FRAME.value and reply.header["field"] == "image"
        sock.sendall(_plan_frame(43))
        reply = reader.next(30.0)
        assert reply.msg_type is MessageType.PLAN_REPLY and reply.request_id == 43 and reply.header["plan"]["valid"]


def test_bad_magic_closes_that_connection_only(server):
    sock, reader = _connect(server)
    with sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = reader.next(10.0)
        assert reply.msg_type is MessageType.ERROR and reply.header["field"] == "magic"
        with pytest.raises(protocol.ConnectionClosedError):
            reader.next(10.0)
    with PlannerClient(server, timeout_s=10.0) as client:
        assert "values" in client.status()


def test_newest_plan_request_wins(server):
    with PlannerClient(server, timeout_s=10.0) as client:
        dropped = client.status()["values"]["dropped"]
    sock, reader = _connect(server)
    with sock:
        sock.sendall(b"".join(_plan_frame(i) for i in (1, 2, 3)))
        replies = {r.request_id: r for r in (reader.next(60.0) for _ in range(3))}
    assert sorted(replies) == [1, 2, 3]
    planned = [i for i, r in replies.items() if r.msg_type is MessageType.PLAN_REPLY]
    superseded = [i for i, r in replies.items()
                  if r.msg_type is MessageType.ERROR and r.header["code"] == ErrorCode.SUPERSEDED.value]
    assert 3 in planned and 2 in superseded  # the first may be answered; of the rest only the newest is planned
    assert sorted(planned + superseded) == [1, 2, 3]
    with PlannerClient(server, timeout_s=10.0) as client:
        assert client.status()["values"]["dropped"] == dropped + len(superseded)


def test_status_uses_the_node_counter_names(server):
    from wamdiff_ros.stats import Counters

    with PlannerClient(server, timeout_s=30.0) as client:
        before = client.status()["values"]
        client.plan(_image().tobytes(), 128, 256, EGO, "right")
        with pytest.raises(RemoteError) as err:
            client.plan(_image(16, 16).tobytes(), 16, 16, EGO, "right")  # the planner refuses images < 32 px
        assert err.value.code == ErrorCode.BAD_INPUT.value and err.value.field == "image"
        after = client.status()["values"]
    names = {f.name for f in dataclasses.fields(Counters)} - {"reasons"}
    assert names <= set(after)
    assert {"dropped", "inference_p50_ms", "inference_p99_ms", "last_inference_ms", "model", "world"} <= set(after)
    assert after["frames"] == before["frames"] + 2 and after["planned"] == before["planned"] + 1
    assert after["bad_input"] == before["bad_input"] + 1 and after["last_error"].startswith("image")
    assert after["last_inference_ms"] > 0 and after["model"] == "tiny-random" and after["world"] == "carla"
    json.dumps(after)


# ----------------------------------------------------------------------------------------------------------------
# Timeouts, on an in-process server with a stub planner (deterministic timing)


class _SlowPlanner:
    def __init__(self, seconds):
        self.seconds = seconds

    def plan(self, image, ego, command, route=None):
        from wamdiff_ros.planner import Plan

        time.sleep(self.seconds)
        waypoints = np.stack([np.arange(1, 9) * 2.5, np.zeros(8)], axis=1).astype(np.float32)
        return Plan(waypoints, np.ones(8, np.float32), valid=True)


@pytest.fixture
def stub_server(tmp_path):
    from wamdiff_ros.carla_bridge.server import PlannerServer, ServeConfig

    servers = []

    def start(seconds=0.0, unix=False, planner=None, **config):
        server = PlannerServer(planner or _SlowPlanner(seconds), ServeConfig(**config), model_name="stub")
        address = server.bind(port=0, unix=str(tmp_path / "w.sock") if unix else None)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return server, address

    yield start
    for server, thread in servers:
        server.stop()
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_request_past_its_deadline_is_not_planned(stub_server):
    server, address = stub_server(seconds=1.0)
    busy, busy_reader = _connect(address)
    with busy:
        busy.sendall(_plan_frame(1))  # holds the planner for 1 s
        time.sleep(0.3)
        with PlannerClient(address, timeout_s=5.0) as client:
            header, payload = messages.plan_request(_image().tobytes(), 128, 256, EGO, "left", deadline_s=0.1)
            with pytest.raises(RemoteError) as err:
                client.request(MessageType.PLAN, header, payload, timeout_s=5.0)
            assert err.value.code == ErrorCode.TIMEOUT.value
        assert busy_reader.next(5.0).msg_type is MessageType.PLAN_REPLY
    values = server.status_values()
    assert values["late"] == 1 and values["skipped.timeout"] == 1 and values["planned"] == 1


def test_client_timeout_then_the_stale_reply_is_skipped(stub_server):
    _, address = stub_server(seconds=0.3)
    with PlannerClient(address, timeout_s=0.1) as client:
        with pytest.raises(protocol.ReplyTimeoutError):
            client.plan(_image().tobytes(), 128, 256, EGO, "left", timeout_s=0.05)
        reply = client.control(EGO, timeout_s=5.0)  # the late plan reply arrives first and is skipped
        assert client.stale_replies == 1 and "control" in reply


def test_idle_connection_is_closed_and_unix_socket_served(stub_server):
    server, address = stub_server(unix=True, idle_timeout_s=0.3)
    assert address.startswith("unix://")
    sock, reader = _connect(address)
    with sock:
        sock.sendall(protocol.encode_frame(MessageType.STATUS, 1, {}))
        assert reader.next(5.0).header["values"]["model"] == "stub"
        with pytest.raises(protocol.ConnectionClosedError):
            reader.next(5.0)


def test_time_jump_resets_the_follower(stub_server):
    server, address = stub_server()
    with PlannerClient(address, timeout_s=5.0) as client:
        client.plan(_image().tobytes(), 128, 256, EGO, "left")
        assert client.control(dict(EGO, t=EGO["t"] + 0.05))["control"]["reason"] != "brake: no plan"
        assert client.control(dict(EGO, t=EGO["t"] - 5.0))["control"]["reason"] == "brake: no plan"
    assert server.status_values()["resets"] == 1


# ----------------------------------------------------------------------------------------------------------------
# Route points: the optional route_xy of a plan request, passed on to the planner (which decides whether to use it)


def test_route_xy_field_checks():
    assert messages.check_route_xy({}) is None and messages.check_route_xy({"route_xy": None}) is None
    assert messages.check_route_xy({"route_xy": [[1, 2], (3.5, -4.0)]}) == [[1.0, 2.0], [3.5, -4.0]]
    assert messages.check_route_xy({"route_xy": []}) == []
    too_many = [[float(i), 0.0] for i in range(messages.MAX_ROUTE_POINTS + 1)]
    assert len(messages.check_route_xy({"route_xy": too_many[:-1]})) == messages.MAX_ROUTE_POINTS
    for bad, field, match in [
        ("10,0", "route_xy", "list of"),
        ({"x": 1.0}, "route_xy", "list of"),
        (too_many, "route_xy", "at most 100 points, got 101"),
        ([[0.0, 0.0], [1.0, 2.0, 3.0]], "route_xy[1]", "expected 2 numbers"),
        ([[0.0, 0.0], 5.0], "route_xy[1]", "expected 2 numbers"),
        ([[0.0, float("nan")]], "route_xy[0]", "finite"),
        ([[0.0, 0.0], [float("inf"), 0.0]], "route_xy[1]", "finite"),
        ([[True, 0.0]], "route_xy[0]", "finite"),
        ([["1", 0.0]], "route_xy[0]", "finite"),
    ]:
        with pytest.raises(protocol.MalformedMessageError, match=match) as err:
            messages.check_route_xy({"route_xy": bad}, request_id=9)
        assert err.value.field == field and err.value.request_id == 9


def test_plan_request_carries_route_xy_only_when_given():
    image = _image(4, 4)
    header, _ = messages.plan_request(image.tobytes(), 4, 4, EGO, "left")
    assert "route_xy" not in header  # the old request, byte for byte
    header, payload = messages.plan_request(image.tobytes(), 4, 4, EGO, "left", route_xy=[(0, 0), (10, 1)])
    assert header["route_xy"] == [[0.0, 0.0], [10.0, 1.0]]
    frame = protocol.decode_frame(protocol.encode_frame(MessageType.PLAN, 1, header, payload))
    assert messages.check_route_xy(frame.header) == [[0.0, 0.0], [10.0, 1.0]]
    with pytest.raises(protocol.MalformedMessageError) as err:
        messages.plan_request(image.tobytes(), 4, 4, EGO, "left", route_xy=[[0.0, float("nan")], [1.0, 0.0]])
    assert err.value.field == "route_xy[0]"


class _RecordingPlanner(_SlowPlanner):
    """Records each ``plan`` call's keyword arguments."""

    def __init__(self):
        super().__init__(0.0)
        self.calls = []

    def plan(self, image, ego, command, **kwargs):
        self.calls.append(kwargs)
        return super().plan(image, ego, command)


STRAIGHT = [[float(x), 0.5] for x in range(-5, 46)]  # ego frame: the route 0.5 m to the left, 5 m behind to 45 ahead


def test_server_passes_route_points_to_the_planner(stub_server):
    planner = _RecordingPlanner()
    server, address = stub_server(planner=planner)
    with PlannerClient(address, timeout_s=5.0) as client:
        assert client.reset("new route") == {"reset": True}
        reply = client.plan(_image().tobytes(), 128, 256, EGO, "left", route_xy=STRAIGHT)
        assert reply["plan"]["valid"]
        client.plan(_image().tobytes(), 128, 256, EGO, "left")  # no route: planned without the points
        client.plan(_image().tobytes(), 128, 256, EGO, "left", route_xy=[[1.0, 0.0]])  # one point: the same
        values = client.status()["values"]
    assert list(planner.calls[0]) == ["route"]
    np.testing.assert_allclose(planner.calls[0]["route"], [[10.0, 0.5], [30.0, 0.5]], atol=1e-9)
    assert planner.calls[1:] == [{"route": None}, {"route": None}]
    assert values["route_used"] == 1
    assert values["planned"] == 3 and values["bad_input"] == 0


def test_server_plans_without_route_points_it_cannot_compute(stub_server):
    planner = _RecordingPlanner()
    server, address = stub_server(planner=planner)
    with PlannerClient(address, timeout_s=5.0) as client:
        reply = client.plan(_image().tobytes(), 128, 256, EGO, "left", route_xy=[[3.0, 1.0]] * 4)  # zero length
        assert reply["plan"]["valid"]
        values = client.status()["values"]
    assert planner.calls == [{"route": None}]
    assert values["planned"] == 1 and values["bad_input"] == 1 and values["route_used"] == 0
    assert values["last_error"].startswith("route_xy: route path: has zero length")


def test_server_refuses_a_malformed_route_xy(stub_server):
    planner = _RecordingPlanner()
    _, address = stub_server(planner=planner)
    with PlannerClient(address, timeout_s=5.0) as client:
        header, payload = messages.plan_request(_image().tobytes(), 128, 256, EGO, "left")
        header["route_xy"] = [[0.0, 0.0], [1.0]]
        with pytest.raises(RemoteError) as err:
            client.request(MessageType.PLAN, header, payload)
        assert err.value.code == ErrorCode.BAD_FRAME.value and err.value.field == "route_xy[1]"
        assert client.status()["values"]["bad_input"] == 1
    assert planner.calls == []


def _recorded(monkeypatch, planner):
    calls = []
    real = planner.plan

    def record(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan", record)
    return calls


def test_real_planners_route_points_end_to_end(stub_server, monkeypatch, tmp_path):
    """Both planners get ``route=``; the prompt of a model without route points (route_points false) has no route
    line, a tiny checkpoint with ``route_points: true`` in its wamdiff.json carries it."""
    from wamdiff_ros import format as fmt
    from wamdiff_ros.decoding.settings import DecodeSettings
    from wamdiff_ros.model import DecodeMeta, load, tiny_random
    from wamdiff_ros.planner import Planner
    from wamdiff_training.checkpoint import save_checkpoint

    plain = Planner(tiny_random(seed=3, meta=DecodeMeta(trained_block_size=8, route_points=False), hidden=64,
                                layers=2), DecodeSettings(block_size=8, steps=4, schedule="static"))
    plain_calls = _recorded(monkeypatch, plain)
    bundle = tiny_random(seed=3, meta=DecodeMeta(trained_block_size=8, route_points=True), hidden=64, layers=2)
    folder = save_checkpoint(bundle, tmp_path / "ckpt")
    assert json.loads((folder / "wamdiff.json").read_text())["route_points"] is True
    route_model = Planner(load(str(folder)), DecodeSettings(block_size=8, steps=4, schedule="static"))
    route_calls = _recorded(monkeypatch, route_model)
    prompts = []
    real_prompt = fmt.plan_prompt
    monkeypatch.setattr(fmt, "plan_prompt", lambda *a, **k: prompts.append(real_prompt(*a, **k)) or prompts[-1])
    for planner in (plain, route_model):
        _, address = stub_server(planner=planner)
        with PlannerClient(address, timeout_s=120.0) as client:
            reply = client.plan(_image().tobytes(), 128, 256, EGO, "left", route_xy=STRAIGHT)
            assert np.asarray(reply["plan"]["waypoints"]).shape == (8, 2)
    assert list(plain_calls[0]) == ["route"]
    assert list(route_calls[0]) == ["route"]
    np.testing.assert_allclose(route_calls[0]["route"], [[10.0, 0.5], [30.0, 0.5]], atol=1e-9)
    assert not fmt.has_route_line(prompts[0])
    assert fmt.has_route_line(prompts[1]) and "(010.00,000.50) and (030.00,000.50)" in prompts[1]


# ----------------------------------------------------------------------------------------------------------------
# A frozen camera (Bench2Drive-Robust's cached frame drop: the same image under new stamps), repeated_frame_check on


def test_repeated_image_is_held_then_brakes_and_a_new_image_is_planned(stub_server):
    planner = _RecordingPlanner()
    server, address = stub_server(planner=planner, repeated_frame_check=True, max_plan_age_s=0.5)
    frozen, t0 = _image(), EGO["t"]
    with PlannerClient(address, timeout_s=5.0) as client:
        first = client.plan(frozen.tobytes(), 128, 256, EGO, "left")
        x, y, h = EGO["pose"]
        moved = dict(EGO, t=t0 + 0.2, pose=[x + np.cos(h), y + np.sin(h), h])  # 1 m on, as the plan drives
        held = client.plan(frozen.tobytes(), 128, 256, moved, "left")["plan"]
        assert held["valid"] and held["held"] and "0.20 s before" in held["reason"]
        # the plan (2.5 m per 0.5 s) re-timed 0.2 s on and seen from 1 m further: where it was
        np.testing.assert_allclose(held["waypoints"], first["plan"]["waypoints"], atol=0.01)
        assert client.control(dict(moved, t=t0 + 0.25))["control"]["reason"] != "brake: no plan"
        late = client.plan(frozen.tobytes(), 128, 256, dict(moved, t=t0 + 0.7), "left")["plan"]
        assert not late["valid"] and "0.70 s old" in late["reason"]
        assert client.control(dict(moved, t=t0 + 0.75))["control"]["brake"] > 0.0
        fresh = client.plan(_image()[::-1].copy().tobytes(), 128, 256, dict(moved, t=t0 + 0.8), "left")["plan"]
        assert fresh["valid"] and "held" not in fresh
        still = dict(moved, t=t0 + 0.9, speed=0.0, velocity=[0.0, 0.0])  # a repeat at rest is planned (a still scene)
        assert "held" not in client.plan(_image()[::-1].copy().tobytes(), 128, 256, still, "left")["plan"]
        values = client.status()["values"]
    assert len(planner.calls) == 3
    assert (values["repeated_frames"], values["held"], values["fallback"], values["planned"]) == (2, 1, 1, 3)


def test_repeated_image_is_planned_again_with_the_check_off(stub_server):
    planner = _RecordingPlanner()
    _, address = stub_server(planner=planner)
    with PlannerClient(address, timeout_s=5.0) as client:
        for k in range(3):
            assert "held" not in client.plan(_image().tobytes(), 128, 256, dict(EGO, t=EGO["t"] + 0.2 * k), "left")["plan"]
    assert len(planner.calls) == 3


def test_actuation_delay_reaches_the_follower_and_is_checked():
    from wamdiff_ros.carla_bridge.server import PlannerServer, ServeConfig
    from wamdiff_ros.control import FollowerGains
    from wamdiff_ros.errors import FieldError

    assert PlannerServer(_SlowPlanner(0.0), ServeConfig()).gains == FollowerGains.for_world("carla")
    delayed = PlannerServer(_SlowPlanner(0.0), ServeConfig(actuation_delay_s=0.1)).gains
    assert delayed.actuation_delay_s == 0.1 and delayed.wheelbase_m == FollowerGains.for_world("carla").wheelbase_m
    for bad in (-0.05, 5.0):
        with pytest.raises(FieldError, match="actuation_delay_s"):
            ServeConfig(actuation_delay_s=bad)
