"""How transformers' causal-LM loss holds the logits, release by release, measured on CPU.

The loss functions are the releases' own code: the installed transformers, and for older
releases `ForCausalLMLoss` read out of the release's wheel from the package registry (pip's
cache keeps it after the first run). Each is run on real 16-bit logits under the storage
tracker; the bytes per logit alive when the loss returns its value (the forward's end, with the
caller still holding the logits, as a model's output does) must be what `logits_moments` says
for a setup naming that release.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from llmmem.budget.logits import logits_moments
from llmmem.budget.setup import Method, Precision, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.tracker import StorageTracker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheels import wheel_source  # noqa: E402

BATCH, SEQ, VOCAB, HIDDEN = 2, 128, 3000, 32


def _llama(model_type: str = "llama") -> Any:
    config = {
        "model_type": model_type,
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    return spec_from_config(config, model_id="tiny", source=ModelSource.CONFIG)


def _predicted_per_logit(release: str) -> float:
    setup = TrainingSetup(
        method=Method.LORA,
        batch=BATCH,
        seq=SEQ,
        precision=Precision.BF16,
        transformers_version=release,
    )
    return logits_moments(_llama(), setup).forward_end / (BATCH * SEQ * VOCAB)


def _measured_per_logit(loss_fn: Callable[..., torch.Tensor]) -> float:
    torch.manual_seed(0)
    head = nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.bfloat16)
    hidden = torch.randn(BATCH, SEQ, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    tracker = StorageTracker()
    with tracker:
        logits = head(hidden)  # held by the model's output while the loss runs
        loss = loss_fn(logits=logits, labels=labels, vocab_size=VOCAB)
        del logits
    assert torch.isfinite(loss)
    # small tensors beside the logits (labels, the shifted labels, the loss) are < 0.1 B/logit
    return tracker.peak / (BATCH * SEQ * VOCAB)


def _loss_from_wheel(release: str, tmp_root: Path) -> Callable[..., torch.Tensor]:
    """`ForCausalLMLoss` as the release's wheel has it, executed on its own (it needs only
    torch and `fixed_cross_entropy` beside it)."""
    source = wheel_source(tmp_root, "transformers", release, "transformers/loss/loss_utils.py")
    tree = ast.parse(source)
    wanted = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name in ("fixed_cross_entropy", "ForCausalLMLoss")
    ]
    assert len(wanted) == 2, f"transformers {release}: loss functions not found"
    module = ast.Module(body=wanted, type_ignores=[])
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "Optional": Any}
    exec(compile(module, f"transformers-{release}/loss_utils.py", "exec"), namespace)  # noqa: S102
    return namespace["ForCausalLMLoss"]


@pytest.fixture(scope="module")
def wheel_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("transformers-wheels")


def test_installed_transformers_loss_keeps_ten_bytes_per_logit_at_forward_end() -> None:
    """transformers >= 4.49 (here the installed release): 16-bit logits + fp32 upcast +
    fp32 log-softmax, no shifted copy (the labels are padded instead)."""
    import transformers
    from transformers.loss.loss_utils import ForCausalLMLoss

    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    measured = _measured_per_logit(ForCausalLMLoss)
    predicted = _predicted_per_logit(f"{major}.{minor}")
    assert predicted == 10
    assert measured == pytest.approx(predicted, abs=0.3)


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        ("4.46.0", 14),  # the first shared ForCausalLMLoss: upcast, then a shifted fp32 copy
        ("4.48.1", 14),  # the release the fms-acceleration tables ran on
        ("4.49.0", 10),  # labels padded, no copy
    ],
)
def test_released_loss_code_holds_what_the_budget_says(
    release: str, expected: int, wheel_root: Path
) -> None:
    measured = _measured_per_logit(_loss_from_wheel(release, wheel_root))
    predicted = _predicted_per_logit(release)
    assert predicted == expected
    assert measured == pytest.approx(predicted, abs=0.3)


def test_models_with_their_own_16bit_loss_before_4_49() -> None:
    """GPT-BigCode, GPT-NeoX, Falcon, BLOOM, OPT, ... computed cross-entropy on the 16-bit
    logits in their own forward until 4.49 (no upcast): logits, shifted copy and log-softmax in
    the logits' dtype. The same model on 4.49 goes through the shared fp32 loss."""

    def own_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
        # the op sequence of GPTBigCodeForCausalLM.forward at transformers 4.48.1
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return nn.CrossEntropyLoss()(
            shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1)
        )

    measured = _measured_per_logit(own_loss)
    spec = spec_from_config(
        {
            "model_type": "gpt_bigcode",
            "architectures": ["GPTBigCodeForCausalLM"],
            "n_embd": HIDDEN,
            "n_layer": 2,
            "n_head": 4,
            "n_inner": 64,
            "multi_query": True,
            "vocab_size": VOCAB,
            "n_positions": 512,
        },
        model_id="tiny-bigcode",
        source=ModelSource.CONFIG,
    )
    old = TrainingSetup(
        method=Method.FULL, batch=BATCH, seq=SEQ, precision="bf16-true", transformers_version="4.48"
    )
    new = TrainingSetup(
        method=Method.FULL, batch=BATCH, seq=SEQ, precision="bf16-true", transformers_version="4.49"
    )
    per_logit = BATCH * SEQ * VOCAB
    assert logits_moments(spec, old).forward_end / per_logit == 6
    assert measured == pytest.approx(6, abs=0.3)
    assert logits_moments(spec, new).forward_end / per_logit == 10
