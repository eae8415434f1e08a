"""``wamdiff-bench <benchmark> [args]``: decode (more benchmarks join as the package grows)."""

from __future__ import annotations

import sys

BENCHMARKS = ("decode",)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: wamdiff-bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    from wamdiff_ros.bench import decode

    return decode.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
