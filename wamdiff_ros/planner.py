"""The planner facade: typed inputs (image, ego state, command) -> a typed plan. No ROS here."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.generate import Generation, generate
from wamdiff_ros.decoding.grammar_mask import grammar_mask
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.errors import CommandError, EgoStateError, ImageError, InputError, RouteError
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import ModelBundle, load
from wamdiff_ros.model_names import DEFAULT_MODEL
from wamdiff_ros.plan_check import AnswerCheck, Limits, check_plan, steps_back, summary

MIN_CACHE = 1024  # the decode engine's first KV capacity (tokens); a longer prompt rebuilds it larger
ANYTIME_MAX_SPEED = Limits().max_speed_mps  # m/s: an anytime plan implying a faster step is not valid
REFLECT_TOP_K = 10  # candidates kept per answer position for reflection's search (a digit position has 10)
MIN_IMAGE_SIDE = 32
MAX_ASPECT = 100
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EgoState:
    """Ego motion in the ego frame (x forward, y left): velocity in m/s, acceleration in m/s^2."""

    velocity: tuple[float, float]
    acceleration: tuple[float, float] = (0.0, 0.0)


@dataclass(slots=True)
class PlanStats:
    mode: str = ""  # "ar" or "block"
    route: str = ""  # plan only: "used", "missing" (a route-trained model planned without one) or "unused"
    block_size: int = 0
    forward_calls: int = 0
    new_tokens: int = 0
    denoise_steps: int = 0
    vision_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    reflect_rounds: int = 0  # reflection rounds run on this plan (``decoding/reflect.py``)
    reflect_forwards: int = 0  # the forwards they cost (included in forward_calls)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class Plan:
    waypoints: np.ndarray  # (8, 2) float32, ego frame; zeros when not valid
    waypoint_confidence: np.ndarray  # (8,) float32: min over each waypoint's tokens
    boxes: list[fmt.Box] = field(default_factory=list)
    text: str = ""
    valid: bool = False
    reason: str = ""
    stats: PlanStats = field(default_factory=PlanStats)
    anytime: bool = False  # decoding was cut at its deadline: the best plan so far (``Planner.plan``)
    edited: bool = False  # reflection repaired waypoints that failed the plan checker (``edited_waypoints``)
    edited_waypoints: tuple[int, ...] = ()  # 0-based
    implausible: str = ""  # the plan still fails the checker: its first violation (``DecodeSettings.implausible_action``)
    draft_stepped_back: bool = False  # before reflection, an x lay > 0.5 m behind the one before (``plan_check``)
    held: bool = False  # not planned: the last valid plan re-timed to a repeated frame (the node's ``control.hold``)


@dataclass(frozen=True, slots=True)
class Detection:
    """``Planner.detect``'s result: the boxes on the 0-1000 grid, from the answer ``text``."""

    boxes: list[fmt.Box]
    text: str
    valid: bool  # the answer parsed as boxes; else ``reason`` says why
    reason: str
    stats: PlanStats


@dataclass(frozen=True, slots=True)
class Answer:
    """``Planner.ask``'s result: the answer's text (empty when the model answered nothing)."""

    text: str
    stats: PlanStats


def check_image(image: object) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise ImageError("image", f"expected an HxWx3 uint8 numpy array, got {type(image).__name__}")
    if image.size == 0:
        raise ImageError("image", f"image is empty (shape {image.shape})")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ImageError("image", f"expected shape HxWx3 (RGB), got {image.shape}")
    if image.dtype != np.uint8:
        raise ImageError("image", f"expected dtype uint8, got {image.dtype}")
    h, w = image.shape[:2]
    if min(h, w) < MIN_IMAGE_SIDE:
        raise ImageError("image", f"image {w}x{h} is smaller than {MIN_IMAGE_SIDE} pixels on a side")
    if max(h, w) > MAX_ASPECT * min(h, w):
        raise ImageError("image", f"image {w}x{h} has an aspect ratio above {MAX_ASPECT}")
    return np.ascontiguousarray(image)


def check_ego(ego: object) -> EgoState:
    if not isinstance(ego, EgoState):
        raise EgoStateError("ego", f"expected EgoState, got {type(ego).__name__}")
    for name in ("velocity", "acceleration"):
        value = getattr(ego, name)
        try:
            pair = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            raise EgoStateError(f"ego.{name}", f"expected two numbers, got {value!r}") from None
        if len(pair) != 2:
            raise EgoStateError(f"ego.{name}", f"expected two numbers (x, y), got {len(pair)}")
        if not all(math.isfinite(v) for v in pair):
            raise EgoStateError(f"ego.{name}", f"values must be finite, got {pair}")
    return ego


