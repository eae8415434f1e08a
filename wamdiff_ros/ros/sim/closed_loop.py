"""``wamdiff-closed-loop-ros``: the planner node and the highway bridge over ROS 2, without ``ros2 launch``.

What closed_loop.launch.py starts, as two processes on simulated time: one or more episodes or a fixed span of sim
time; prints the Bench2Drive score of every episode. Logs and ``results.json`` go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from wamdiff_ros.model_names import DEFAULT_MODEL, MODEL_HELP, TINY_RANDOM
from wamdiff_ros.world.perturb import parse_perturbations
from wamdiff_ros.ros.sim.processes import python_module, ros_environment, share_file, shut_down

NODE = "/wamdiff_planner"
DEFAULT_DOMAIN_ID = "230"  # apart from the tests' and the demo's domains (Fast DDS accepts 0-232)
# The demo's decode settings for the embedded tiny model: a plan in ~0.1 s on one core. No reflection: nearly every
# plan of random weights fails the plan checker, and repairing noise only costs forwards.
TINY_NODE_PARAMS = ("block_size:=32", "steps:=4", "schedule:=static", "reflect:=false")


def planner_command(model: str, node_params: list[str]) -> list[str]:
    """The planner node on the bridge's topics, on sim time, reading images reliably (the bridge waits for plans)."""
    remaps = {"image": "/camera/front/image_raw", "camera_info": "/camera/front/camera_info",
              "odometry": "/odom", "command": "/route/command", "route": "/route/path"}
    args = ["-p", "use_sim_time:=true", "-p", "blackbox_dir:=none", "-p", "image_reliability:=reliable",
            "-p", f"model:={model}"]
    for param in node_params:
        args += ["-p", param]
    for name, topic in remaps.items():
        args += ["-r", f"{NODE}/input/{name}:={topic}"]
    return python_module("wamdiff_ros.ros.node", "--autostart", "--ros-args", "--params-file",
                   str(share_file("planner.yaml")), *args)


def bridge_command(args: argparse.Namespace, results: Path) -> list[str]:
    params = {"scenario": args.scenario, "seed": args.seed, "episodes": args.episodes, "max_sim_s": float(args.seconds),
              "sync": str(args.sync).lower(), "sync_timeout_s": float(args.sync_timeout),
              "real_time_factor": float(args.real_time_factor), "camera_hz": float(args.camera_hz),
              "results_json": str(results), "exit_when_done": "true", "use_sim_time": "true",
              "perturb": f'"{args.perturb}"', "compensate_delay": str(args.compensate_delay).lower()}
    flat = [x for k, val in params.items() for x in ("-p", f"{k}:={val}")]
    return python_module("wamdiff_ros.ros.bridge.highway", "--ros-args", "--params-file",
                   str(share_file("highway_bridge.yaml")), *flat)


def summary(results: dict) -> str:
    lines = [f"{'episode':>7} {'seed':>8} {'end':>16} {'sim s':>6} {'driven m':>8} {'RC %':>6} {'penalty':>7} "
             f"{'DS':>6} {'plans':>5}"]
    for i, e in enumerate(results["episodes"], 1):
        lines.append(f"{i:>7} {e['seed']:>8} {e['end_reason']:>16} {e['sim_s']:>6.1f} {e['distance_m']:>8.1f} "
                     f"{e['route_completion']:>6.1f} {e['infraction_penalty']:>7.2f} {e['driving_score']:>6.1f} "
                     f"{e['plans_applied']:>5}")
    t = results["totals"]
    n = max(len(results["episodes"]), 1)
    ds = sum(e["driving_score"] for e in results["episodes"]) / n
    perturbed = f", perturbed: {results['perturb']}" if results.get("perturb", "clean") != "clean" else ""
    lines.append(f"driving score {ds:.1f} (mean of {len(results['episodes'])} episodes, {results['scenario']}, "
                 f"{results['mode']}{perturbed}); {t['sim_s']:.1f} s simulated in {t['wall_s']:.1f} s wall, {t['frames']} frames, "
                 f"{t['plans_applied']} plans applied, {t['sync_timeouts']} sync timeouts, {t['distance_m']:.0f} m "
                 "driven")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("ROS_DOMAIN_ID", DEFAULT_DOMAIN_ID)
    env = ros_environment()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json"
    results.unlink(missing_ok=True)
    node_params = args.node_param if args.node_param is not None else \
        (list(TINY_NODE_PARAMS) if args.model == TINY_RANDOM else [])
    logs = {name: open(out / f"{name}.log", "w") for name in ("node", "bridge")}
    node = subprocess.Popen(planner_command(args.model, node_params), env=env, stdout=logs["node"],
                            stderr=subprocess.STDOUT)
    bridge = subprocess.Popen(bridge_command(args, results), env=env, stdout=logs["bridge"],
                              stderr=subprocess.STDOUT)
    print(f"planner node and highway bridge running (ROS_DOMAIN_ID {env['ROS_DOMAIN_ID']}, logs in {out})",
          flush=True)
    start = time.monotonic()
    try:
        code = bridge.wait(args.timeout)
    except subprocess.TimeoutExpired:
        print(f"the bridge did not finish within {args.timeout:.0f} s", file=sys.stderr)
        code = 1
    finally:
        shut_down([bridge, node], logs)
    if not results.is_file():
        print(f"no results written (bridge exit {code}), see {out / 'bridge.log'}", file=sys.stderr)
        return 1
    data = json.loads(results.read_text())
    print(summary(data))
    print(f"wrote {results} ({time.monotonic() - start:.1f} s including start-up)")
    return 0 if code == 0 and data["episodes"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-closed-loop-ros", description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="highway", help="highway | merge | roundabout | intersection")
    p.add_argument("--seed", type=int, default=1_000_000, help="first seed (default: the held-out split)")
    p.add_argument("--episodes", type=int, default=1, help="episodes to run (0 = until --seconds)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after this much sim time (0 = no limit)")
    p.add_argument("--camera-hz", type=float, default=10.0)
    p.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True,
                   help="wait for each frame's plan (default) or run free")
    p.add_argument("--sync-timeout", type=float, default=2.0, help="wall seconds to wait for a frame's plan")
    p.add_argument("--real-time-factor", type=float, default=None,
                   help="pace the world: sim s per wall s, 0 = as fast as allowed (default: 0 with --sync, 1 without)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    p.add_argument("--node-param", action="append", metavar="NAME:=VALUE",
                   help="a planner node parameter (repeatable; default for tiny-random: the demo's fast decode)")
    p.add_argument("--perturb", default="", metavar="NAME[=SEVERITY],...",
                   help="deployment perturbations the bridge applies (frame_drop, occlusion, gnss, speed, latency; "
                        "wamdiff_ros/world/perturb.py)")
    p.add_argument("--compensate-delay", action="store_true",
                   help="the bridge's follower compensates the latency perturbation's actuation delay")
    p.add_argument("--out", default="out/closed_loop_ros")
    p.add_argument("--timeout", type=float, default=3600.0, help="wall seconds before giving up")
    args = p.parse_args(argv)
    if args.real_time_factor is None:
        args.real_time_factor = 0.0 if args.sync else 1.0
    if args.episodes == 0 and args.seconds <= 0:
        p.error("--episodes 0 needs --seconds")
    try:
        parse_perturbations(args.perturb)
    except ValueError as exc:
        p.error(str(exc))
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
