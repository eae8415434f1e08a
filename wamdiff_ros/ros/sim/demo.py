"""``wamdiff-demo``: the whole ROS path on one machine. Starts the planner node (simulated time), replays the sample
drive bag into it with ``/clock``, records the node's outputs to MCAP, and draws every plan on its camera frame with
the latest boxes and scene description: a PNG strip, an animated GIF and a latency summary. Then (unless
``--no-drive``) the same model drives one episode of the CPU world's highway scenario through real topics
(``wamdiff-closed-loop-ros``) and the demo prints its Bench2Drive driving score, next to the model's measured
closed-loop score when its folder holds ``eval_summary.json``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

from wamdiff_ros.model_names import DEFAULT_MODEL, MODEL_HELP, TINY_RANDOM, is_model, resolve
from wamdiff_ros.ros.sim.processes import python_module, ros_environment, share_file, shut_down

NODE = "/wamdiff_planner"
OUTPUT_TOPICS = (f"{NODE}/output/plan", f"{NODE}/output/path", "/diagnostics", f"{NODE}/output/boxes",
                 f"{NODE}/output/description")
ROUTE_TOPIC = "/route/path"  # the bag's route, where the highway bridge publishes it: the node plans with it
DRIVE_SCENARIO = "highway"
EVAL_SUMMARY = "eval_summary.json"  # the model's measured closed-loop score, written when the model is exported


def _wait_until_recording(log: Path, topics: tuple[str, ...], record: subprocess.Popen, timeout_s: float) -> bool:
    """Whether the recorder, writing ``log``, subscribed to every one of ``topics`` within ``timeout_s``. It subscribes
    to a topic once the topic's publisher is up, so the node's first plans are recorded only if the replay waits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and record.poll() is None:
        text = log.read_text(errors="replace") if log.is_file() else ""
        if all(f"recording {topic} (" in text for topic in topics):
            return True
        time.sleep(0.1)
    return False


def run(bag: Path, out: Path, node_args: list[str], settle_s: float, ready_timeout_s: float = 120.0) -> int:
    env = ros_environment()
    out.mkdir(parents=True, exist_ok=True)
    recording = out / "outputs.mcap"
    recording.unlink(missing_ok=True)
    logs = {name: open(out / f"{name}.log", "w") for name in ("node", "record", "replay")}
    node = subprocess.Popen(
        python_module("wamdiff_ros.ros.node", "--autostart", "--ros-args", "--params-file",
                      str(share_file("planner.yaml")), "-p", "use_sim_time:=true", "-p", "blackbox_dir:=none",
                      "-r", f"~/input/route:={ROUTE_TOPIC}", *node_args),
        env=env, stdout=logs["node"], stderr=subprocess.STDOUT)
    record = subprocess.Popen(python_module("wamdiff_ros.ros.bag_tools", "record", str(recording), "--topics",
                                            *OUTPUT_TOPICS), env=env, stdout=logs["record"], stderr=subprocess.STDOUT)
    try:
        print(f"node and recorder starting (logs in {out})", flush=True)
        if not _wait_until_recording(out / "record.log", OUTPUT_TOPICS, record, ready_timeout_s):
            print(f"the recorder did not see the node's outputs within {ready_timeout_s:.0f} s, see "
                  f"{out / 'node.log'} and {out / 'record.log'}", file=sys.stderr)
            return 1
        replay = subprocess.run(
            python_module("wamdiff_ros.ros.bag_tools", "replay", str(bag), "--clock", "--wait-for-subscribers", "60",
                          "--delay", "1"),
            env=env, stdout=logs["replay"], stderr=subprocess.STDOUT, timeout=600)
        if replay.returncode != 0:
            print(f"replay failed, see {out / 'replay.log'}", file=sys.stderr)
            return 1
        time.sleep(settle_s)  # the last plans
    finally:
        shut_down([record, node], logs)
    if not recording.is_file():
        print(f"no recording written, see {out / 'record.log'}", file=sys.stderr)
        return 1
    return report(bag, recording, out)


