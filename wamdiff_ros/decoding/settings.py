"""Decode settings (the one home of their defaults) and the result every decoder returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from wamdiff_ros.decoding.attention import CHOICES as ATTENTION_CHOICES
from wamdiff_ros.decoding.unmask import SCHEDULES
from wamdiff_ros.errors import DecodeSettingsError

IMPLAUSIBLE_ACTIONS = ("publish", "fallback")


@dataclass(frozen=True, slots=True)
class DecodeSettings:
    block_size: int = 32  # B; 1 with a next-token checkpoint means autoregressive decoding
    steps: int = 32  # T: denoising steps per block, at most
    threshold: float = 0.7  # the shipped student's: ~0.35 forward calls per token (training/RESULTS.md (a))
    schedule: str = "threshold"  # "static": ceil(B / T) tokens per step (the like-for-like benchmark)
    max_new_tokens: int = 128
    constrain: bool = True  # the planning grammar constraint (plan task only)
    attention: str = "auto"  # auto (FlashInfer where it can run, else SDPA) | sdpa | flashinfer
    cuda_graph: bool = True  # on a GPU, the decode steps as captured CUDA Graphs
    strict_attention: bool = False  # a requested backend that cannot run is an error, not a fallback
    reflect: bool = True  # plans: repair waypoints that fail the plan checker in place (``reflect.py``; blocks only)
    reflect_rounds: int = 2  # at most this many reflection rounds per plan
    # a plan reflection could not repair: "fallback" (invalid: the node's flagged stop) or "publish" (flagged). Measured
    # (README, Reflection): fallback against publish, 100 paired episodes per mode, DS +3.0 [+0.9, +5.3] paused,
    # +6.1 [+2.9, +9.4] real time. Plans reflection did not run on (AR, reflect off) are only flagged.
    implausible_action: str = "fallback"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise DecodeSettingsError(f"block_size {self.block_size} must be >= 1")
        if self.steps < 1:
            raise DecodeSettingsError(f"steps {self.steps} must be >= 1")
        if not 0.0 < self.threshold <= 1.0:
            raise DecodeSettingsError(f"threshold {self.threshold} must be in (0, 1]")
        if self.schedule not in SCHEDULES:
            raise DecodeSettingsError(f"schedule {self.schedule!r} is not one of {SCHEDULES}")
        if self.attention not in ATTENTION_CHOICES:
            raise DecodeSettingsError(f"attention {self.attention!r} is not one of {ATTENTION_CHOICES}")
        if self.reflect_rounds < 0:
            raise DecodeSettingsError(f"reflect_rounds {self.reflect_rounds} must be >= 0")
        if self.implausible_action not in IMPLAUSIBLE_ACTIONS:
            raise DecodeSettingsError(
                f"implausible_action {self.implausible_action!r} is not one of {IMPLAUSIBLE_ACTIONS}")
        if self.max_new_tokens < 1:
            raise DecodeSettingsError(f"max_new_tokens {self.max_new_tokens} must be >= 1")


@dataclass(slots=True)
class DecodeResult:
    tokens: list[int]  # answer tokens, up to and including EOS when one was produced
    confidence: list[float]  # probability of each token when it was fixed
    forward_calls: int = 0  # decoder forwards after the prompt prefill
    steps_per_block: list[int] = field(default_factory=list)
    anytime: bool = False  # cut at a deadline: the tokens fixed by then, the rest one forward's argmax
    reflection: object | None = None  # ``reflect.ReflectStats`` when the plan checker looked at a block draft

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)
