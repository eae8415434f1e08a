"""The planner node's parameters: the one table the node declares from, and from which config/planner.yaml and
docs/parameters.md are written (``python -m wamdiff_ros.ros.parameters --write``; a test holds them equal).
rclpy-free."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from wamdiff_ros.decoding.settings import IMPLAUSIBLE_ACTIONS, DecodeSettings
from wamdiff_ros.decoding.unmask import SCHEDULES
from wamdiff_ros.format import Command
from wamdiff_ros.model_names import DEFAULT_MODEL, DTYPE_NAMES, MODEL_HELP

ROOT = Path(__file__).resolve().parents[2]
PARAMS_FILE = ROOT / "config" / "planner.yaml"
PARAMS_DOC = ROOT / "docs" / "parameters.md"
# the shipped model was trained on these (training/wamdiff_training/world/questions.py); a real checkpoint may take
# one open question, e.g. "Describe the driving scene in one sentence."
DESCRIBE_QUESTIONS = ("Which lane are we driving in?", "How far ahead is the vehicle in front of us in our lane?")
DECODE_PARAMS = ("block_size", "steps", "threshold", "schedule", "max_new_tokens", "constrain", "attention",
                 "cuda_graph", "strict_attention", "reflect", "reflect_rounds", "implausible_action")


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


_DECODE = DecodeSettings()


def _param(default, description: str, low: float | None = None, high: float | None = None, *,
           read_only: bool = False, on_restart: bool = False):
    """A ``NodeConfig`` field: its default and what the ROS parameter's descriptor says of it."""
    return field(default=default, metadata={"param": (description, low, high, read_only, on_restart)})


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """The node's parameters, typed: the node reads them into one of these at start and after every accepted
    change (``read``), so a cycle sees one consistent set. Every field is a ROS parameter (``parameters()``)."""

    model: str = _param(DEFAULT_MODEL, MODEL_HELP, read_only=True)
    device: str = _param("cpu", "torch device", read_only=True)
    dtype: str = _param("auto", "auto (float32 on the CPU, the checkpoint's own on a GPU) | "
        + " | ".join(DTYPE_NAMES[1:]), read_only=True)
    mask_token_id: int = _param(-1, "the [MASK] embedding row; -1 = the checkpoint's (WAM-Diff2: 151671)", -1,
        10_000_000, read_only=True)
    torch_threads: int = _param(-1, "CPU threads for inference; -1 = all cores but one (left for message handling), "
        "0 = torch's default", -1, 256, read_only=True)
    block_size: int = _param(_DECODE.block_size, "B, at most the checkpoint's trained block size", 1, 256)
    steps: int = _param(_DECODE.steps, "denoising steps per block, at most", 1, 256)
    threshold: float = _param(_DECODE.threshold, "confidence threshold of the threshold schedule", 0.01, 1.0)
    schedule: str = _param(_DECODE.schedule, " | ".join(SCHEDULES))
    max_new_tokens: int = _param(_DECODE.max_new_tokens, "answer token budget", 80, 1024)
    constrain: bool = _param(_DECODE.constrain, "constrain plans to the waypoint grammar")
    attention: str = _param(_DECODE.attention, "decode attention: auto (FlashInfer where it can run, else SDPA) | "
        "sdpa | flashinfer")
    cuda_graph: bool = _param(_DECODE.cuda_graph, "on a GPU, the decode steps as captured CUDA Graphs")
    strict_attention: bool = _param(_DECODE.strict_attention, "a requested attention backend that cannot run is an "
        "error (configure fails), not a fallback to SDPA")
    reflect: bool = _param(_DECODE.reflect, "block decoding repairs waypoints that fail the plan checker in place "
        "(local search over the model's candidates, then re-denoising; the plan is flagged edited)")
    reflect_rounds: int = _param(_DECODE.reflect_rounds, "reflection rounds per plan, at most", 0, 16)
    implausible_action: str = _param(_DECODE.implausible_action, "a plan that still fails the plan checker: "
        + " | ".join(IMPLAUSIBLE_ACTIONS) + " (publish flagged implausible, or the fallback stop)")
    compressed: bool = _param(False, "subscribe to ~/input/image/compressed instead of ~/input/image", read_only=True)
    image_width: int = _param(0, "resize images to this width before planning (0 = as received)", 0, 8192)
    image_height: int = _param(0, "resize images to this height before planning (0 = as received)", 0, 8192)
    image_reliability: str = _param("best_effort", "image QoS: best_effort (sensor data) | reliable", read_only=True)
    image_depth: int = _param(1, "image QoS history depth", 1, 100, read_only=True)
    model_fov_deg: float = _param(90.0, "horizontal FOV the model was trained with (a camera_info more than 5 degrees "
        "off is warned about)", 10.0, 180.0)
    sync_tolerance_ms: float = _param(100.0, "odometry must be this close to the image stamp, else the cycle is "
        "skipped", 0.0, 10000.0)
    odometry_wait_ms: float = _param(50.0, "how long a frame waits for odometry stamped at or after it", 0.0, 1000.0)
    command_timeout_s: float = _param(10.0, "a navigation command older than this is stale", 0.0, 3600.0)
    default_command: str = _param("", "plan with this command (follow | left | right | straight) while no fresh one "
        "has arrived on ~/input/command; '' = skip the cycle")
    deadline_ms: float = _param(1000.0, "a plan later than this after its image stamp is replaced by the fallback",
        1.0, 60000.0)
    anytime: bool = _param(True, "at deadline_ms, publish the decoder's best-so-far plan (flagged anytime) instead of "
        "the fallback stop when it is valid")
    anytime_margin_ms: float = _param(10.0, "decoding stops refining this long before deadline_ms (time for the "
        "anytime plan's one fill forward and publishing)", 0.0, 10000.0)
    detect_hz: float = _param(1.0, "detections (~/output/boxes) per second, in the time plans leave free; 0 = off",
        0.0, 100.0)
    describe_hz: float = _param(0.5, "scene descriptions (~/output/description) per second, in the time plans leave "
        "free; 0 = off", 0.0, 100.0)
    describe_questions: tuple[str, ...] = _param(DESCRIBE_QUESTIONS,
        "the questions whose answers make up the description")
    debug_image_hz: float = _param(2.0, "~/debug/image (the frame with waypoints, boxes and description) per second, "
        "while someone subscribes; 0 = off", 0.0, 100.0)
    repeated_frame_check: bool = _param(False, "a camera frame repeating the last planned one byte for byte while the "
        "car moves (a frozen stream) is not planned as new: the last valid plan is published re-timed (flagged held)")
    repeated_frame_min_speed: float = _param(0.5, "the car 'moves' above this speed, m/s (at rest a still scene "
        "repeats: planned)", 0.0, 100.0)
    max_plan_age_s: float = _param(1.0, "a held plan is at most this old (its image to the repeated frame); older: "
        "the fallback stop", 0.0, 10.0)
    ego_filter: bool = _param(True, "odometry through the ego-state filter: dead reckoning corrected by gated "
        "positions (implausible jumps pulled at most 2 m), a noisy speed smoothed, a biased speedometer corrected "
        "against the positions (on: DS +30 under 5 m GNSS noise, no loss shown on clean odometry; README Robustness)")
    fallback_decel: float = _param(2.0, "deceleration of the fallback stop, m/s^2", 0.5, 8.0)
    watchdog_period_ms: float = _param(50.0, "how often the watchdog looks for frames past deadline_ms without a plan "
        "(it publishes their fallback whatever inference is doing)", 5.0, 1000.0, on_restart=True)
    diagnostics_period_s: float = _param(1.0, "diagnostics publishing period", 0.1, 60.0, on_restart=True)
    blackbox_dir: str = _param("", "where fallbacks dump the last inputs as MCAP ('' = $ROS_HOME/wamdiff_blackbox, "
        "'none' = never)", read_only=True)
    blackbox_seconds: float = _param(10.0, "seconds of inputs a black-box file holds", 1.0, 600.0, read_only=True)
    blackbox_max_mb: float = _param(64.0, "memory cap of the black-box buffer", 1.0, 4096.0, read_only=True)
    blackbox_min_interval_s: float = _param(10.0, "at most one black-box file per this many seconds", 0.0, 3600.0)

    @classmethod
    def read(cls, value: Callable[[str], object]) -> NodeConfig:
        """The config from ``value(name)`` (the node's ``get_parameter(name).value``)."""
        values = {f.name: value(f.name) for f in fields(cls)}
        values["describe_questions"] = tuple(values["describe_questions"])
        return cls(**values)

    def check(self) -> None:
        """Raises ValueError on values the ranges of the descriptors cannot express."""
        check_default_command(self.default_command)
        if self.image_reliability not in ("best_effort", "reliable"):
            raise ValueError(f"image_reliability {self.image_reliability!r} is not best_effort or reliable")

    @property
    def decode(self) -> dict[str, object]:
        """The decode settings, as ``Planner.from_pretrained`` takes them."""
        return {name: getattr(self, name) for name in DECODE_PARAMS}


def check_default_command(value: str) -> None:
    if value and value not in {c.value for c in Command}:
        raise ValueError(f"default_command {value!r} is not '' or one of {', '.join(c.value for c in Command)}")


def parameters() -> tuple[Param, ...]:
    """The node's parameters in declaration order, from ``NodeConfig``."""
    return tuple(Param(f.name, f.default, *f.metadata["param"]) for f in fields(NodeConfig))


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
