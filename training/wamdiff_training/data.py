"""Conversation JSON (``wamdiff-train data`` exports, WAM-Diff2 / LLaVA-style NAVSIM conversions) -> records -> samples.

A file is a list of ``{"id", "image", "conversations", "task"?, "meta"?}``. Accepted variants:

* ``image``: one path or a list of paths, relative to the file's folder (or ``root``). The planner sees one image
  per prompt, so a human turn may hold at most one ``<image>``; the k-th ``<image>`` of a conversation shows the
  k-th listed image, and listed images no turn refers to (extra cameras) are ignored.
* ``conversations``: human/gpt turns alternating (``user``/``assistant`` also accepted), starting with a human turn
  that holds ``<image>``. Every gpt turn becomes its own single-turn sample, since the planner's prompt is one user
  turn (earlier turns are not context): a later human turn without ``<image>`` gets ``"<image>\\n"`` in front so its
  sample still sees the image it talks about. ``turns="first"`` keeps only the first pair. The first pair keeps the
  record's id; pair k > 0 gets ``"<id>#<k>"``.
* ``task``: optional; when absent it is inferred per answer: waypoints -> plan, boxes -> detect, else ask.
* ``meta``: optional object.

A sample's prompt is exactly ``wamdiff_ros.inputs.encode_prompt``'s for the user text and the image (RGB uint8, as
the planner takes it); its answer is the tokenized answer followed by ``<|im_end|>``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.cli import load_rgb
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import ModelBundle
from wamdiff_training.sampling import TaskMix  # noqa: F401  (re-exported: the mix is part of the data API)

HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "assistant")
TURNS = ("all", "first")
MANIFEST = "manifest.json"  # beside an export's record files: its format (``read_manifest``)


class RecordError(WamDiffError, ValueError):
    """A record file, record or field is malformed; the message names the file, record index and field."""

    def __init__(self, file: str | Path, message: str, index: int | None = None, field: str | None = None) -> None:
        where = str(file) + ("" if index is None else f": record {index}") + ("" if field is None else f": {field}")
        super().__init__(f"{where}: {message}")
        self.file, self.index, self.field = str(file), index, field


@dataclass(frozen=True, slots=True)
class Record:
    id: str
    image_path: Path
    user: str  # the human turn, with one <image>
    answer: str
    task: str
    meta: dict = field(default_factory=dict)
    source: str = ""  # "file[index]", for messages


@dataclass(slots=True)
class Sample:
    """One encoded record; CPU tensors (the trainer moves them)."""

    id: str
    task: str
    prompt_ids: torch.Tensor  # (L,) int64, encode_prompt's input_ids
    mm_token_type_ids: torch.Tensor  # (L,) 1 at image tokens
    pixel_values: torch.Tensor  # (patches, dim), in the model's dtype
    image_grid_thw: torch.Tensor  # (1, 3)
    answer_ids: torch.Tensor  # (A,) int64, ends with <|im_end|>

    @property
    def length(self) -> int:
        return int(self.prompt_ids.numel() + self.answer_ids.numel())


BEHAVIOURS = ("cruise", "junction", "lane_change", "yield")
TURN_END_M = 3.0  # a turn ahead: the reference's last waypoint (4 s) ends at least this far to one side ...
TURN_BEGUN_M = 0.3  # ... while its 1 s waypoint is within this of straight ahead (the ego has not begun to turn)
REST_SPEED = 0.5  # m/s: a plan record this slow is at rest (a start, a queue, a stop line) ...
REST_GO_M = 3.0  # ... and moves off when its reference's 4 s waypoint lies at least this far ahead
SLOW_DOWN_M = 8.0  # a slow-down: the reference's 4 s waypoint falls this far short of holding the current speed


def behaviour_of(meta: dict) -> str | None:
    """What the expert does in a world plan record (its ``meta``): ``recovery`` (a ``wamdiff-train data recoveries``
    frame: the ego placed off its lane centre, whatever the expert then does), ``yield`` (waiting for traffic),
    ``lane_change``, ``junction`` (a commanded turn or crossing: left / right / straight), else ``cruise`` (lane
    keeping, following). None for records without the world's ``expert`` / ``command`` fields (other datasets)."""
    expert, command = meta.get("expert"), meta.get("command")
    if expert is None or command is None:
        return None
    if meta.get("recovery"):
        return "recovery"
    if expert == "yield":
        return "yield"
    if str(expert).startswith("lane change"):
        return "lane_change"
    return "junction" if command != "follow" else "cruise"


