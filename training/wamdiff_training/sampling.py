"""Task-mixed, deterministic, resumable and sharded batch sampling over loaded records.

An epoch is ``epoch_size`` draws (default: one per record). Each task gets the share of the epoch its ``TaskMix``
weight gives it (largest-remainder rounding, so the shares hold within one draw per epoch, not only on average);
inside a task the draws walk fresh permutations of its records, so every record comes up before any repeats. The
epoch's sequence is then shuffled. Everything derives from ``(seed, epoch)``: rank ``r`` of ``W`` takes the
positions ``r, r + W, ...`` of that one sequence, so ranks never share a position, together cover the epoch, and
all take the same number of batches (the tail that does not fill a batch on every rank is dropped).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_WEIGHTS = {"plan": 1.0, "detect": 0.5, "ask": 0.5}


@dataclass(frozen=True, slots=True)
class TaskMix:
    """Relative sampling weight per task; tasks absent from the data drop out and the rest are renormalised."""

    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))

    def __post_init__(self) -> None:
        for task, w in self.weights.items():
            if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ValueError(f"TaskMix: weight of task {task!r} must be a finite number >= 0, got {w!r}")

    def shares(self, tasks: Sequence[str]) -> dict[str, float]:
        """Each present task's fraction of the draws (sorted by task name)."""
        present = sorted(set(tasks))
        missing = [t for t in present if t not in self.weights]
        if missing:
            raise ValueError(f"TaskMix: no weight for task(s) {missing}; weights cover {sorted(self.weights)}")
        total = sum(float(self.weights[t]) for t in present)
        if total <= 0:
            raise ValueError(f"TaskMix: the tasks in the data {present} all have weight 0")
        return {t: float(self.weights[t]) / total for t in present}

    def probabilities(self, tasks: Sequence[str]) -> np.ndarray:
        """Per-record draw probability: a task's share split evenly over its records (sums to 1)."""
        shares = self.shares(tasks)
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t] = counts.get(t, 0) + 1
        return np.array([shares[t] / counts[t] for t in tasks], dtype=np.float64)


def _quotas(shares: Mapping[str, float], total: int) -> dict[str, int]:
    """Largest-remainder rounding of ``shares * total``; ties go to the earlier task name."""
    exact = {t: s * total for t, s in shares.items()}
    quota = {t: math.floor(v) for t, v in exact.items()}
    order = sorted(exact, key=lambda t: (-(exact[t] - quota[t]), t))
    for t in order[: total - sum(quota.values())]:
        quota[t] += 1
    return quota


class TaskMixSampler:
    """Batches of record indices for one rank; iterate it once per epoch (see ``stream`` for an endless run).

    ``state_dict()`` counts the batches this sampler has handed out. Behind a prefetching ``DataLoader`` that runs
    ahead of the trainer, save ``{"epoch": e, "position": steps_done_in_epoch}`` from the trainer's own count instead
    (with the other keys of ``state_dict()``).
    """

    def __init__(self, tasks: Sequence[str] | Sequence[object], mix: TaskMix | None = None, batch_size: int = 1, *,
                 seed: int = 0, rank: int = 0, world_size: int = 1, epoch_size: int | None = None) -> None:
        self.tasks = [t if isinstance(t, str) else t.task for t in tasks]  # records carry .task
        if not self.tasks:
            raise ValueError("TaskMixSampler: no records")
        self.mix = mix or TaskMix()
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.epoch_size = len(self.tasks) if epoch_size is None else epoch_size
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"TaskMixSampler: need batch_size >= 1 and 0 <= rank < world_size, got batch_size "
                             f"{batch_size}, rank {rank}, world_size {world_size}")
        self.steps_per_epoch = self.epoch_size // (world_size * batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(f"TaskMixSampler: epoch_size {self.epoch_size} is less than one batch on every rank "
                             f"(batch_size {batch_size} x world_size {world_size})")
        self._quotas = _quotas(self.mix.shares(self.tasks), self.epoch_size)
        tasks_arr = np.array(self.tasks)
        self._members = {t: np.flatnonzero(tasks_arr == t) for t in self._quotas}
        self.epoch = 0
        self.position = 0  # batches of the current epoch already handed out

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.steps_per_epoch

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """The whole epoch's record sequence (all ranks), a pure function of (seed, epoch)."""
        rng = np.random.default_rng([self.seed, epoch])
        parts = []
        for task, quota in self._quotas.items():  # sorted by task name: a fixed order of draws from rng
            members = self._members[task]
            if quota:
                rounds = -(-quota // len(members))
                parts.append(np.concatenate([rng.permutation(members) for _ in range(rounds)])[:quota])
        return rng.permutation(np.concatenate(parts))

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """This rank's batches of ``epoch``: (steps_per_epoch, batch_size) record indices."""
        used = self.steps_per_epoch * self.world_size * self.batch_size
        mine = self.epoch_indices(epoch)[:used][self.rank :: self.world_size]
        return mine.reshape(self.steps_per_epoch, self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        """The current epoch's remaining batches; when they run out the sampler moves on to the next epoch."""
        epoch = self.epoch
        batches = self.epoch_batches(epoch)
        while self.epoch == epoch and self.position < len(batches):
            self.position += 1  # counted before the yield: a state saved after taking k batches resumes at k
            yield batches[self.position - 1].tolist()
        if self.epoch == epoch:
            self.epoch, self.position = epoch + 1, 0

    def stream(self) -> Iterator[list[int]]:
        """Batches without end, epoch after epoch."""
        while True:
            yield from self

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def _config(self) -> dict:
        return {"seed": self.seed, "batch_size": self.batch_size, "world_size": self.world_size,
                "epoch_size": self.epoch_size, "records": len(self.tasks), "quotas": dict(self._quotas)}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, **self._config()}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at (epoch, position); the sampling set-up must match the one that saved it (rank may differ)."""
        for key, value in self._config().items():
            if key in state and state[key] != value:
                raise ValueError(f"sampler state: {key} {state[key]!r} differs from this sampler's {value!r}; "
                                 "a changed set-up cannot resume the saved sequence")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.steps_per_epoch:
            raise ValueError(f"sampler state: epoch {epoch} / position {position} out of range "
                             f"(0..{self.steps_per_epoch} batches per epoch)")
        self.epoch, self.position = epoch, position
