"""Fixes of preference and GRPO plans: the reference log-probabilities precomputed (DPO, KTO),
the colocated vLLM engine given less of the GPU or put to sleep while the policy trains (GRPO).

Each is checked the way a user would: the fix is in the list for a file that does not fit, the
file it writes still parses, and `llmmem explain` on that file prints the total the title
promised and no longer has what the fix removes (the reference forward, the engine's share
during training).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmmem.check import check_text
from llmmem.cli import main
from llmmem.rules.finding import Fix
from llmmem.rules.text_edits import apply_edits
from llmmem.units import format_bytes

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / "tests" / "fixtures" / "python" / "preference"
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
EXAMPLES = ROOT / "examples"

PRECOMPUTE = "Precompute the reference log-probs"
SHARE = "Give the colocated vLLM engine less of the GPU"
SLEEP = "Put the vLLM engine to sleep while the policy trains"
GIB = 2**30


@pytest.fixture(autouse=True)
def _trl_0_29(trl_release: Callable[[str], Path]) -> None:
    """The fixes' totals are the preference and GRPO budgets' at TRL 0.29.1, the release they
    restate (1.15 on, the tests' own release, takes the log-probabilities through a fused LM
    head, and these files fit without the fixes)."""
    trl_release("0.29.1")


def fixes_of(path: Path, text: str, gpu: str | None = None) -> list[Fix]:
    checked = check_text(path, text, gpu=gpu, hub=False)
    return [fix for finding in checked.findings for fix in finding.fixes]


def the_fix(path: Path, text: str, title: str, gpu: str | None = None) -> Fix:
    found = [fix for fix in fixes_of(path, text, gpu) if fix.title.startswith(title)]
    assert found, [fix.title for fix in fixes_of(path, text, gpu)]
    return found[0]


def explained(
    path: Path, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], gpu: str | None
) -> dict[str, Any]:
    """`llmmem explain --format json` on `text` written where a user's file would be."""
    target = tmp_path / path.name
    target.write_text(text, encoding="utf-8")
    capsys.readouterr()
    main(["explain", str(target), "--format", "json", *(["--gpu", gpu] if gpu else [])])
    budget: dict[str, Any] = json.loads(capsys.readouterr().out)["budget"]
    return budget


