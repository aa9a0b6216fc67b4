"""llmmem inside the run, where the facts are exact.

- `preflight(trainer, gpu=None, on_oom="warn")`: the live trainer (or a plain loop's model,
  optimizer and first batch) sized before step one, with the same budget as `llmmem explain`;
  `on_oom="raise"` raises `WillNotFit` with the changes that would fit.
- `LlmmemCallback`: preflight at `on_train_begin`, the first steps measured, one calibration row.
- `watch(model, optimizer)`: the same for a loop of the script's own.

Nothing here imports torch or transformers until it is used.
"""

from __future__ import annotations

from typing import Any

from llmmem.integrations.preflight import Preflight, WillNotFit, preflight
from llmmem.integrations.watch import watch

__all__ = ["LlmmemCallback", "Preflight", "WillNotFit", "preflight", "watch"]


def __getattr__(name: str) -> Any:
    if name == "LlmmemCallback":  # a transformers TrainerCallback: imports transformers
        from llmmem.integrations.callback import LlmmemCallback

        return LlmmemCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
