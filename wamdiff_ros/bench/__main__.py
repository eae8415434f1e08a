"""``wamdiff-bench <benchmark> [args]``: decode, plan, node, render, serve, gpu; ``fixture`` writes checkpoint folders in
real layouts."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("decode", "plan", "node", "render", "serve", "gpu", "fixture")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: wamdiff-bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    # Imported on demand: the node benchmark must set its ROS environment before rclpy loads, and needs no torch.
    bench = importlib.import_module(f"wamdiff_ros.bench.{argv[0]}")
    return bench.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