def turn_ahead(answer: str) -> bool:
    """Whether a plan reference starts a turn: it ends ``TURN_END_M`` to one side while its 1 s waypoint still lies
    within ``TURN_BEGUN_M`` of straight ahead (the frames where a junction's turn begins, which the camera alone does
    not show: the ego still looks down its approach road)."""
    parsed = fmt.parse_waypoints(answer)
    y = parsed.waypoints[:, 1]
    return parsed.valid and abs(float(y[-1])) >= TURN_END_M and abs(float(y[1])) <= TURN_BEGUN_M


def slows_down(answer: str, speed: float | None) -> bool:
    """Whether a plan reference brakes: its 4 s waypoint lies at least ``SLOW_DOWN_M`` short of where the current
    ``speed`` (m/s) held for 4 s would take the ego (a mean deceleration of at least 1 m/s^2 over the plan)."""
    if speed is None:
        return False
    parsed = fmt.parse_waypoints(answer)
    horizon = fmt.NUM_WAYPOINTS * fmt.WAYPOINT_DT_S
    return parsed.valid and float(parsed.waypoints[-1, 0]) <= float(speed) * horizon - SLOW_DOWN_M


def moves_off(answer: str) -> bool:
    """Whether a plan reference gets going: its 4 s waypoint at least ``REST_GO_M`` ahead."""
    parsed = fmt.parse_waypoints(answer)
    return parsed.valid and float(parsed.waypoints[-1, 0]) >= REST_GO_M


def mix_group(record: Record, weights: dict[str, float]) -> str:
    """The sampling group of a record under ``data.task_weights``: ``"plan/<behaviour>"`` (e.g. ``plan/lane_change``)
    or ``"ask/<question>"`` (the world's question key, e.g. ``ask/lead``) when the weights name that group, else its
    task; a named group's share is taken out of its task's. ``plan/turn_start`` (when named) takes the junction
    records whose reference begins a turn (``turn_ahead``) out of ``plan/junction`` or ``plan``; ``plan/slow_down``
    (when named) the lane-keeping records whose reference brakes (``slows_down``: car following, a slow lead) out
    of ``plan/cruise`` or ``plan``; ``plan/rest_start`` and ``plan/rest_hold`` (when named) every plan record at rest
    (slower than ``REST_SPEED``) whose reference moves off (``moves_off``), or does not, whatever its behaviour: the
    few frames where a start from rest is decided, against the many where the ego waits."""
    speed = record.meta.get("speed")
    if record.task == "plan" and speed is not None and float(speed) < REST_SPEED:
        group = "plan/rest_start" if moves_off(record.answer) else "plan/rest_hold"
        if group in weights:
            return group
    sub = behaviour_of(record.meta) if record.task == "plan" else (
        record.meta.get("question") if record.task == "ask" else None)
    if sub == "junction" and "plan/turn_start" in weights and turn_ahead(record.answer):
        return "plan/turn_start"
    if sub == "cruise" and "plan/slow_down" in weights and slows_down(record.answer, record.meta.get("speed")):
        return "plan/slow_down"
    if sub is not None and f"{record.task}/{sub}" in weights:
        return f"{record.task}/{sub}"
    return record.task


def infer_task(answer: str) -> str:
    if fmt.parse_waypoints(answer).valid:
        return fmt.Task.PLAN.value
    return fmt.Task.DETECT.value if fmt.parse_boxes(answer).valid else fmt.Task.ASK.value


