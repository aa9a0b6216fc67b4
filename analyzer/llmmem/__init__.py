"""llmmem: predicts the GPU memory of an LLM training step from the files people already have."""

# nothing is imported here: `python -m llmmem` loads this package while the working directory,
# the user's project, is still first on sys.path (`llmmem/__main__.py` takes it off)

__version__ = "0.1.0"
