"""`llmmem explain` on LLaMA-Factory preference YAMLs gives the peaks LLaMA-Factory's own trainers
reached. The figures were measured by bench/llamafactory_trainers.py: LLaMA-Factory 0.9.5's
CustomDPOTrainer and CustomKTOTrainer run for two steps on the CPU in fp32 (a Llama of 4 blocks,
hidden 512, vocabulary 32000; 2 pairs of 128 tokens; foreach AdamW), the second step's peak up to
the optimizer and the optimizer step's, in MiB, with the contiguous copy its log_softmax kernel
makes of the strided logits view counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmmem.cli import main

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}

# (stage, pref_loss, finetuning_type, gradient checkpointing): (step, optimizer step) measured,
# MiB; KTO's batch is 2 examples (and their KL rows)
MEASURED = {
    ("dpo", "sigmoid", "full", True): (1011.22, 1039.61),
    ("dpo", "sigmoid", "lora", True): (490.16, 174.54),
    ("dpo", "sigmoid", "lora", False): (545.61, 174.54),
    ("dpo", "orpo", "full", False): (792.50, 866.34),
    ("dpo", "orpo", "lora", True): (365.63, 174.54),
    ("dpo", "simpo", "full", True): (713.42, 866.34),
    ("kto", "", "full", True): (883.44, 1039.61),
    ("kto", "", "lora", False): (391.11, 174.54),
}


def _yaml(model: Path, stage: str, loss: str, method: str, ckpt: bool) -> str:
    lines = [
        # on the CPU LLaMA-Factory computes in fp32; a YAML without bf16 is read as bf16
        "# llmmem: precision=fp32",
        f"model_name_or_path: {model}",
        f"stage: {stage}",
        "do_train: true",
        f"finetuning_type: {method}",
        "dataset: pairs",
        "template: empty",
        "cutoff_len: 128",
        "per_device_train_batch_size: 2",
        "optim: adamw_torch",
        "bf16: false",
    ]
    if loss:
        lines.append(f"pref_loss: {loss}")
    if method == "lora":
        lines += ["lora_rank: 8", "lora_target: q_proj,v_proj"]
    if not ckpt:
        lines.append("disable_gradient_checkpointing: true")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("stage", "loss", "method", "ckpt"), sorted(MEASURED))
def test_llamafactory_preference_yaml_matches_its_trainer(
    stage: str,
    loss: str,
    method: str,
    ckpt: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LLMMEM_RUN_ENV", raising=False)
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    path = tmp_path / "train.yaml"
    path.write_text(_yaml(model, stage, loss, method, ckpt))
    assert main(["explain", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == [] and report["plan"]["problems"] == []
    phases = {k: v["allocated_bytes"] / 2**20 for k, v in report["budget"]["phases"].items()}
    optimizer = phases.pop("optimizer_step")
    step, measured_optimizer = MEASURED[(stage, loss, method, ckpt)]
    assert max(phases.values()) == pytest.approx(step, rel=0.01)
    assert optimizer == pytest.approx(measured_optimizer, rel=0.01)
    # ORPO and SimPO run no reference; DPO and KTO do
    assert ("reference_forward" in phases) == (loss in ("sigmoid", ""))
