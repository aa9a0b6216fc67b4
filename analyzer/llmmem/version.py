"""llmmem's release, in a module of its own: anything may read it without loading the package's
lazy names (`llmmem.preflight` and the like)."""

__version__ = "0.1.0"