def check_applied(
    path: Path,
    fix: Fix,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    gpu: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The fixed text and explain's budget of it, after checking that the title's total is
    explain's and lower than the file's own."""
    text = path.read_text(encoding="utf-8")
    before = explained(path, text, tmp_path, capsys, gpu)
    fixed = apply_edits(text, fix.edits)
    after = explained(path, fixed, tmp_path, capsys, gpu)
    assert f"→ {format_bytes(after['device_total_bytes'])}" in fix.title, fix.title
    assert after["device_total_bytes"] < before["device_total_bytes"]
    assert fix.predicted_device_bytes == after["device_total_bytes"]
    return fixed, after


def keywords_of(text: str, callee: str) -> dict[str, Any]:
    """The literal keywords of the one call to `callee` in a script (it must parse); a
    keyword given a name (`deepspeed=zero3`) as the name."""
    tree = ast.parse(text)
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        if node.func.id == callee
    ]
    assert len(calls) == 1
    names = [kw.arg for kw in calls[0].keywords]
    assert len(names) == len(set(names)), names  # no keyword written twice
    return {
        kw.arg: kw.value.id if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value)
        for kw in calls[0].keywords
        if kw.arg
    }


# --- DPO and KTO: the reference log-probabilities read from the dataset


def test_dpo_as_trl_documents_it_gets_the_reference_precomputed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = PYTHON / "trl_dpo_quickstart.py"  # full fine-tuning: a frozen copy as the reference
    text = path.read_text(encoding="utf-8")
    before = explained(path, text, tmp_path, capsys, None)
    assert before["fits"] is False
    assert "reference_forward" in before["phases"]

    fix = the_fix(path, text, PRECOMPUTE)
    assert fix.safe  # the same training, the reference pass made once before it
    fixed, after = check_applied(path, fix, tmp_path, capsys)
    assert keywords_of(fixed, "DPOConfig")["precompute_ref_log_probs"] is True
    assert "reference_forward" not in after["phases"]
    assert after["fits"] is True
    # the frozen copy's weights are gone from the step: at least the 16-bit weights of 0.49B
    assert before["device_total_bytes"] - after["device_total_bytes"] > 0.9 * GIB


def test_kto_flag_written_false_is_turned_on_where_it_stands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = PYTHON / "trl_kto_quickstart.py"
    text = path.read_text(encoding="utf-8")
    fix = the_fix(path, text, PRECOMPUTE)
    fixed, _ = check_applied(path, fix, tmp_path, capsys)
    assert keywords_of(fixed, "KTOConfig")["precompute_ref_log_probs"] is True
    assert fixed.count("precompute_ref_log_probs") == 1


@pytest.mark.parametrize("example", ["dpo_full.py", "dpo_lora.py"])
def test_examples_dpo_precompute_is_offered_where_it_does_not_fit(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / example
    fix = the_fix(path, path.read_text(encoding="utf-8"), PRECOMPUTE, gpu="RTX-4090")
    fixed, after = check_applied(path, fix, tmp_path, capsys, gpu="RTX-4090")
    assert keywords_of(fixed, "DPOConfig")["precompute_ref_log_probs"] is True
    assert "reference_forward" not in after["phases"]


def test_no_precompute_fix_once_the_file_precomputes() -> None:
    path = PYTHON / "trl_dpo_quickstart.py"
    text = path.read_text(encoding="utf-8").replace(
        "per_device_train_batch_size=8)",
        "per_device_train_batch_size=8, precompute_ref_log_probs=True)",
    )
    titles = [fix.title for fix in fixes_of(path, text, gpu="8GiB")]
    assert titles  # it still does not fit on 8 GiB: other fixes are offered
    assert not any(title.startswith(PRECOMPUTE) for title in titles)


def test_objectives_without_a_reference_get_no_precompute_fix() -> None:
    path = PYTHON / "trl_dpo_quickstart.py"
    text = (
        path.read_text(encoding="utf-8")
        .replace("DPOConfig", "ORPOConfig")
        .replace("DPOTrainer", "ORPOTrainer")
    )
    titles = [fix.title for fix in fixes_of(path, text, gpu="8GiB")]
    assert titles
    assert not any(title.startswith(PRECOMPUTE) for title in titles)


# --- GRPO with vLLM colocated


def test_grpo_colocate_share_is_halved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "grpo_vllm_colocate.py"
    text = path.read_text(encoding="utf-8")
    written = float(re.search(r"vllm_gpu_memory_utilization=([0-9.]+)", text).group(1))  # type: ignore[union-attr]
    before = explained(path, text, tmp_path, capsys, "12GiB")
    assert before["fits"] is False

    fix = the_fix(path, text, SHARE, gpu="12GiB")
    assert not fix.safe  # a smaller KV cache for generation: the user decides
    fixed, after = check_applied(path, fix, tmp_path, capsys, gpu="12GiB")
    share = keywords_of(fixed, "GRPOConfig")["vllm_gpu_memory_utilization"]
    assert share == pytest.approx(written / 2)
    assert f"vllm_gpu_memory_utilization={share:g}" in fix.title
    engine = after["phases"]["generate"]["components"]["vllm_engine"]
    assert engine == pytest.approx(share * 12 * GIB, abs=1)


def test_grpo_colocate_sleep_mode_frees_the_engine_while_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLES / "grpo_vllm_colocate.py"
    text = path.read_text(encoding="utf-8")
    fix = the_fix(path, text, SLEEP, gpu="12GiB")
    fixed, after = check_applied(path, fix, tmp_path, capsys, gpu="12GiB")
    assert keywords_of(fixed, "GRPOConfig")["vllm_enable_sleep_mode"] is True
    phases = after["phases"]
    assert "vllm_engine" in phases["generate"]["components"]
    training = [name for name in phases if name != "generate"]
    assert training
    assert all("vllm_engine" not in phases[name]["components"] for name in training)


def test_grpo_default_share_is_written_into_the_config_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = PYTHON / "trl_grpo_colocate_default_share.py"  # no share written: TRL's 0.3
    text = path.read_text(encoding="utf-8")
    fix = the_fix(path, text, SHARE)
    fixed, _ = check_applied(path, fix, tmp_path, capsys)
    assert keywords_of(fixed, "GRPOConfig")["vllm_gpu_memory_utilization"] == pytest.approx(0.15)


def test_grpo_share_keeps_room_for_the_engines_weights() -> None:
    """Halving 0.3 of 16 GiB (2.4 GiB) would not hold the 16-bit weights of Qwen2.5-1.5B
    (1.54B parameters, 3.1 GB): the share written holds them and their KV cache."""
    path = EXAMPLES / "grpo_vllm_colocate.py"
    text = path.read_text(encoding="utf-8").replace("Qwen2.5-0.5B", "Qwen2.5-1.5B")
    fix = the_fix(path, text, SHARE, gpu="16GiB")
    share = keywords_of(apply_edits(text, fix.edits), "GRPOConfig")["vllm_gpu_memory_utilization"]
    assert 0.15 < share < 0.3
    assert share * 16 * GIB > 2 * 1.54e9


@pytest.mark.parametrize(
    "change",
    [
        ('vllm_mode="colocate"', 'vllm_mode="server"'),  # the engine on other GPUs
        ("use_vllm=True", "use_vllm=False"),  # the policy generates
    ],
)
def test_grpo_without_a_colocated_engine_gets_no_engine_fix(change: tuple[str, str]) -> None:
    path = EXAMPLES / "grpo_vllm_colocate.py"
    text = path.read_text(encoding="utf-8").replace(*change)
    titles = [fix.title for fix in fixes_of(path, text, gpu="8GiB")]
    assert titles
    assert not any(title.startswith((SHARE, SLEEP)) for title in titles)


# --- configs: the framework's own keys


def config_fix(path: Path, title: str, gpu: str) -> tuple[Fix, dict[str, Any], dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    fix = the_fix(path, text, title, gpu=gpu)
    fixed = apply_edits(text, fix.edits)
    after = check_text(path, fixed, gpu=gpu, hub=False).analysis.budget
    assert after is not None
    assert f"→ {format_bytes(after.device_total_bytes)}" in fix.title
    return fix, yaml.safe_load(text), yaml.safe_load(fixed)


def test_axolotl_dpo_writes_precompute_ref_log_probs() -> None:
    _, before, after = config_fix(EXAMPLES / "axolotl_dpo.yaml", PRECOMPUTE, "H100-80GB")
    assert after["precompute_ref_log_probs"] is True
    assert {k: v for k, v in after.items() if k != "precompute_ref_log_probs"} == before


def test_axolotl_grpo_lowers_the_share_where_the_file_sets_it() -> None:
    _, before, after = config_fix(CONFIGS / "axolotl_grpo.yaml", SHARE, "16GiB")
    assert after["vllm"]["gpu_memory_utilization"] < before["vllm"]["gpu_memory_utilization"]
    assert after["trl"] == before["trl"]


def test_llamafactory_dpo_has_no_precompute_key() -> None:
    """LLaMA-Factory's DPO stage has no setting for precomputed reference log-probabilities:
    no fix writes a key it would ignore."""
    path = EXAMPLES / "llamafactory_dpo.yaml"
    titles = [fix.title for fix in fixes_of(path, path.read_text(encoding="utf-8"), "8GiB")]
    assert titles
    assert not any(title.startswith(PRECOMPUTE) for title in titles)


def test_dpo_without_checkpointing_gets_it_with_explains_total(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TRL's DPOConfig checkpoints by default; a script that turns it off is offered it back,
    titled with the total of the file it writes."""
    path = PYTHON / "trl_dpo_quickstart.py"
    text = path.read_text(encoding="utf-8").replace(
        "per_device_train_batch_size=8)",
        "per_device_train_batch_size=8, gradient_checkpointing=False)",
    )
    changed = tmp_path / "changed"
    changed.mkdir()
    source = changed / path.name
    source.write_text(text, encoding="utf-8")
    fix = the_fix(source, text, "Enable gradient checkpointing")
    fixed, _ = check_applied(source, fix, tmp_path, capsys)
    assert keywords_of(fixed, "DPOConfig")["gradient_checkpointing"] is True


# --- LoRA: the policy with its adapter disabled as the reference

OWN_REFERENCE = "Use the policy with its adapter disabled as the reference"


def test_lora_dpo_drops_its_reference_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = PYTHON / "trl_dpo_lora_own_reference.py"
    text = path.read_text(encoding="utf-8")
    before = explained(path, text, tmp_path, capsys, None)
    assert before["fits"] is False
    fix = the_fix(path, text, OWN_REFERENCE)
    fixed, after = check_applied(path, fix, tmp_path, capsys)
    tree = ast.parse(fixed)
    trainer = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "DPOTrainer"
    )
    assert [ast.unparse(arg) for arg in trainer.args] == ["model"]
    assert "ref_model" not in fixed  # its load is gone too: nothing else read it
    assert fixed.count("AutoModelForCausalLM.from_pretrained(") == 1
    # the 16-bit copy of Qwen2.5-7B (7.6B parameters) is no longer on the GPU
    assert before["device_total_bytes"] - after["device_total_bytes"] > 14e9