def report(bag: Path, recording: Path, out: Path) -> int:
    from diagnostic_msgs.msg import DiagnosticArray
    from PIL import Image as PILImage
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import Image

    from wamdiff_ros.draw import draw_plan
    from wamdiff_ros.msg import Detection2DArray, PlannerOutput, SceneDescription
    from wamdiff_ros.ros.bags import read_messages
    from wamdiff_ros.ros.conversions import image_to_rgb, stamp_to_sec
    from wamdiff_ros.world.camera import CameraConfig

    camera = CameraConfig().camera_model()  # the sample drive's camera: the CPU world's, as in the training data

    frames = {}
    for conn, _, raw in read_messages(bag, [f"{NODE}/input/image"]):
        msg = deserialize_message(bytes(raw), Image)
        frames[round(stamp_to_sec(msg.header.stamp), 6)] = image_to_rgb(msg)
    plans, diagnostics, detections, descriptions = [], None, [], []
    kinds = {OUTPUT_TOPICS[0]: PlannerOutput, OUTPUT_TOPICS[2]: DiagnosticArray, OUTPUT_TOPICS[3]: Detection2DArray,
             OUTPUT_TOPICS[4]: SceneDescription}
    for conn, _, raw in read_messages(recording, list(kinds)):
        msg = deserialize_message(bytes(raw), kinds[conn.topic])
        if conn.topic == OUTPUT_TOPICS[2]:
            diagnostics = msg
        else:
            lists = {OUTPUT_TOPICS[0]: plans, OUTPUT_TOPICS[3]: detections, OUTPUT_TOPICS[4]: descriptions}
            lists[conn.topic].append(msg)
    drawn = []
    for plan in plans:
        t = stamp_to_sec(plan.header.stamp)
        image = frames.get(round(t, 6))
        if image is None:
            continue
        wp = np.array([[p.pose.position.x, p.pose.position.y] for p in plan.waypoints_base_link], np.float32)
        boxes, seen = _latest(detections, t), _latest(descriptions, t)
        label = (f"t={t - min(frames):5.2f}s  B={plan.block_size}  {plan.forward_calls} fwd  decode "
                 f"{plan.decode_ms:.0f} ms  " + ("FALLBACK " + plan.reason if plan.fallback else
                                                 "anytime" if plan.anytime else "valid" if plan.valid else plan.reason))
        if plan.edited:
            label += f"  repaired {len(plan.edited_waypoints)} (ringed)"
        if plan.implausible and not plan.fallback:
            label += "  implausible"
        label += "\n" + (seen.text if seen is not None else "(no description yet)")
        drawn.append(draw_plan(image, wp, _boxes(boxes), confidence=np.array(plan.waypoint_confidence), text=label,
                               camera=camera, marked=list(plan.edited_waypoints)))
    if not drawn:
        print(f"no plan matched a camera frame ({len(plans)} plans recorded)", file=sys.stderr)
        return 1
    picks = [drawn[i] for i in np.linspace(0, len(drawn) - 1, min(6, len(drawn))).round().astype(int)]
    w, h = picks[0].size
    strip = PILImage.new("RGB", (w, h * len(picks)))
    for i, im in enumerate(picks):
        strip.paste(im, (0, i * h))
    strip.save(out / "demo_strip.png", optimize=True)
    drawn[0].save(out / "demo.gif", save_all=True, append_images=drawn[1:], duration=100, loop=0)
    values = {kv.key: kv.value for kv in diagnostics.status[0].values} if diagnostics else {}
    fallbacks = sum(p.fallback for p in plans)
    print(f"{len(frames)} camera frames replayed, {len(plans)} plans recorded ({fallbacks} fallbacks), "
          f"{len(drawn)} drawn; {len(detections)} detections ({sum(len(d.detections) for d in detections)} boxes), "
          f"{len(descriptions)} descriptions")
    print(stepped_back_line(plans))
    if descriptions:
        print(f"last description: {descriptions[-1].text!r}")
    if values:
        print(f"node (its last diagnostics before the bag ended): frames {values.get('frames')}, "
              f"planned {values.get('planned')}, dropped (newer frame won) "
              f"{values.get('dropped')}, skipped {values.get('skipped')}")
        print(f"latency: inference p50 {values.get('inference_p50_ms')} ms; frame->plan p50 "
              f"{values.get('frame_to_plan_p50_ms')} / p99 {values.get('frame_to_plan_p99_ms')} ms (sim time); "
              f"ROS overhead p50 {values.get('ros_overhead_p50_ms')} ms")
    print(f"wrote {out / 'demo_strip.png'}, {out / 'demo.gif'}, {recording}")
    return 0


def stepped_back_line(plans: list) -> str:
    """How many of the recorded plans stepped back in x (> 0.5 m between consecutive waypoints) as the block decoder
    drafted them and as published, after reflection."""
    from wamdiff_ros.plan_check import steps_back

    valid = [p for p in plans if p.valid and not p.fallback]
    after = sum(steps_back(np.array([[q.pose.position.x, q.pose.position.y] for q in p.waypoints_base_link]))
                for p in valid)
    drafted = sum(bool(p.draft_stepped_back) for p in valid)
    return (f"plans stepping back in x (> 0.5 m): {drafted} of {len(valid)} as drafted, {after} after reflection "
            f"({sum(bool(p.edited) for p in valid)} repaired, {sum(bool(p.implausible) for p in valid)} still "
            "implausible)")


