"""`LlmmemCallback`: preflight at the start of `train()`, the first steps measured, one row kept.

    trainer = SFTTrainer(..., callbacks=[LlmmemCallback(gpu="A100-80GB", on_oom="raise")])

At `on_train_begin` the live trainer is sized (`preflight`), before the first batch runs; the
meter starts there (CUDA's peak counters, or `meter="cpu"`, llmmem's CPU meter). After
`steps` optimizer steps (2: the first step has no optimizer states before it, the second is the
steady step every later one repeats) the measured peaks are compared with the prediction in one
log line, and one row is appended to the local calibration file (`.llmmem/calibration.jsonl`
above the training script, as `llmmem calibrate add` writes it), so the next `explain`, hover
and lint of the same setup use it for their band. `record=False` keeps the file untouched.
"""

from __future__ import annotations

import sys
from typing import Any

from transformers import TrainerCallback

from llmmem.integrations.measure import StepMeter, live_tensors
from llmmem.integrations.preflight import Preflight, preflight
from llmmem.integrations.recording import finish_measurement


class LlmmemCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(
        self,
        gpu: str | None = None,
        *,
        on_oom: str = "warn",
        meter: str = "auto",
        steps: int = 2,
        record: bool = True,
        calibration: str | None = None,
        script: str | None = None,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        self.gpu = gpu
        self.on_oom = on_oom
        self.meter_kind = meter
        self.steps = steps
        self.record = record
        self.calibration = calibration
        self.script = script
        self.preflight: Preflight | None = None
        self.meter: StepMeter | None = None
        self.measured_steps = 0
        self.row: dict[str, Any] | None = None  # the calibration row written, if any
        self.comparison: str | None = None  # the measured-vs-predicted line

    # -- the Trainer's events -------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        batch = None
        loader = kwargs.get("train_dataloader")
        if loader is not None:
            try:
                batch = next(iter(loader))
            except Exception:  # a loader that cannot be read twice: the arguments' sizes
                batch = None
        self.preflight = preflight(
            model=model,
            args=args,
            optimizer=kwargs.get("optimizer"),
            batch=batch,
            gpu=self.gpu,
            on_oom=self.on_oom,
            script=self.script,
            trainer_class=_trainer_class(),
        )
        self.meter = StepMeter(self.meter_kind)
        self.meter.start(live_tensors(model, kwargs.get("optimizer")))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is None or not self.meter.running:
            return
        self.measured_steps += 1
        if self.measured_steps >= self.steps:
            self._finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter is not None and self.meter.running:
            self._finish()

    def _finish(self) -> None:
        assert self.meter is not None
        if self.preflight is None:
            self.meter.stop()
            return
        self.comparison, self.row = finish_measurement(
            self.meter,
            self.preflight,
            self.measured_steps,
            self.record,
            self.calibration,
            self.script,
        )


def _trainer_class() -> str | None:
    """The class of the Trainer whose `train()` is running (from the call stack)."""
    frame: Any = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "callback_handler") and hasattr(owner, "args"):
            return type(owner).__name__
        frame = frame.f_back
    return None
