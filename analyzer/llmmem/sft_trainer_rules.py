"""TRL's SFTTrainer around a setup, written once for both roads: a file whose trainer is
`SFTTrainer` (llmmem.scenario) and `llmmem estimate --framework trl` of a supervised step
(llmmem.estimate_command), each with the TRL release the run uses. The release's rules
themselves are llmmem.budget.trl_rules'."""

from __future__ import annotations

from dataclasses import dataclass

from llmmem.budget.setup import TrainingSetup
from llmmem.budget.trl_rules import sft_trainer_checkpointing, sft_trainer_on_kbit


@dataclass(frozen=True, slots=True, kw_only=True)
class SftTrainerSetup:
    """The setup as the SFTTrainer leaves it, and a note for each rule that changed it."""

    setup: TrainingSetup
    checkpointing_note: str | None
    kbit_note: str | None


def with_sft_trainer(
    setup: TrainingSetup, trl_version: str, *, kbit_stated: bool
) -> SftTrainerSetup:
    """The checkpointing TRL `trl_version`'s SFTTrainer asks for and, over a k-bit base with
    adapters, the preparation and the adapters' dtype it leaves them in, unless the run states
    them itself (`kbit_stated`: a script's own prepare_model_for_kbit_training, estimate's
    --kbit-prepare or --adapter-dtype). A model FSDP shards at init (a float storage dtype)
    is not prepared."""
    setup, checkpointing_note = sft_trainer_checkpointing(setup, trl_version)
    kbit_note = None
    if not kbit_stated and setup.quant is not None and setup.lora is not None:
        sharded = setup.distributed.fsdp is not None and setup.quant.storage_shardable
        setup, kbit_note = sft_trainer_on_kbit(setup, trl_version, sharded=sharded)
    return SftTrainerSetup(setup=setup, checkpointing_note=checkpointing_note, kbit_note=kbit_note)