def _string(file: Path, index: int, name: str, value: object) -> str:
    if not isinstance(value, str):
        raise RecordError(file, f"expected a string, got {type(value).__name__}", index, name)
    return value


def _images(file: Path, index: int, raw: object, base: Path, seen: dict[Path, bool]) -> list[Path]:
    paths = [raw] if isinstance(raw, str) else raw
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise RecordError(file, f"expected a path or a non-empty list of paths, got {raw!r:.80}", index, "image")
    out = []
    for k, p in enumerate(paths):
        path = base / p  # an absolute p stays absolute
        if path not in seen:
            seen[path] = path.is_file()
        if not seen[path]:
            name = "image" if isinstance(raw, str) else f"image[{k}]"
            raise RecordError(file, f"no such image file {path}", index, name)
        out.append(path)
    return out


def _pairs(file: Path, index: int, raw: object) -> list[tuple[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise RecordError(file, "expected a non-empty list of turns", index, "conversations")
    if len(raw) % 2:
        raise RecordError(file, f"{len(raw)} turns; expected human/gpt pairs", index, "conversations")
    texts = []
    for k, turn in enumerate(raw):
        name = f"conversations[{k}]"
        if not isinstance(turn, dict):
            raise RecordError(file, f"expected an object, got {type(turn).__name__}", index, name)
        for key in ("from", "value"):
            if key not in turn:
                raise RecordError(file, "missing", index, f"{name}.{key}")
        roles = GPT_ROLES if k % 2 else HUMAN_ROLES
        if _string(file, index, f"{name}.from", turn["from"]) not in roles:
            raise RecordError(file, f"{turn['from']!r} where a {roles[0]!r} turn belongs", index, f"{name}.from")
        texts.append(_string(file, index, f"{name}.value", turn["value"]))
    return list(zip(texts[::2], texts[1::2]))


def _records(file: Path, index: int, raw: object, base: Path, turns: str, seen: dict[Path, bool]) -> list[Record]:
    if not isinstance(raw, dict):
        raise RecordError(file, f"expected an object, got {type(raw).__name__}", index)
    for key in ("id", "image", "conversations"):
        if key not in raw:
            raise RecordError(file, "missing", index, key)
    if not isinstance(raw["id"], (str, int)) or isinstance(raw["id"], bool):
        raise RecordError(file, f"expected a string or integer, got {type(raw['id']).__name__}", index, "id")
    task = raw.get("task")
    if task is not None and not (isinstance(task, str) and task):
        raise RecordError(file, f"expected a non-empty string, got {task!r:.40}", index, "task")
    meta = raw.get("meta", {})
    if not isinstance(meta, dict):
        raise RecordError(file, f"expected an object, got {type(meta).__name__}", index, "meta")
    images = _images(file, index, raw["image"], base, seen)
    pairs = _pairs(file, index, raw["conversations"])
    out, shown = [], -1
    for k, (user, answer) in enumerate(pairs[:1] if turns == "first" else pairs):
        name = f"conversations[{2 * k}].value"
        placeholders = user.count(fmt.IMAGE_PLACEHOLDER)
        if placeholders > 1:
            raise RecordError(file, f"{placeholders} {fmt.IMAGE_PLACEHOLDER} placeholders; the planner's prompt "
                                    "holds one image", index, name)
        if placeholders == 1:
            shown += 1
            if shown >= len(images):
                raise RecordError(file, f"{fmt.IMAGE_PLACEHOLDER} number {shown + 1} but 'image' lists "
                                        f"{len(images)}", index, name)
        elif k == 0:
            raise RecordError(file, f"no {fmt.IMAGE_PLACEHOLDER} placeholder in the first human turn", index, name)
        else:
            user = f"{fmt.IMAGE_PLACEHOLDER}\n{user}"
        if not answer.strip():
            raise RecordError(file, "empty answer", index, f"conversations[{2 * k + 1}].value")
        if fmt.CHAT_END in answer:
            raise RecordError(file, f"the answer holds {fmt.CHAT_END}", index, f"conversations[{2 * k + 1}].value")
        out.append(Record(str(raw["id"]) + (f"#{k}" if k else ""), images[shown], user, answer,
                          task or infer_task(answer), dict(meta), f"{file}[{index}]"))
    return out


def load_records(paths: str | Path | Iterable[str | Path], root: str | Path | None = None,
                 turns: str = "all") -> list[Record]:
    """Records of one or more JSON files in order; image paths resolve against each file's folder, or ``root``."""
    if turns not in TURNS:
        raise ValueError(f"turns must be one of {TURNS}, got {turns!r}")
    files = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    records: list[Record] = []
    owner: dict[str, str] = {}
    seen: dict[Path, bool] = {}
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise RecordError(file, f"cannot read ({exc.strerror or exc})") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RecordError(file, f"invalid JSON ({exc})") from exc
        if not isinstance(data, list):
            raise RecordError(file, f"expected a list of records, got {type(data).__name__}")
        base = Path(root) if root is not None else file.parent
        for index, raw in enumerate(data):
            for record in _records(file, index, raw, base, turns, seen):
                if record.id in owner:
                    raise RecordError(file, f"duplicate id {record.id!r} (first at {owner[record.id]})", index, "id")
                owner[record.id] = record.source
                records.append(record)
    return records


def read_manifest(train_file: str | Path) -> dict | None:
    """The ``manifest.json`` beside a record file (a ``wamdiff-train data`` export writes it), or None without one
    (hand-written data). Its ``format_version`` (the plan answers' waypoint format) and ``route_points`` (whether the
    plan prompts carry the route line) are checked: they are what a checkpoint trained on the file records."""
    path = Path(train_file).parent / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(path, f"cannot read the export manifest ({exc})") from exc
    if not isinstance(manifest, dict):
        raise RecordError(path, f"expected an object, got {type(manifest).__name__}")
    version = manifest.get("format_version")
    if type(version) is not int or version not in fmt.FORMAT_VERSIONS:
        raise RecordError(path, f"expected one of {fmt.FORMAT_VERSIONS}, got {version!r}", field="format_version")
    if not isinstance(manifest.get("route_points", False), bool):
        raise RecordError(path, f"expected true or false, got {manifest['route_points']!r}", field="route_points")
    return manifest


def encode_answer(bundle: ModelBundle, text: str) -> torch.Tensor:
    """Answer text -> token ids ending with EOS (``<|im_end|>`` closes the assistant turn), on the CPU."""
    ids = bundle.tokenizer(text, add_special_tokens=False)["input_ids"] + [bundle.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def encode_record(bundle: ModelBundle, record: Record) -> Sample:
    """The record as the planner would see it (prompt) plus its target answer."""
    try:
        image = load_rgb(record.image_path)
    except OSError as exc:
        raise RecordError(record.source, f"unreadable image {record.image_path} ({exc})", field="image") from exc
    prompt = encode_prompt(bundle, record.user, image)
    return Sample(record.id, record.task, prompt.input_ids[0].cpu(), prompt.mm_token_type_ids[0].cpu(),
                  prompt.pixel_values.cpu(), prompt.image_grid_thw.cpu(), encode_answer(bundle, record.answer))


class SampleDataset:
    """Map-style dataset of encoded records (use with ``TaskMixSampler`` as batch sampler), with an optional
    in-memory LRU cache of ``cache_size`` samples (0: none)."""

    def __init__(self, records: Sequence[Record], bundle: ModelBundle, cache_size: int = 0) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.records, self.bundle, self.cache_size = records, bundle, cache_size
        self._cache: OrderedDict[int, Sample] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Sample:
        sample = self._cache.get(index)
        if sample is not None:
            self.hits += 1
            self._cache.move_to_end(index)
            return sample
        self.misses += 1
        sample = encode_record(self.bundle, self.records[index])
        if self.cache_size:
            self._cache[index] = sample
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return sample

    def batch(self, indices: Sequence[int]) -> list[Sample]:
        return [self[i] for i in indices]
