"""Data sources: the :class:`~smlens.sources.base.Backend` interface, the registry of kinds, and one module
(or package) per source."""
