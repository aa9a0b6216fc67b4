"""LitGPT's own stack (llmmem.budget.stacks.litgpt): where `litgpt finetune lora` holds other
tensors than the Hugging Face stack of the same model.

Each expected number is derived from LitGPT 0.4.0's, Lightning 2.3's and bitsandbytes' code (the
stack module's docstring cites it): a head of its own beside the embeddings (no tying), every
Linear 4-bit under `--quantize bnb.nf4` (the head too, quantized from fp16), the head dequantized
for each 128-position chunk, adapters in the model's dtype and no k-bit preparation.
"""

from __future__ import annotations

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import (
    Framework,
    LoraSetup,
    LossImpl,
    QuantSetup,
    TrainingSetup,
)
from llmmem.budget.stacks import own_inventory, stack_for
from llmmem.budget.weights import bitsandbytes_bytes, build_inventory
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource, ModelSpec


@pytest.fixture(scope="module")
def llama32_1b() -> ModelSpec:
    entry = catalog_entry("meta-llama/Llama-3.2-1B")
    assert entry is not None
    return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)


def litgpt(method: str = "lora", bnb: str = "0.42", **changes: object) -> TrainingSetup:
    values: dict[str, object] = {
        "method": method,
        "batch": 2,
        "seq": 512,
        "precision": "bf16-true",
        "optim": "adamw_torch",
        "loss": LossImpl.CHUNKED,
        "framework": Framework.LITGPT,
        "lora": LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"]),
    }
    if method == "qlora":
        values["quant"] = QuantSetup(bitsandbytes_version=bnb)
    values.update(changes)
    return TrainingSetup(**values)  # type: ignore[arg-type]


def test_a_tied_model_gets_a_head_of_its_own(llama32_1b: ModelSpec) -> None:
    """Llama 3.2 ties its head to the embeddings in transformers; LitGPT 0.4.0 builds
    `lm_head` beside `transformer.wte` (lora.py:504, :514): V·h more bf16 weights."""
    assert llama32_1b.tie_word_embeddings
    head = llama32_1b.vocab_size * llama32_1b.hidden_size
    own = estimate_budget(llama32_1b, litgpt())
    bf16_adapters = LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"], adapter_bytes=2)
    hf = estimate_budget(llama32_1b, litgpt(framework=Framework.HF, lora=bf16_adapters))
    assert own.params - hf.params == head
    own_weights, hf_weights = (
        budget.phase(Phase.FORWARD).components[Component.WEIGHTS].bytes for budget in (own, hf)
    )
    # and its RoPE cache: cos and sin, block_size × head_size each in fp32
    rope = 2 * llama32_1b.max_position_embeddings * llama32_1b.head_dim * 4
    assert own_weights - hf_weights == 2 * head + rope
    assert any("LitGPT ties no weights" in note for note in own.notes)


def test_adapters_stay_in_the_models_dtype_without_kbit_preparation() -> None:
    prepared = stack_for(Framework.LITGPT).prepare(litgpt("qlora"))
    assert prepared.lora is not None and prepared.lora.adapter_bytes == 2
    assert prepared.quant is not None and not prepared.quant.prepare_for_kbit_training


def test_lightnings_plugin_quantizes_the_head_too(llama32_1b: ModelSpec) -> None:
    setup = stack_for(Framework.LITGPT).prepare(litgpt("qlora"))
    stack = stack_for(Framework.LITGPT)
    spec = stack.model(llama32_1b, setup)  # type: ignore[attr-defined]
    inv = own_inventory(stack, spec, setup, build_inventory(spec, setup))
    (head,) = [g for g in inv.groups if g.kind == "head"]
    assert head.quantized
    assert setup.quant is not None
    assert head.bytes_per_param == bitsandbytes_bytes(setup.quant, head.cols, head.rows)
    (embedding,) = [g for g in inv.groups if g.kind == "embedding"]
    assert not embedding.quantized and embedding.bytes_per_param == 2


@pytest.mark.parametrize(("bnb", "forward_bytes"), [("0.42", 4), ("0.50", 2)])
def test_each_chunk_dequantizes_the_whole_head(
    llama32_1b: ModelSpec, bnb: str, forward_bytes: int
) -> None:
    """bitsandbytes 0.42's forward dequantizes to fp16 and casts to bf16 (4 B a value alive);
    from 0.46 `gemm_4bit` dequantizes straight to bf16 (2 B); backward does fp16 and the cast
    in both. The first step, with no previous step's tensors beside its head
    (test_bitsandbytes_releases.py)."""
    head = llama32_1b.vocab_size * llama32_1b.hidden_size
    stack = stack_for(Framework.LITGPT)
    setup = stack.prepare(litgpt("qlora", bnb, first_step=True))
    spec = stack.model(llama32_1b, setup)  # type: ignore[attr-defined]
    moments = stack.loss(spec, setup)
    assert moments is not None
    plain = stack.loss(spec, stack.prepare(litgpt("lora")))
    assert plain is not None
    assert moments.moments.head_backward - plain.moments.head_backward == 4 * head
    e_nv = 2 * setup.tokens * llama32_1b.vocab_size
    assert moments.moments.forward_end == max(
        plain.moments.forward_end, e_nv + forward_bytes * head
    )
    budget = estimate_budget(llama32_1b, setup)
    assert "head dequantized" in budget.phase(Phase.BACKWARD).components[Component.LOGITS].formula


