"""Typed errors; each message names the input and what was expected."""


class WamDiffError(Exception):
    """Base class of every error this package raises on purpose."""


class CheckpointError(WamDiffError):
    """A checkpoint folder or its metadata is missing, corrupt or contradicts the requested settings."""


class InputError(WamDiffError, ValueError):
    """A planner input is malformed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ImageError(InputError):
    pass


class EgoStateError(InputError):
    pass


class CommandError(InputError):
    pass


class DecodeSettingsError(WamDiffError, ValueError):
    """Decode settings (block size, steps, threshold, schedule) are out of range."""
