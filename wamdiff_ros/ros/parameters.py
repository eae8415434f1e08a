"""The planner node's parameters: the one table the node declares from, and from which config/planner.yaml and
docs/parameters.md are written (``python -m wamdiff_ros.ros.parameters --write``; a test holds them equal).
rclpy-free."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.decoding.unmask import SCHEDULES
from wamdiff_ros.model_names import DEFAULT_MODEL, DTYPE_NAMES, MODEL_HELP

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = ROOT / "config" / "planner.yaml"
PARAMS_DOC = ROOT / "docs" / "parameters.md"
# the shipped model was trained on these (training/wamdiff_training/world/questions.py); a real checkpoint may take
# one open question, e.g. "Describe the driving scene in one sentence."
DESCRIBE_QUESTIONS = ("Which lane are we driving in?", "How far ahead is the vehicle in front of us in our lane?")
DECODE_PARAMS = ("block_size", "steps", "threshold", "schedule", "max_new_tokens", "constrain", "attention",
                 "cuda_graph", "strict_attention")


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    default: bool | int | float | str | tuple[str, ...]
    description: str
    low: float | None = None  # inclusive range, for numbers
    high: float | None = None
    read_only: bool = False
    on_restart: bool = False  # settable, but read once at start

    @property
    def type_name(self) -> str:
        return {bool: "bool", int: "int", float: "double", str: "string", tuple: "string[]"}[type(self.default)]

    @property
    def changes(self) -> str:
        """When a new value takes effect: never (read-only), at the next cycle (live) or on the next start."""
        return "read-only" if self.read_only else "on restart" if self.on_restart else "live"


def parameters() -> tuple[Param, ...]:
    d = DecodeSettings()
    return (
        Param("model", DEFAULT_MODEL, MODEL_HELP, read_only=True),
        Param("device", "cpu", "torch device", read_only=True),
        Param("dtype", "auto", "auto (float32 on the CPU, the checkpoint's own on a GPU) | "
              + " | ".join(DTYPE_NAMES[1:]), read_only=True),
        Param("mask_token_id", -1, "the [MASK] embedding row; -1 = the checkpoint's (WAM-Diff2: 151671)", -1,
              10_000_000, read_only=True),
        Param("torch_threads", -1, "CPU threads for inference; -1 = all cores but one (left for message handling), "
              "0 = torch's default", -1, 256, read_only=True),
        Param("block_size", d.block_size, "B, at most the checkpoint's trained block size", 1, 256),
        Param("steps", d.steps, "denoising steps per block, at most", 1, 256),
        Param("threshold", d.threshold, "confidence threshold of the threshold schedule", 0.01, 1.0),
        Param("schedule", d.schedule, " | ".join(SCHEDULES)),
        Param("max_new_tokens", d.max_new_tokens, "answer token budget", 80, 1024),
        Param("constrain", d.constrain, "constrain plans to the waypoint grammar"),
        Param("attention", d.attention, "decode attention: auto (FlashInfer where it can run, else SDPA) | sdpa | "
              "flashinfer"),
        Param("cuda_graph", d.cuda_graph, "on a GPU, the decode steps as captured CUDA Graphs"),
        Param("strict_attention", d.strict_attention, "a requested attention backend that cannot run is an error "
              "(configure fails), not a fallback to SDPA"),
        Param("compressed", False, "subscribe to ~/input/image/compressed instead of ~/input/image", read_only=True),
        Param("image_width", 0, "resize images to this width before planning (0 = as received)", 0, 8192),
        Param("image_height", 0, "resize images to this height before planning (0 = as received)", 0, 8192),
        Param("image_reliability", "best_effort", "image QoS: best_effort (sensor data) | reliable", read_only=True),
        Param("image_depth", 1, "image QoS history depth", 1, 100, read_only=True),
        Param("model_fov_deg", 90.0, "horizontal FOV the model was trained with (a camera_info more than 5 degrees "
              "off is warned about)", 10.0, 180.0),
        Param("sync_tolerance_ms", 100.0, "odometry must be this close to the image stamp, else the cycle is skipped",
              0.0, 10000.0),
        Param("odometry_wait_ms", 50.0, "how long a frame waits for odometry stamped at or after it", 0.0, 1000.0),
        Param("command_timeout_s", 10.0, "a navigation command older than this is stale", 0.0, 3600.0),
        Param("default_command", "", "plan with this command (follow | left | right | straight) while no fresh one "
              "has arrived on ~/input/command; '' = skip the cycle"),
        Param("deadline_ms", 1000.0, "a plan later than this after its image stamp is replaced by the fallback",
              1.0, 60000.0),
        Param("anytime", True, "at deadline_ms, publish the decoder's best-so-far plan (flagged anytime) instead of "
              "the fallback stop when it is valid"),
        Param("anytime_margin_ms", 10.0, "decoding stops refining this long before deadline_ms (time for the anytime "
              "plan's one fill forward and publishing)", 0.0, 10000.0),
        Param("detect_hz", 1.0, "detections (~/output/boxes) per second, in the time plans leave free; 0 = off",
              0.0, 100.0),
        Param("describe_hz", 0.5, "scene descriptions (~/output/description) per second, in the time plans leave "
              "free; 0 = off", 0.0, 100.0),
        Param("describe_questions", DESCRIBE_QUESTIONS, "the questions whose answers make up the description"),
        Param("debug_image_hz", 2.0, "~/debug/image (the frame with waypoints, boxes and description) per second, "
              "while someone subscribes; 0 = off", 0.0, 100.0),
        Param("fallback_decel", 2.0, "deceleration of the fallback stop, m/s^2", 0.5, 8.0),
        Param("watchdog_period_ms", 50.0, "how often the watchdog looks for frames past deadline_ms without a plan "
              "(it publishes their fallback whatever inference is doing)", 5.0, 1000.0, on_restart=True),
        Param("diagnostics_period_s", 1.0, "diagnostics publishing period", 0.1, 60.0, on_restart=True),
        Param("blackbox_dir", "", "where fallbacks dump the last inputs as MCAP ('' = $ROS_HOME/wamdiff_blackbox, "
              "'none' = never)", read_only=True),
        Param("blackbox_seconds", 10.0, "seconds of inputs a black-box file holds", 1.0, 600.0, read_only=True),
        Param("blackbox_max_mb", 64.0, "memory cap of the black-box buffer", 1.0, 4096.0, read_only=True),
        Param("blackbox_min_interval_s", 10.0, "at most one black-box file per this many seconds", 0.0, 3600.0),
    )


def _yaml_value(value: bool | int | float | str | tuple[str, ...]) -> str:
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z_][\w.-]*", value) else json.dumps(value)
    return repr(value)


def params_yaml() -> str:
    """config/planner.yaml: every parameter at its default, described."""
    lines = ["# Parameters of the wamdiff_planner node, written by `python -m wamdiff_ros.ros.parameters --write` from",
             "# wamdiff_ros/ros/parameters.py (their one home; decode defaults from DecodeSettings). Copy and edit it",
             "# for your own launch.", "/**:", "  ros__parameters:"]
    for p in parameters():
        lines.append(f"    {p.name + ': ' + _yaml_value(p.default):<32}# {p.description} ({p.changes})")
    return "\n".join(lines) + "\n"


def params_table() -> str:
    """The parameter table (Markdown)."""
    rows = ["| name | type | default | range | changes | description |", "|---|---|---|---|---|---|"]
    for p in parameters():
        default = f"`{p.default}`" if isinstance(p.default, str) and p.default else (
            '`""`' if p.default == "" else _yaml_value(p.default))
        span = "" if p.low is None else f"{p.low}..{p.high}"
        rows.append(f"| `{p.name}` | {p.type_name} | {default} | {span} | {p.changes} | "
                    f"{p.description.replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"


def params_doc() -> str:
    """docs/parameters.md."""
    return ("# Parameters of the `wamdiff_planner` node\n\n"
            "Written by `python -m wamdiff_ros.ros.parameters --write` from `wamdiff_ros/ros/parameters.py`, the "
            "node's own table (a test holds\nthis file, `config/planner.yaml` and the node's declarations equal). "
            "`config/planner.yaml` (`/**: ros__parameters:`) holds\nthe defaults; `params_file:=` replaces it. A bad "
            "value, or a block size above the checkpoint's trained one, is rejected\nwith the reason. *live*: takes "
            "effect at the next cycle (`ros2 param set`); *on restart*: read once at start.\n\n" + params_table())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite config/planner.yaml and docs/parameters.md")
    args = p.parse_args(argv)
    if not args.write:
        print(params_yaml(), end="")
        return 0
    PARAMS_FILE.write_text(params_yaml())
    PARAMS_DOC.write_text(params_doc())
    print(f"wrote {PARAMS_FILE} and {PARAMS_DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
