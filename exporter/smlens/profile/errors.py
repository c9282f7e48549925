"""What ``smlens profile`` raises when a capture cannot run; its own module, so that the CUPTI session and
the CUDA driver calls both raise it without importing each other."""

from __future__ import annotations

from smlens.errors import SmlensError


class ProfileError(SmlensError):
    """Why a capture cannot run, in one sentence for the user."""
