"""What TRL's SFTTrainer does to a k-bit model it is given with a `peft_config`, release by
release (read in `trl/trainer/sft_trainer.py` of each wheel):

- up to 0.25 (checked 0.13.0, 0.15.2, 0.17.0, 0.19.0, 0.20.0, 0.21.0; from 0.22 the same code
  sits in `trl/models/utils.py` `prepare_peft_model`, checked 0.22.0-0.25.0):
  `prepare_model_for_kbit_training` (every parameter that is not quantized upcast to fp32), then
  `get_peft_model` (PEFT keeps the adapters in fp32), then, with `bf16=True`,
  `peft_module_casting_to_bf16`: the norms stay fp32, the embeddings and the head (fp32 after the
  preparation) go back to bf16. A model sharded at init (FSDP-QLoRA: its 4-bit parameters on the
  CPU or the meta device) skips the preparation and the casting, with
  `autocast_adapter_dtype=False`;
- from 0.26 (checked 0.26.0, 0.27.0, 0.29.1): no preparation; `get_peft_model`, then every
  trainable parameter of a k-bit model cast to bf16 (the adapters).

And what its preference trainers do with one (read in the 0.29.1 wheel, the release the
preference budgets follow; the same code in 1.16.0's `trl/experimental/`):

- DPOTrainer (trl/trainer/dpo_trainer.py:555-572): no preparation; `get_peft_model`, then every
  trainable parameter of a k-bit model cast to bf16;
- KTOTrainer, ORPOTrainer and CPOTrainer (SimPO's too; trl/experimental/{kto,orpo,cpo}/
  *_trainer.py, e.g. cpo_trainer.py:186-214): `prepare_model_for_kbit_training`, `get_peft_model`
  (fp32 adapters), then with `bf16=True` over a 4-bit model `peft_module_casting_to_bf16`: the
  norms stay fp32, the embeddings and the head go back to bf16.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.setup import Precision, QuantType, TrainingSetup, release

CASTS_ADAPTERS_FROM = (0, 26)
# the preference trainers that prepare a k-bit model themselves; DPOTrainer casts its adapters
PREPARING_PREFERENCE_TRAINERS = ("kto", "orpo", "cpo")
# `SFTTrainer.__init__` sets `gradient_checkpointing_kwargs.setdefault("use_reentrant", False)`
# from 0.28 (checked 0.28.0 and 0.29.1; absent in 0.13.0, 0.16.0, 0.20.0-0.27.0, where
# transformers' own default holds: reentrant up to 4.x)
NON_REENTRANT_FROM = (0, 28)


def sft_trainer_checkpointing(
    setup: TrainingSetup, trl_version: str
) -> tuple[TrainingSetup, str | None]:
    """`setup` with the checkpointing TRL `trl_version`'s SFTTrainer asks for, where nothing
    else said which (a script's own `use_reentrant` wins)."""
    if not setup.grad_ckpt or setup.reentrant_checkpointing is not None:
        return setup, None
    try:
        trl = release(trl_version)
    except ValueError:
        return setup, None
    if trl < NON_REENTRANT_FROM:
        return setup, None
    return (
        replace(setup, reentrant_checkpointing=False),
        f"trl {trl_version} SFTTrainer: non-reentrant gradient checkpointing",
    )


def sft_trainer_on_kbit(
    setup: TrainingSetup, trl_version: str, *, sharded: bool = False
) -> tuple[TrainingSetup, str | None]:
    """`setup` as TRL `trl_version`'s SFTTrainer leaves a k-bit model with LoRA adapters, and a
    note saying so; unchanged (no note) without a k-bit base and adapters."""
    quant, lora = setup.quant, setup.lora
    if quant is None or lora is None:
        return setup, None
    try:
        trl = release(trl_version)
    except ValueError:
        return setup, None
    if trl >= CASTS_ADAPTERS_FROM or sharded:
        setup = replace(
            setup,
            quant=replace(quant, prepare_for_kbit_training=False, embeddings_16bit=False),
            lora=replace(lora, adapter_bytes=2),
        )
        what = (
            "a model sharded at init is not prepared for k-bit training and its adapters stay in "
            "16 bits"
            if trl < CASTS_ADAPTERS_FROM
            else "no prepare_model_for_kbit_training; the adapters are cast to bf16"
        )
        return setup, f"trl {trl_version} SFTTrainer on a k-bit model: {what}"
    bf16 = setup.precision is Precision.BF16  # TrainingArguments(bf16=True): autocast
    setup = replace(
        setup,
        quant=replace(quant, prepare_for_kbit_training=True, embeddings_16bit=bf16),
        lora=replace(lora, adapter_bytes=4),
    )
    cast = (
        ", then the embeddings and the head back to bf16 (bf16=True)"
        if bf16
        else " (embeddings, norms and head in fp32)"
    )
    return setup, (
        f"trl {trl_version} SFTTrainer on a k-bit model: prepare_model_for_kbit_training{cast}; "
        "fp32 adapters"
    )


def preference_trainer_on_kbit(
    setup: TrainingSetup, objective: str
) -> tuple[TrainingSetup, str | None]:
    """`setup` as TRL 0.29.1's trainer of `objective` leaves a k-bit model it is given with a
    `peft_config`, and a note saying so; unchanged (no note) for the other objectives and
    without a k-bit base and adapters."""
    quant, lora = setup.quant, setup.lora
    if quant is None or lora is None:
        return setup, None
    if objective == "dpo":
        setup = replace(
            setup,
            quant=replace(quant, prepare_for_kbit_training=False, embeddings_16bit=False),
            lora=replace(lora, adapter_bytes=2),
        )
        return setup, (
            "TRL's DPOTrainer on a k-bit model: no prepare_model_for_kbit_training; its "
            "trainable parameters (the adapters) are cast to bf16"
        )
    if objective not in PREPARING_PREFERENCE_TRAINERS:
        return setup, None
    four_bit = quant.quant_type is not QuantType.INT8
    bf16 = setup.precision in (Precision.BF16, Precision.BF16_AUTOCAST) and four_bit
    setup = replace(
        setup,
        quant=replace(quant, prepare_for_kbit_training=True, embeddings_16bit=bf16),
        lora=replace(lora, adapter_bytes=4),
    )
    cast = (
        ", then the embeddings and the head back to bf16 (bf16=True)"
        if bf16
        else " (embeddings, norms and head in fp32)"
    )
    return setup, (
        f"TRL's {objective.upper()}Trainer on a k-bit model: prepare_model_for_kbit_training"
        f"{cast}; fp32 adapters"
    )
