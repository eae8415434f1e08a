"""Serve benchmark: a plan through ``wamdiff-serve`` (the thin CARLA agent's path) against the same plan called in
process, side by side in one run.

One process holds one ``Planner`` (the packaged model by default) and a ``PlannerServer`` around it on a loopback
socket (TCP, or a Unix socket with ``--unix``); a ``PlannerClient`` sends plan requests with a rendered camera frame,
as raw RGB and as PNG (encoded by the client, as the thin agent does), and follower-only control requests. The contenders alternate per round (direct
``Planner.plan``, then a raw request, then a PNG request) on the same frame and ego state, so drift in the machine's
load hits all of them. Reported: p50 / p90 ms of each, the ratio of the round trip to the direct plan, the protocol's
own share (round trip minus the server's timed ``plan_s``) and a control request's round trip.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

from wamdiff_ros.carla_bridge import messages
from wamdiff_ros.carla_bridge.client import PlannerClient
from wamdiff_ros.carla_bridge.server import PlannerServer, ServeConfig
from wamdiff_ros.model_names import DEFAULT_MODEL

EGO = messages.ego_fields((8.0, 0.0), (0.0, 0.0), 8.0, (0.0, 0.0, 0.0), 0.0)
ROUTE_XY = [[float(x), 0.0] for x in range(-5, 46)]  # straight ahead, ego frame: what the thin agent sends


def _frame() -> np.ndarray:
    from wamdiff_ros.cli import load_rgb, sample_image_path

    return load_rgb(sample_image_path())


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def run(model: str, rounds: int, warmup: int, unix: str | None = None, threads: int | None = None) -> dict:
    import torch

    from wamdiff_ros.planner import EgoState, Planner

    if threads:
        torch.set_num_threads(threads)
    planner = Planner.from_pretrained(model)
    image = _frame()
    server = PlannerServer(planner, ServeConfig(world="carla"), model_name=model)
    address = server.bind(port=0, unix=unix)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    times: dict[str, list[float]] = {"direct": [], "rgb8": [], "png": [], "control": []}
    protocol: dict[str, list[float]] = {"rgb8": [], "png": []}
    from wamdiff_ros.route_points import route_points_ahead

    ego_state = EgoState((8.0, 0.0), (0.0, 0.0))
    route = route_points_ahead(ROUTE_XY, (0.0, 0.0), 0.0)  # what the server makes of ROUTE_XY
    try:
        with PlannerClient(address, timeout_s=60.0) as client:
            client.reset("benchmark")
            for k in range(warmup + rounds):
                ego = dict(EGO, t=0.05 * k)
                t0 = time.perf_counter()
                planner.plan(image, ego_state, "follow", route=route)
                direct = time.perf_counter() - t0
                got = {}
                for encoding in ("rgb8", "png"):  # png: the client encodes it, as the thin agent does
                    t0 = time.perf_counter()
                    reply = client.plan(image.tobytes(), image.shape[0], image.shape[1], ego, "follow", encoding,
                                        route_xy=ROUTE_XY)
                    got[encoding] = (time.perf_counter() - t0, reply["latency"]["plan_s"])
                t0 = time.perf_counter()
                client.control(dict(ego, t=0.05 * k + 0.025))
                control = time.perf_counter() - t0
                if k < warmup:
                    continue
                times["direct"].append(direct)
                times["control"].append(control)
                for encoding, (total, plan_s) in got.items():
                    times[encoding].append(total)
                    protocol[encoding].append(total - plan_s)
    finally:
        server.stop()
        thread.join(timeout=10)
    direct_p50 = statistics.median(times["direct"])
    return {
        "model": model, "rounds": rounds, "transport": "unix" if unix else "tcp", "threads": threads,
        "image": list(image.shape),
        "ms": {name: {"p50": _pct(v, 50), "p90": _pct(v, 90)} for name, v in times.items()},
        "protocol_ms_p50": {name: _pct(v, 50) for name, v in protocol.items()},
        "round_trip_over_direct": {name: statistics.median(times[name]) / direct_p50 for name in ("rgb8", "png")},
    }


def table(result: dict) -> str:
    ms = result["ms"]
    lines = [f"wamdiff-serve round trip against Planner.plan in process ({result['model']}, {result['rounds']} rounds, "
             f"{result['transport']}, image {result['image'][1]}x{result['image'][0]})", "",
             "| contender | p50 ms | p90 ms | / direct (p50) | protocol p50 ms |", "|---|---:|---:|---:|---:|"]
    for name, label in (("direct", "Planner.plan (in process)"), ("rgb8", "wamdiff-serve, raw RGB"),
                        ("png", "wamdiff-serve, PNG"), ("control", "wamdiff-serve, control only")):
        ratio = result["round_trip_over_direct"].get(name)
        proto = result["protocol_ms_p50"].get(name)
        lines.append(f"| {label} | {ms[name]['p50']:.1f} | {ms[name]['p90']:.1f} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {'-' if proto is None else f'{proto:.2f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wamdiff-bench serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--rounds", type=int, default=30, help="timed rounds (each: direct, raw, PNG, control)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--unix", default=None, metavar="PATH", help="serve on this Unix socket instead of TCP")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        p.error("--rounds must be >= 1 and --warmup >= 0")
    result = run(args.model, args.rounds, args.warmup, args.unix, args.threads)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
