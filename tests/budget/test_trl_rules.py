"""What TRL's SFTTrainer does to a k-bit model with LoRA adapters, release by release, run on
the CPU with real transformers, bitsandbytes and peft (llmmem.budget.trl_rules).

TRL itself is not installed (it would pull its own stack); its code is read out of the
releases' wheels from the package registry (pip's cache keeps them after the first run):
TRL 0.21.0's `peft_module_casting_to_bf16` is executed on the model as the trainer runs it,
and TRL 0.29.1's `SFTTrainer.__init__` is checked to call no `prepare_model_for_kbit_training`
and to cast the trainable parameters of a k-bit model to bf16, which the test then does. The
dtypes the parameters end with must be the ones the budget's inventory holds for a setup that
names that release.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from llmmem.budget.setup import (  # noqa: E402
    LoraSetup,
    Method,
    Precision,
    QuantSetup,
    TrainingSetup,
)
from llmmem.budget.trl_rules import sft_trainer_on_kbit  # noqa: E402
from llmmem.budget.weights import build_inventory  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402
from llmmem.verify.request import StepRequest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheels import wheel_source  # noqa: E402

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trl-wheels")


def _source(wheels: Path, release: str, member: str) -> str:
    return wheel_source(wheels, "trl", release, member)


def _kbit_model(prepare: bool) -> Any:
    """A tiny Llama loaded in 4 bits as a QLoRA script loads it (the verify runner's path),
    prepared for k-bit training or not, then given LoRA adapters by peft."""
    import transformers

    from llmmem.verify.building import _apply_lora, _kbit_model

    request = StepRequest(
        model_id="tiny",
        architecture="LlamaForCausalLM",
        config=dict(CONFIG),
        batch=1,
        seq=16,
        precision="bf16",
        quant={
            "quant_type": "nf4",
            "double_quant": True,
            "compute_dtype_bytes": 2,
            "prepare": prepare,
        },  # fmt: skip
        lora={"r": 8, "alpha": 16, "targets": TARGETS},
        device="cpu",
    )
    model = _kbit_model(request, "cpu", [], torch, transformers)
    return _apply_lora(model, request)


def _dtype_bytes(model: Any) -> dict[str, int]:
    """Bytes per parameter of the embeddings, the head, the norms and the adapters."""
    kinds: dict[str, int] = {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            kind = "adapter"
        elif "embed_tokens" in name:
            kind = "embeddings"
        elif "lm_head" in name:
            kind = "lm_head"
        elif "norm" in name:
            kind = "norms"
        else:
            continue
        size = param.element_size()
        assert kinds.setdefault(kind, size) == size, f"{kind}: mixed dtypes"
    return kinds


def _budget_bytes(trl_release: str) -> dict[str, float]:
    spec = spec_from_config(dict(CONFIG), model_id="tiny", source=ModelSource.CONFIG)
    setup = TrainingSetup(
        method=Method.QLORA,
        precision=Precision.BF16,
        lora=LoraSetup(r=8, alpha=16, targets=TARGETS),
        quant=QuantSetup(double_quant=True),
    )
    setup, note = sft_trainer_on_kbit(setup, trl_release)
    assert note and f"trl {trl_release}" in note
    inventory = build_inventory(spec, setup)
    out: dict[str, float] = {}
    for group in inventory.groups:
        kind = "adapter" if group.kind == "adapter" else group.name
        if kind in ("embeddings", "lm_head", "norms", "adapter"):
            out[kind] = group.bytes_per_param
    return out


def test_trl_0_21_prepares_then_casts_embeddings_and_head_back_to_bf16(wheels: Path) -> None:
    sft = _source(wheels, "0.21.0", "trl/trainer/sft_trainer.py")
    assert "prepare_model_for_kbit_training(" in sft and "peft_module_casting_to_bf16(" in sft
    utils = _source(wheels, "0.21.0", "trl/trainer/utils.py")
    tree = ast.parse(utils)
    wanted = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "peft_module_casting_to_bf16"
    ]
    assert wanted, "trl 0.21.0: peft_module_casting_to_bf16 not found"
    namespace: dict[str, Any] = {"torch": torch}
    code = compile(ast.Module(body=wanted, type_ignores=[]), "trl-0.21.0/utils.py", "exec")
    exec(code, namespace)  # noqa: S102

    model = _kbit_model(prepare=True)  # what _prepare_peft_model does first (not sharded)
    namespace["peft_module_casting_to_bf16"](model)  # then, with bf16=True
    measured = _dtype_bytes(model)
    assert measured == {"embeddings": 2, "lm_head": 2, "norms": 4, "adapter": 4}
    assert _budget_bytes("0.21.0") == measured


def test_trl_0_29_casts_the_adapters_to_bf16_and_does_not_prepare(wheels: Path) -> None:
    sft = _source(wheels, "0.29.1", "trl/trainer/sft_trainer.py")
    assert "prepare_model_for_kbit_training(" not in sft
    assert 'getattr(model, "is_loaded_in_4bit", False)' in sft
    assert "param.data = param.data.to(torch.bfloat16)" in sft

    model = _kbit_model(prepare=False)
    # SFTTrainer.__init__ at 0.29.1, for a model loaded in 4 or 8 bits
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.to(torch.bfloat16)
    measured = _dtype_bytes(model)
    assert measured == {"embeddings": 2, "lm_head": 2, "norms": 2, "adapter": 2}
    assert _budget_bytes("0.29.1") == measured


@pytest.mark.parametrize("release", ["0.21.0", "0.29.1"])
def test_verify_builds_the_model_as_the_release_leaves_it(release: str) -> None:
    """`llmmem verify` runs the step on the model the budget describes: the request made from
    a setup under a TRL release loads, prepares and casts as that release does."""
    import transformers

    from llmmem.verify.building import _kbit_model
    from llmmem.verify.compare import request_for

    spec = spec_from_config(dict(CONFIG), model_id="tiny", source=ModelSource.CONFIG)
    setup = TrainingSetup(
        method=Method.QLORA,
        precision=Precision.BF16,
        lora=LoraSetup(r=8, alpha=16, targets=TARGETS),
        quant=QuantSetup(double_quant=True),
    )
    setup, _ = sft_trainer_on_kbit(setup, release)
    request = request_for(spec, setup, dict(CONFIG), "cpu")
    model = _kbit_model(request, "cpu", [], torch, transformers)
    assert _dtype_bytes(model) == _budget_bytes(release)