def test_the_framework_changes_the_qlora_budget(llama32_1b: ModelSpec) -> None:
    own = estimate_budget(llama32_1b, litgpt("qlora"))
    hf = estimate_budget(llama32_1b, litgpt("qlora", framework=Framework.HF))
    assert own.allocated_peak_bytes != hf.allocated_peak_bytes
    assert any("Lightning's bitsandbytes plugin" in note for note in own.notes)


def test_the_fused_qkv_drops_its_input_once(llama32_1b: ModelSpec) -> None:
    """LitGPT's LoRAQKVLinear has one lora_A for its adapted q and v parts, fed one dropped copy
    of the block's normalised input (litgpt/lora.py:421 at 0.4.0; the same in lit-gpt's 2023
    scripts): per block one bool mask and one bf16 copy, N·h each, not one per adapted part
    (bench/litgpt_steps.py's `lora dropout` case read +4.1% with two, +1.3% with one). Without
    dropout lora_A keeps the normalised input itself (the frozen q, k, v keep nothing), so the
    step with dropout holds 1 + 2 - 2 bytes more per N·h and block."""
    from dataclasses import replace

    plain = litgpt()
    assert plain.lora is not None
    dropped = replace(plain, lora=replace(plain.lora, dropout=0.05))

    def forward_activations(setup: TrainingSetup) -> int:
        phases = estimate_budget(llama32_1b, setup).phases
        forward = next(p for p in phases if p.phase is Phase.FORWARD)
        return forward.components[Component.ACTIVATIONS].bytes

    tokens, hidden, layers = 2 * 512, 2048, 16
    once = layers * tokens * hidden * (1 + 2 - 2)  # the mask and the copy, not the input
    assert forward_activations(dropped) - forward_activations(plain) == once


@pytest.mark.parametrize(("batch", "copies"), [(2, 2), (1, 1)])
def test_finetune_full_keeps_the_whole_logits_beside_the_losss_copy(
    llama32_1b: ModelSpec, batch: int, copies: int
) -> None:
    """`finetune full` calls the model without `lm_head_chunk_size` (finetune/full.py:237): the
    whole logits stay bound to the loop's `logits` while `chunked_cross_entropy` reshapes the
    shifted slice (a copy for more than one row; one row's slice is a view) and keeps every
    128-row chunk's bf16 log-softmax (utils.py:279-297). Measured on the CPU
    (bench/litgpt_steps.py `full`: -1.4% at 2 x 256, -2.0% at 1 x 1024, where the chunked-head
    rule of `finetune lora` read -5.7% and +10.5%)."""
    stack = stack_for(Framework.LITGPT)
    setup = stack.prepare(litgpt("full", batch=batch, seq=1024, lora=None))
    spec = stack.model(llama32_1b, setup)  # type: ignore[attr-defined]
    moments = stack.loss(spec, setup)
    assert moments is not None
    vocab = llama32_1b.vocab_size
    whole, shifted = 2 * batch * 1024 * vocab, 2 * batch * 1023 * vocab
    assert moments.moments.forward_end == whole + copies * shifted
    assert moments.moments.backward_start == 2 * whole + shifted
    assert "the whole logits" in moments.moments.formula_forward


@pytest.mark.parametrize(
    ("script", "whole"),
    [("finetune_full", True), ("pretrain", False)],
)
def test_the_litgpt_script_decides_how_the_head_runs(
    tmp_path: object, script: str, whole: bool
) -> None:
    """`litgpt finetune full` keeps the whole logits beside the loss's copy; `pretrain`
    (pretrain.py:294-295: no slice, the reshape a view) is sized with the chunked rule.
    The script comes from the command line (`finetune adapter` is refused:
    tests/rules/test_refusal.py)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder = Path(str(tmp_path))
    (folder / "c.yaml").write_text(
        "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\n"
        "train:\n  micro_batch_size: 2\n  max_seq_length: 512\n"
    )
    words = script.replace("_", " ")
    (folder / "train.sh").write_text(f"litgpt {words} --config c.yaml\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(folder / "train.sh"), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ},
    )
    forward = json.loads(done.stdout)["budget"]["phases"]["forward"]
    logits = forward["components"]["logits"]
    vocab = 128256  # Llama 3.2's, untied by LitGPT
    whole_logits = 2 * 2 * 512 * vocab
    shifted = 2 * 2 * 511 * vocab
    if whole:
        assert logits == whole_logits + 2 * shifted
    else:
        assert logits < whole_logits + 2 * shifted
