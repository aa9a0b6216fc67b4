"""How a fix is written in a framework's config: the keys and values of each lever.

Each framework module holds its own table, `FIX_SPELLINGS`, beside the reader that reads those
keys: for each lever (the keys of `llmmem.rules.fixes.CANDIDATES`) the key paths and values that
framework's config takes, or no entry where it has no such setting (then no fix is offered for
that file). Every key written is one the module's reader reads, so the edited file, analysed
again, moves. `llmmem.rules.spellings` gathers the tables.

A value is either the literal to write or a function of the training setup and the value
written at that path now (None when absent) that gives the literal, or None when the lever
cannot be spelled for this file (e.g. accumulation that the framework derives from a global
batch size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmmem.extract.yaml_positions import KeyPath

if TYPE_CHECKING:
    from llmmem.budget.setup import TrainingSetup

ValueOf = Callable[["TrainingSetup", Any], Any]


@dataclass(frozen=True)
class KeyWrite:
    """One key the fix writes: its path in the document and the value (or how to get it)."""

    path: KeyPath
    value: Any | ValueOf
    only_if_written: bool = False  # edit the key where it stands; never add it
    # one layout's key among others (verl's SFT and RL files): a file without it skips this
    # write instead of going without the fix; implies only_if_written
    layout_key: bool = False


Spelling = tuple[KeyWrite, ...]


def half_batch(setup: TrainingSetup, _current: Any) -> int:
    return setup.batch // 2


def double_accumulation(setup: TrainingSetup, _current: Any) -> int:
    return setup.grad_accum * 2


def keep_global_batch(_setup: TrainingSetup, current: Any) -> Any:
    """The global batch stays as written: halving the micro-batch doubles the accumulation
    the framework derives from it. Without a written global batch there is no accumulation
    to double (the global batch follows the micro-batch), so no edit."""
    return current if current is not None else None


def halve(micro: KeyPath, accumulation: KeyPath) -> Spelling:
    return (KeyWrite(micro, half_batch), KeyWrite(accumulation, double_accumulation))


def halve_keeping_global(micro: KeyPath, global_batch: KeyPath) -> Spelling:
    return (KeyWrite(micro, half_batch), KeyWrite(global_batch, keep_global_batch))
