"""`llmmem explain` on every file in examples/: each is read and sized without a problem, and a
preference example shows its method, how the reference log-probabilities are made and the
phases of its step, as the example's own description says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmmem.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_FILES = sorted(
    path for path in EXAMPLES.iterdir() if path.suffix in (".py", ".yaml", ".yml", ".json")
)

# what each example says it trains: (method, reference handling) or None for SFT; the phases
# follow from them (a reference forward where there is a reference, generation for GRPO)
EXPECTED: dict[str, tuple[str, str] | None] = {
    "axolotl_dpo.yaml": ("dpo", "copy"),  # full fine-tuning: TRL loads a second model
    "dpo_full.py": ("dpo", "copy"),
    "dpo_lora.py": ("dpo", "adapter"),  # the PEFT model with its adapter disabled
    "llamafactory_dpo.yaml": ("dpo", "adapter"),
    "grpo_vllm_colocate.py": ("grpo", "none"),  # beta left at 0.0
    "verl_grpo.yaml": ("grpo", "none"),  # use_kl_loss: false
    "ppo_lora.py": ("ppo", "adapter"),  # PPOTrainer under PEFT: the adapter disabled
    "full_finetune.py": None,
    "qlora_sft.py": None,
}
PHASES = {
    "sft": {"forward", "backward", "optimizer_step"},
    "dpo": {"forward", "reference_forward", "backward", "optimizer_step"},
    "grpo": {"generate", "forward", "backward", "optimizer_step"},
    "ppo": {"generate", "reference_forward", "forward", "backward", "optimizer_step"},
}


def _explain(capsys: pytest.CaptureFixture[str], path: Path, *options: str) -> str:
    code = main(["explain", str(path), "--gpu", "A100-80GB", *options])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def test_every_example_has_its_expectation() -> None:
    assert {path.name for path in EXAMPLE_FILES} == set(EXPECTED)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda path: path.name)
def test_each_example_is_explained(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = EXPECTED[path.name]
    out = json.loads(_explain(capsys, path, "--format", "json"))
    assert out["problems"] == [] and out["plan"]["problems"] == []
    budget = out["budget"]
    assert budget is not None and budget["allocated_peak_bytes"] > 0
    objective = out["plan"]["objective"]
    if expected is None:
        assert objective is None
        assert set(budget["phases"]) == PHASES["sft"]
        return
    method, reference = expected
    assert objective["value"] == method
    assert PHASES[method] <= set(budget["phases"])
    copy = budget["components"].get("reference_model", 0)
    if method != "ppo":  # PPO's frozen reward model is counted there too
        assert (copy > 0) == (reference == "copy")

    monkeypatch.setenv("COLUMNS", "240")  # one table row per line
    text = _explain(capsys, path)
    rows = {
        cells[0]: cells[1:]
        for cells in (
            [cell.strip() for cell in line.strip("│ ").split("│")]
            for line in text.splitlines()
            if line.startswith("│")
        )
    }
    assert rows["method"][0] == method
    assert re.match(rf"{reference}: ", rows["reference model"][0]), rows["reference model"]


def test_the_ppo_example_shows_its_four_models_and_phases(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    text = _explain(capsys, EXAMPLES / "ppo_lora.py")
    flat = " ".join(text.split())  # notes wrap
    four = flat[flat.index("ppo: four models") :]
    for model in (
        "policy Qwen/Qwen2.5-1.5B-Instruct (its LoRA adapter trains)",
        # the script loads both from reward_path: named and sized from it
        "value model Qwen/Qwen2.5-1.5B-Instruct, a sequence-classification model",
        "reference the policy with its adapter disabled",
        "reward Qwen/Qwen2.5-1.5B-Instruct, frozen",
    ):
        assert model in four, four
    for phase in PHASES["ppo"]:
        assert re.search(rf"^ {phase} ", text, re.MULTILINE), phase
