"""llmmem: predicts the GPU memory of an LLM training step from the files people already have."""

# nothing is imported here: `python -m llmmem` loads this package while the working directory,
# the user's project, is still first on sys.path (`llmmem/__main__.py` takes it off)

from llmmem.version import __version__ as __version__

_IN_THE_RUN = ("preflight", "WillNotFit", "Preflight", "watch", "LlmmemCallback")


def __getattr__(name: str) -> object:
    """`llmmem.preflight`, `llmmem.WillNotFit`, `llmmem.watch`, `llmmem.LlmmemCallback`: loaded
    on first use (see `llmmem.integrations`), so `import llmmem` stays as cheap as before."""
    if name in _IN_THE_RUN:
        from llmmem import integrations

        return getattr(integrations, name)
    raise AttributeError(f"module 'llmmem' has no attribute {name!r}")