def _latest(messages: list, t: float):
    """The newest of ``messages`` (stamped outputs) made from a frame at or before ``t``, or None."""
    from wamdiff_ros.ros.conversions import stamp_to_sec

    before = [m for m in messages if stamp_to_sec(m.header.stamp) <= t + 1e-6]
    return max(before, key=lambda m: stamp_to_sec(m.header.stamp), default=None)


def _boxes(detections) -> list:
    """A Detection2DArray's pixel boxes back on the model's 0-1000 grid (what ``draw_plan`` takes)."""
    from wamdiff_ros import format as fmt

    if detections is None or not detections.image_width or not detections.image_height:
        return []
    sx, sy = fmt.BOX_GRID / detections.image_width, fmt.BOX_GRID / detections.image_height
    out = []
    for d in detections.detections:
        b, hyp = d.bbox, d.results[0] if d.results else None
        out.append(fmt.Box(hyp.class_id if hyp else "", (b.center_x - b.size_x / 2) * sx,
                           (b.center_y - b.size_y / 2) * sy, (b.center_x + b.size_x / 2) * sx,
                           (b.center_y + b.size_y / 2) * sy, hyp.score if hyp else 1.0))
    return out


def drive(model: str, out: Path, seconds: float) -> int:
    """One closed-loop episode through the planner node and the highway bridge; prints its driving score."""
    from wamdiff_ros.ros.sim import closed_loop

    argv = ["--scenario", DRIVE_SCENARIO, "--episodes", "1", "--model", model, "--out", str(out), "--timeout", "1800"]
    code = closed_loop.main(argv + (["--seconds", str(seconds)] if seconds > 0 else []))
    results = out / "results.json"
    if not results.is_file():
        return code or 1
    episodes = json.loads(results.read_text())["episodes"]
    for e in episodes:
        print(f"closed-loop drive ({DRIVE_SCENARIO}, seed {e['seed']}): {e['end_reason']} after {e['sim_s']:.1f} s, "
              f"Bench2Drive driving score {e['driving_score']:.1f} (route completion {e['route_completion']:.1f} %, "
              f"infraction penalty {e['infraction_penalty']:.2f})")
    return code


def measured_score(model: str) -> str | None:
    """The line on the model's measured closed-loop score from its folder's eval_summary.json; None without one."""
    if model == TINY_RANDOM:
        return None
    path = Path(resolve(model)) / EVAL_SUMMARY
    if not path.is_file():
        return None
    try:
        s = json.loads(path.read_text())
        lo, hi = s["ci90"]
        return (f"{model}: measured closed-loop driving score {float(s['driving_score']):.1f} (90 % CI {float(lo):.1f}"
                f"-{float(hi):.1f}, {int(s['episodes'])} episodes, {s['mode']} mode; {s['source']})")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{path}: not a readable score summary ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-demo", description=__doc__.splitlines()[0])
    p.add_argument("--bag", default=str(resources.files("wamdiff_ros") / "assets" / "sample_drive.mcap"))
    p.add_argument("--out", default="out/demo")
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--settle", type=float, default=3.0, help="seconds to wait for the last plans")
    p.add_argument("--no-drive", action="store_true", help="only the bag replay, no closed-loop episode after it")
    p.add_argument("--drive-seconds", type=float, default=0.0,
                   help="cut the closed-loop episode after this much sim time (0 = the whole episode)")
    p.add_argument("--closed-loop", metavar="SCENARIO", default=None,
                   help="instead of the bag: drive one episode of a CPU-world scenario (highway, merge, roundabout, "
                        "intersection) through real topics (the highway-env bridge + the node)")
    args = p.parse_args(argv)
    if not is_model(args.model):
        p.error(f"--model {args.model}: no such model; expected a {MODEL_HELP}")
    from wamdiff_ros.ros.sim import closed_loop

    if args.closed_loop:
        return closed_loop.main(["--scenario", args.closed_loop, "--episodes", "1", "--model", args.model,
                                     "--out", args.out])
    node_args = ["-p", f"model:={args.model}"]
    if args.model == TINY_RANDOM:  # random weights: the fast decode; a trained model keeps the node's defaults
        node_args += [x for param in closed_loop.TINY_NODE_PARAMS for x in ("-p", param)]
    out = Path(args.out)
    code = run(Path(args.bag), out, node_args, args.settle)
    if code != 0:
        return code
    if not args.no_drive:
        code = drive(args.model, out / "closed_loop", args.drive_seconds)
    line = measured_score(args.model)
    if line:
        print(line)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