def test_a_reference_from_another_checkpoint_is_kept() -> None:
    """A reference that is another model (an SFT checkpoint) is part of the objective: no fix
    swaps it for the base model."""
    path = PYTHON / "trl_dpo_lora_own_reference.py"
    text = path.read_text(encoding="utf-8").replace(
        'ref_model = AutoModelForCausalLM.from_pretrained(model_id, dtype="bfloat16")',
        'ref_model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B", dtype="bfloat16")',
    )
    titles = [fix.title for fix in fixes_of(path, text)]
    assert titles
    assert not any(title.startswith(OWN_REFERENCE) for title in titles)


def test_full_fine_tuning_keeps_its_reference_copy() -> None:
    path = PYTHON.parent / "trl_dpo.py"  # full fine-tuning with ref_model given
    titles = [fix.title for fix in fixes_of(path, path.read_text(encoding="utf-8"), "8GiB")]
    assert titles
    assert not any(title.startswith(OWN_REFERENCE) for title in titles)


def test_axolotl_grpo_sleep_mode_is_added_to_its_trl_block() -> None:
    _, before, after = config_fix(CONFIGS / "axolotl_grpo.yaml", SLEEP, "16GiB")
    assert after["trl"] == {**before["trl"], "vllm_enable_sleep_mode": True}
    assert {k: v for k, v in after.items() if k != "trl"} == {
        k: v for k, v in before.items() if k != "trl"
    }


@pytest.mark.parametrize(
    "text",
    [
        "trl: {use_vllm: true, vllm_mode: colocate}\n",  # a flow mapping
        "trl:\n  use_vllm: true\n  reward_funcs:\n    - a.b\n",  # last entry over lines
        "trl:\n  use_vllm: true\n  vllm_enable_sleep_mode: false\n",  # written already
    ],
)
def test_a_key_is_added_only_to_a_block_it_can_be_laid_out_in(text: str) -> None:
    from llmmem.rules.config_edits import add_to_block

    assert add_to_block(text, ("trl", "vllm_enable_sleep_mode"), True) is None


def test_a_key_added_to_a_crlf_block_keeps_crlf() -> None:
    from llmmem.rules.config_edits import add_to_block

    text = "trl:\r\n  use_vllm: true  # colocated\r\nbf16: true\r\n"
    edits = add_to_block(text, ("trl", "vllm_enable_sleep_mode"), True)
    assert edits is not None
    fixed = apply_edits(text, edits)
    assert fixed == (
        "trl:\r\n  use_vllm: true  # colocated\r\n  vllm_enable_sleep_mode: true\r\nbf16: true\r\n"
    )
