"""Data sources. Each module holds one backend behind the :class:`~smlens.backends.base.Backend` interface."""
