"""One exception root for smlens; every error a user can meet derives from it."""


class SmlensError(Exception):
    """Root of all smlens errors. Its message is one sentence fit for a user."""


class ConfigError(SmlensError):
    """A flag, environment variable or config file is invalid."""


class BackendError(SmlensError):
    """A data source failed. ``reason`` is a short label usable as a metric label value."""

    def __init__(self, message: str, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


class BackendUnavailable(BackendError):
    """A data source cannot be used on this machine at all (library missing, no devices...)."""


class GpuLostError(BackendError):
    """The GPU fell off the bus or stopped answering; only that GPU is affected."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="gpu_lost")
