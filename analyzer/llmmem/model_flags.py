"""The model an estimate flag names: looked up offline unless `--hub` asks for the network."""

from __future__ import annotations

import argparse

from llmmem.errors import UsageError
from llmmem.models.spec import ModelSpec


def hub_wanted(args: argparse.Namespace) -> bool:
    """--hub: the only way estimate reaches the network (--offline, the default, says so)."""
    if getattr(args, "hub", False) and getattr(args, "offline", False):
        raise UsageError("--hub and --offline: give one of them")
    return bool(getattr(args, "hub", False))


def resolve_spec(ref: str, hub: bool) -> ModelSpec:
    from llmmem.models.resolve import ModelResolutionError, resolve_model

    try:
        return resolve_model(ref, hub=hub)
    except ModelResolutionError as err:
        hint = "; --hub looks it up on the Hugging Face Hub" if err.hub_not_asked else ""
        raise UsageError(f"{err}{hint}") from None