def check_command(command: object) -> fmt.Command:
    if isinstance(command, fmt.Command):
        return command
    if isinstance(command, str):
        try:
            return fmt.Command(command.strip().lower())
        except ValueError:
            pass
    choices = ", ".join(c.value for c in fmt.Command)
    raise CommandError("command", f"unknown navigation command {command!r}; expected one of {choices}")


def check_route(route: object) -> np.ndarray | None:
    """The optional route points: None, or ``len(fmt.ROUTE_AHEAD_M)`` finite (x, y) points in metres, ego frame (the
    route lane's centre ``fmt.ROUTE_AHEAD_M`` ahead along the route), as a float64 (2, 2) array."""
    if route is None:
        return None
    expected = f"{len(fmt.ROUTE_AHEAD_M)} (x, y) points in metres (the route {fmt.ROUTE_AHEAD_M} m ahead, ego frame)"
    try:
        arr = np.asarray(route, dtype=np.float64)
    except (TypeError, ValueError):
        raise RouteError("route", f"expected {expected}, got {route!r}") from None
    if arr.shape != (len(fmt.ROUTE_AHEAD_M), 2):
        raise RouteError("route", f"expected {expected}, shape ({len(fmt.ROUTE_AHEAD_M)}, 2); got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise RouteError("route", f"values must be finite, got {arr.tolist()}")
    return arr


def waypoint_confidence(token_texts: list[str], confidence: list[float]) -> np.ndarray:
    """Per waypoint: the minimum confidence over the tokens that write its two numbers."""
    out = np.ones(fmt.NUM_WAYPOINTS, dtype=np.float32)
    number, first = 0, True
    for text, conf in zip(token_texts, confidence):
        for ch in text:
            if ch == ",":
                number, first = number + 1, True
            elif number < 2 * fmt.NUM_WAYPOINTS and (
                    ch in "0123456789.-" or (first and number % 2 == 1 and ch in fmt.LATERAL_BINS)):  # v3's y bin
                out[number // 2] = min(out[number // 2], conf)
                first = False
    return out


def _plausible(waypoints: np.ndarray) -> tuple[bool, str]:
    """An anytime plan's check beyond the grammar (whose numbers may be half guesses): no step between consecutive
    waypoints (the first from the ego) faster than ``ANYTIME_MAX_SPEED`` (the plan checker's speed limit)."""
    fast = [v for v in check_plan(waypoints) if v.kind == "speed"]
    return (False, summary(fast)) if fast else (True, "")


class Planner:
    def __init__(self, bundle: ModelBundle, settings: DecodeSettings) -> None:
        bundle.meta.check_block_size(settings.block_size)
        self.bundle = bundle
        self.settings = settings
        self._warned_no_route = False
        self.limits = Limits()  # the plan checker's (``plan_check.py``)
        self._texts: dict[int, str] = {}  # token id -> text, for the checker
        self.decode_mode = "auto"  # the checkpoint's convention; "ar" | "block" decode it the other way (benchmarks)
        vocab = bundle.model.get_output_embeddings().weight.shape[0]
        self._constraint = (
            WaypointConstraint(bundle.tokenizer, bundle.eos_token_id, settings.max_new_tokens, vocab,
                               bundle.meta.format_version)
            if settings.constrain
            else None
        )
        # the grammar inside the decode step where it is per-position (fixed width); else the host constraint
        self._grammar = None if self._constraint is None else grammar_mask(
            self._constraint, bundle.tokenizer, bundle.eos_token_id, vocab, bundle.device)
        self._runner: GraphRunner | None = None
        self._decoding = threading.Lock()  # one decode engine: calls from several threads take turns
        self._runner_for(MIN_CACHE)  # a backend that cannot run (strict_attention) refuses here

    @property
    def backend(self) -> str:
        """The decode path, as the node's diagnostics report it: ``attention sdpa, cuda_graph off (cpu)``."""
        runner = self._runner
        on = runner.use_graphs
        why = "" if on else " (cpu)" if runner.engine.device.type == "cpu" else " (cuda_graph false)"
        grammar = "" if self._constraint is None else ", grammar in the step" if self._grammar is not None \
            else ", grammar on the host"
        return f"attention {runner.engine.attention.name}, cuda_graph {'on' if on else 'off'}{why}{grammar}"

    @property
    def attention_reason(self) -> str:
        return self._runner.engine.attention_reason

    def _runner_for(self, needed: int) -> GraphRunner:
        """The decode engine and its graph runner, rebuilt (and its graphs captured again) when a plan needs a
        longer cache than it has."""
        runner = self._runner
        if runner is not None and needed <= runner.engine.capacity:
            return runner
        s, device = self.settings, self.bundle.device
        capacity = max(needed, MIN_CACHE, 2 * runner.engine.capacity if runner is not None else 0)
        attention = "sdpa" if device.type != "cuda" and s.attention == "auto" else s.attention  # cpu: no FlashInfer
        engine = DecoderEngine(self.bundle.model, capacity, attention, strict=s.strict_attention)
        graphs = device.type == "cuda" and s.cuda_graph
        runner = GraphRunner(engine, self.bundle.mask_token_id, max_block=max(s.block_size, 1),
                             check_every=2 if graphs else 1, use_graphs=graphs,
                             candidates=REFLECT_TOP_K if s.reflect else 0)
        if graphs:
            for grammar in ((None, self._grammar) if self._grammar is not None else (None,)):
                runner.set_grammar(grammar)
                runner.capture((s.block_size,), (s.schedule,))
        self._runner = runner
        return runner

    @classmethod
    def from_pretrained(
        cls,
        path: str = DEFAULT_MODEL,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        block_size: int | None = None,
        steps: int | None = None,
        threshold: float | None = None,
        schedule: str | None = None,
        max_new_tokens: int | None = None,
        constrain: bool = True,
        mask_token_id: int | None = None,
        attention: str | None = None,
        cuda_graph: bool | None = None,
        strict_attention: bool = False,
        reflect: bool | None = None,
        reflect_rounds: int | None = None,
        implausible_action: str | None = None,
    ) -> Planner:
        """``path``: a checkpoint folder (this package's, WAM-Diff2's or Qwen3-VL's layout: ``model.load``), a
        packaged model's name (default ``wamdiff-tiny``) or "tiny-random". ``dtype`` None: float32 on the CPU, the
        checkpoint's own on an accelerator. ``mask_token_id``: override the checkpoint's [MASK] id. Unset decode
        settings take the package defaults, the block size at most the checkpoint's trained one."""
        bundle = load(path, device=device, dtype=dtype, mask_token_id=mask_token_id)
        defaults = DecodeSettings()
        settings = DecodeSettings(
            block_size=(block_size if block_size is not None
                        else min(defaults.block_size, bundle.meta.trained_block_size)),
            steps=steps if steps is not None else defaults.steps,
            threshold=threshold if threshold is not None else defaults.threshold,
            schedule=schedule if schedule is not None else defaults.schedule,
            max_new_tokens=max_new_tokens if max_new_tokens is not None else defaults.max_new_tokens,
            constrain=constrain,
            attention=attention if attention is not None else defaults.attention,
            cuda_graph=cuda_graph if cuda_graph is not None else defaults.cuda_graph,
            strict_attention=strict_attention,
            reflect=reflect if reflect is not None else defaults.reflect,
            reflect_rounds=reflect_rounds if reflect_rounds is not None else defaults.reflect_rounds,
            implausible_action=implausible_action if implausible_action is not None else defaults.implausible_action,
        )
        return cls(bundle, settings)

    def _text_of(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.bundle.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def _run(self, user_text: str, image: np.ndarray, constraint: WaypointConstraint | None,
             deadline: float | None = None, check: AnswerCheck | None = None) -> tuple[str, Generation]:
        prompt = encode_prompt(self.bundle, user_text, image)
        s = self.settings
        with self._decoding:
            runner = self._runner_for(prompt.length + s.max_new_tokens + s.block_size)
            generation = generate(self.bundle, prompt, s, constraint, mode=self.decode_mode, runner=runner,
                                  grammar=self._grammar if constraint is not None else None, deadline=deadline,
                                  check=check, reflect_rounds=s.reflect_rounds if check is not None else 0)
        tokens = [t for t in generation.result.tokens if t != self.bundle.eos_token_id]
        return self.bundle.tokenizer.decode(tokens, skip_special_tokens=False), generation

    def _stats(self, generation: Generation) -> PlanStats:
        r = generation.result
        return PlanStats(
            mode=generation.mode,
            block_size=self.settings.block_size if generation.mode == "block" else 1,
            forward_calls=r.forward_calls,
            new_tokens=r.new_tokens,
            denoise_steps=sum(r.steps_per_block),
            vision_s=generation.vision_s,
            prefill_s=generation.prefill_s,
            decode_s=generation.decode_s,
            reflect_rounds=r.reflection.rounds if r.reflection is not None else 0,
            reflect_forwards=r.reflection.extra_forwards if r.reflection is not None else 0,
        )

    def plan(self, image: np.ndarray, ego: EgoState, command: fmt.Command | str,
             route: np.ndarray | None = None, deadline: float | None = None) -> Plan:
        """``route``: the route points the caller has, (2, 2) ego frame (``fmt.route_line``; ``World.route_points`` in
        the CPU world), or None. The prompt carries them when the checkpoint was trained with them
        (``DecodeMeta.route_points``); such a model planning without one is warned about once and its plan's
        ``stats.route`` says "missing".

        ``deadline``: a ``time.perf_counter()`` value. In block decoding with the grammar in the step (or
        unconstrained; AR decoding and the host-side grammar run to the end), decoding that passes it stops
        refining and answers the best plan so far: the tokens fixed by then, every still-masked position one
        forward's argmax under the plan grammar; the plan is flagged ``anytime`` (valid when it parses) and its
        ``waypoint_confidence`` says how sure each waypoint is. Vision and prefill are not cut."""
        image = check_image(image)
        ego = check_ego(ego)
        command = check_command(command)
        route = check_route(route)
        if not self.bundle.meta.route_points:
            route, route_state = None, "unused"
        elif route is None:
            route_state = "missing"
            if not self._warned_no_route:
                self._warned_no_route = True
                log.warning("%s was trained with route points in its plan prompt and got none: its plans may be "
                            "near standstill (pass route=, or --route to wamdiff-plan)", self.bundle.source)
        else:
            route_state = "used"
        prompt = fmt.plan_prompt(command, ego.velocity, ego.acceleration, route)
        check = AnswerCheck(self._text_of, self.bundle.eos_token_id, ego.velocity, route, self.limits) \
            if self.settings.reflect else None
        text, generation = self._run(prompt, image, self._constraint, deadline, check)
        parsed = fmt.parse_waypoints(text)
        texts = [self._text_of(t) for t in generation.result.tokens]
        conf = waypoint_confidence(texts, generation.result.confidence)
        if not parsed.valid:
            conf = np.zeros(fmt.NUM_WAYPOINTS, dtype=np.float32)
        stats = self._stats(generation)
        stats.route = route_state
        valid, reason = parsed.valid, parsed.reason
        if generation.result.anytime and valid:
            valid, reason = _plausible(parsed.waypoints)
        reflection = generation.result.reflection
        edited = tuple(reflection.edited) if reflection is not None else ()
        draft = parsed.waypoints
        if edited:
            drafted = fmt.parse_waypoints("".join(self._text_of(t) for t in reflection.draft
                                                  if t != self.bundle.eos_token_id))
            draft = drafted.waypoints if drafted.valid else draft
        implausible = summary(check_plan(parsed.waypoints, ego.velocity, route, self.limits)) if valid else ""
        if implausible and reflection is not None and self.settings.implausible_action == "fallback":
            valid, reason = False, implausible  # what reflection could not repair (AR and unreflected: flagged only)
        return Plan(parsed.waypoints, conf, [], text, valid, reason, stats, generation.result.anytime,
                    bool(edited), edited, implausible, parsed.valid and steps_back(draft))

    def detect(self, image: np.ndarray) -> Detection:
        image = check_image(image)
        text, generation = self._run(fmt.detect_prompt(), image, None)
        parsed = fmt.parse_boxes(text)
        return Detection(parsed.boxes, text, parsed.valid, parsed.reason, self._stats(generation))

    def ask(self, image: np.ndarray, question: str) -> Answer:
        image = check_image(image)
        if not isinstance(question, str) or not question.strip():
            raise InputError("question", "expected a non-empty string")
        text, generation = self._run(fmt.ask_prompt(question), image, None)
        return Answer(fmt.parse_text(text), self._stats(generation))
