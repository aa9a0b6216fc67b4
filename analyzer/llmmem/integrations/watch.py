"""`llmmem.watch(model, optimizer)`: preflight and the first steps measured, for a loop of the
script's own (torchtune's recipes, a plain torch loop, anything that calls `optimizer.step()`).

    with llmmem.watch(model, optimizer, batch=first_batch, gpu="A100-80GB"):
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

On entry the step is sized from the objects (`preflight`); the meter runs from entry until the
`steps`-th `optimizer.step()` returns (or the block ends), and the measured peak is compared with
the prediction and recorded as `LlmmemCallback` records it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


class Watched:
    """What `watch` found: the preflight, the comparison line and the calibration row."""

    def __init__(self) -> None:
        self.preflight: Any = None
        self.comparison: str | None = None
        self.row: dict[str, Any] | None = None
        self.steps = 0


@contextlib.contextmanager
def watch(
    model: Any,
    optimizer: Any = None,
    *,
    batch: Any = None,
    gpu: str | None = None,
    on_oom: str = "warn",
    meter: str = "auto",
    steps: int = 2,
    record: bool = True,
    calibration: str | None = None,
    script: str | None = None,
) -> Iterator[Watched]:
    from llmmem.integrations.callback import finish_measurement
    from llmmem.integrations.measure import StepMeter, live_tensors
    from llmmem.integrations.preflight import preflight

    watched = Watched()
    watched.preflight = preflight(
        model=model, optimizer=optimizer, batch=batch, gpu=gpu, on_oom=on_oom, script=script
    )
    step_meter = StepMeter(meter)
    step_meter.start(live_tensors(model, optimizer))
    hook = None

    def finish() -> None:
        if step_meter.running and watched.steps:
            watched.comparison, watched.row = finish_measurement(
                step_meter, watched.preflight, watched.steps, record, calibration, script
            )
        elif step_meter.running:
            step_meter.stop()

    if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):

        def after_step(*_: Any) -> None:
            if not step_meter.running:
                return
            watched.steps += 1  # the steps measured
            if watched.steps >= steps:
                finish()

        hook = optimizer.register_step_post_hook(after_step)
    try:
        yield watched
    finally:
        if hook is not None:
            hook.remove()
        if step_meter.running and not watched.steps:
            print("llmmem: no optimizer step ran inside watch(): nothing measured", file=sys.stderr)
        finish()
