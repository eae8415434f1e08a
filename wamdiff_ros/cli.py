"""Console entry points (argparse only; the work happens in the planner)."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.attention import CHOICES as ATTENTION_CHOICES
from wamdiff_ros.decoding.settings import IMPLAUSIBLE_ACTIONS, DecodeSettings
from wamdiff_ros.decoding.unmask import SCHEDULES
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.model_names import DEFAULT_MODEL, DTYPE_NAMES, MODEL_HELP

SAMPLE_IMAGE = "sample_front.png"


def sample_image_path() -> Path:
    return Path(str(resources.files("wamdiff_ros") / "assets" / SAMPLE_IMAGE))


def load_rgb(path: str | Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def add_decode_settings_args(parser: argparse.ArgumentParser) -> None:
    """The decode settings' flags; ``decode_overrides`` turns them into ``Planner.from_pretrained`` keywords."""
    parser.add_argument("--block-size", type=int, default=None, help="B (default: the checkpoint's, at most 32)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps per block, at most (default 32)")
    parser.add_argument("--threshold", type=float, default=None, help="confidence threshold (default "
                        f"{DecodeSettings().threshold:g})")
    parser.add_argument("--schedule", choices=SCHEDULES, default=None)
    parser.add_argument("--no-constraint", action="store_true", help="do not constrain the plan to its grammar")
    parser.add_argument("--attention", choices=ATTENTION_CHOICES, default=None,
                        help="decode attention (default auto: FlashInfer where it can run, else SDPA)")
    parser.add_argument("--no-cuda-graph", action="store_true", help="on a GPU, run the decode steps eagerly")
    parser.add_argument("--strict-attention", action="store_true",
                        help="a requested attention backend that cannot run is an error, not a fallback to SDPA")
    parser.add_argument("--no-reflect", action="store_true",
                        help="publish block-decoded plans as drafted (no repair of waypoints failing the plan checker)")
    parser.add_argument("--reflect-rounds", type=int, default=None,
                        help=f"reflection rounds per plan, at most (default {DecodeSettings().reflect_rounds})")
    parser.add_argument("--implausible-action", choices=IMPLAUSIBLE_ACTIONS, default=None,
                        help="a plan reflection could not repair: publish it flagged, or the fallback (default "
                             f"{DecodeSettings().implausible_action}; unreflected plans are only flagged)")


def decode_overrides(args: argparse.Namespace) -> dict:
    """The decode settings given on the command line (``add_decode_settings_args``) as ``Planner.from_pretrained``
    keywords; the rest take the package defaults."""
    out = {k: v for k in ("block_size", "steps", "threshold", "schedule") if (v := getattr(args, k)) is not None}
    if args.no_constraint:
        out["constrain"] = False
    if args.attention is not None:
        out["attention"] = args.attention
    if args.no_cuda_graph:
        out["cuda_graph"] = False
    if args.strict_attention:
        out["strict_attention"] = True
    if args.no_reflect:
        out["reflect"] = False
    if args.reflect_rounds is not None:
        out["reflect_rounds"] = args.reflect_rounds
    if args.implausible_action is not None:
        out["implausible_action"] = args.implausible_action
    return out


def load_overrides(args: argparse.Namespace) -> dict:
    """``add_decode_args``' model flags as ``Planner.from_pretrained`` keywords (with the decode settings')."""
    from wamdiff_ros.model import torch_dtype

    return {"device": args.device, "dtype": torch_dtype(args.dtype), "mask_token_id": args.mask_token_id,
            **decode_overrides(args)}


def add_decode_args(parser: argparse.ArgumentParser) -> None:
    """--model, --device and the decode settings' flags."""
    parser.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP + "; WAM-Diff2 and Qwen3-VL folders too")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                        help="weights' dtype (auto: float32 on the CPU, the checkpoint's own on a GPU)")
    parser.add_argument("--mask-token-id", type=int, default=None,
                        help="the [MASK] embedding row (default: the checkpoint's; WAM-Diff2's is 151671)")
    add_decode_settings_args(parser)


def _plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wamdiff-plan", description="Plan 8 waypoints from one front-camera image.")
    add_decode_args(p)
    p.add_argument("--image", default=None, help="RGB image file (default: the bundled sample)")
    p.add_argument("--velocity", type=float, nargs=2, default=(5.0, 0.0), metavar=("VX", "VY"))
    p.add_argument("--acceleration", type=float, nargs=2, default=(0.0, 0.0), metavar=("AX", "AY"))
    p.add_argument("--command", default="follow", choices=[c.value for c in fmt.Command])
    p.add_argument("--route", type=float, nargs=4, default=None, metavar=("X1", "Y1", "X2", "Y2"),
                   help="optional route points (m, ego frame): the route lane's centre 10 m and 30 m ahead, for a "
                        "model trained with them (wamdiff.json route_points)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--draw", default=None, metavar="OUT.png", help="write a PNG with the waypoints drawn")
    return p


def plan_to_dict(plan) -> dict:
    return {
        "waypoints": [[round(float(x), 2), round(float(y), 2)] for x, y in plan.waypoints],
        "waypoint_confidence": [round(float(c), 4) for c in plan.waypoint_confidence],
        "boxes": [dict(label=b.label, box=[b.x1, b.y1, b.x2, b.y2], score=b.score) for b in plan.boxes],
        "text": plan.text,
        "valid": plan.valid,
        "reason": plan.reason,
        "stats": plan.stats.as_dict(),
        "edited_waypoints": list(plan.edited_waypoints),
        "implausible": plan.implausible,
    }


def plan_main(argv: list[str] | None = None) -> int:
    args = _plan_parser().parse_args(argv)
    from wamdiff_ros.planner import EgoState, Planner

    try:
        planner = Planner.from_pretrained(args.model, **load_overrides(args))
        image = load_rgb(args.image or sample_image_path())
        route = None if args.route is None else np.reshape(args.route, (2, 2))
        plan = planner.plan(image, EgoState(tuple(args.velocity), tuple(args.acceleration)), args.command, route=route)
    except (WamDiffError, OSError) as exc:
        print(f"wamdiff-plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan_to_dict(plan)))
    else:
        s = plan.stats
        print(f"model {planner.bundle.source}  mode {s.mode}  B={s.block_size}  route {s.route}  "
              f"valid={plan.valid} {plan.reason}\n  decode path: {planner.backend}")
        for i, ((x, y), c) in enumerate(zip(plan.waypoints, plan.waypoint_confidence)):
            print(f"  t={0.5 * (i + 1):.1f}s  x={x:7.2f} m  y={y:7.2f} m  confidence {c:.2f}")
        print(f"  {s.new_tokens} tokens, {s.forward_calls} forward calls, {s.denoise_steps} denoising steps; "
              f"vision {1e3 * s.vision_s:.1f} ms, prefill {1e3 * s.prefill_s:.1f} ms, decode {1e3 * s.decode_s:.1f} ms")
    if args.draw:
        from wamdiff_ros.draw import save_plan_png

        summary = f"{args.command}  v=({args.velocity[0]:.1f},{args.velocity[1]:.1f})  valid={plan.valid}"
        save_plan_png(args.draw, image, plan.waypoints, plan.boxes, plan.waypoint_confidence, summary)
        print(f"wrote {args.draw}", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(plan_main())
