"""llmmem: predicts the GPU memory of an LLM training step from the files people already have."""

__version__ = "0.1.0"
