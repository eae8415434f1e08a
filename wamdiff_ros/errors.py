"""Typed errors; each message names the input and what was expected."""


class WamDiffError(Exception):
    """Base class of every error this package raises on purpose."""


class CheckpointError(WamDiffError):
    """A checkpoint folder or its metadata is missing, corrupt or contradicts the requested settings."""


class FieldError(WamDiffError, ValueError):
    """One named field of an input or a configuration is wrong; ``field`` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InputError(FieldError):
    """A planner input is malformed."""


class ImageError(InputError):
    pass


class EgoStateError(InputError):
    pass


class CommandError(InputError):
    pass


class RouteError(InputError):
    pass


class DecodeSettingsError(WamDiffError, ValueError):
    """Decode settings (block size, steps, threshold, schedule) are out of range."""


class GainsError(FieldError):
    """A follower gains table names an unknown world or key, lacks a key, or holds a value of the wrong type or range;
    ``field`` is the dotted key, e.g. ``carla.lateral_kp``."""


class CameraConfigError(FieldError):
    """A camera setting is out of range."""
