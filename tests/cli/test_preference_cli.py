"""`llmmem estimate --objective dpo ...` and `llmmem explain` on the preference examples."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmmem.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main([*args, "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def test_method_dpo_is_full_fine_tuning_with_a_reference_copy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--batch", "2", "--seq", "512")
    out = _json(capsys, "estimate", "--offline", *args, "--method", "dpo")
    assert out["setup"]["values"]["objective"] == "dpo"
    assert out["setup"]["values"]["reference"] == "copy"
    assert out["setup"]["values"]["method"] == "full"
    assert set(out["phases"]) == {"forward", "reference_forward", "backward", "optimizer_step"}
    assert out["phases"]["optimizer_step"]["components"]["reference_model"] > 0
    sft = _json(capsys, "estimate", "--offline", *args)
    assert out["allocated_peak_bytes"] > sft["allocated_peak_bytes"]


def test_precomputed_reference_and_lora(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--batch", "2", "--seq", "512")
    adapter = _json(
        capsys, "estimate", "--offline", *args, "--objective", "dpo", "--method", "lora"
    )
    assert adapter["setup"]["values"]["reference"] == "adapter"
    assert "reference_forward" in adapter["phases"]
    pre = _json(
        capsys, "estimate", "--offline", *args, "--objective", "dpo", "--ref-model", "precomputed"
    )
    assert "reference_forward" not in pre["phases"]


def test_ppo_names_its_phases(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(
        capsys,
        "estimate",
        "--offline",
        "--model",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "--objective",
        "ppo",
        "--batch",
        "2",
        "--seq",
        "256",
    )
    assert set(out["phases"]) == {
        "generate",
        "reference_forward",
        "forward",
        "backward",
        "optimizer_step",
    }


GRPO = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--objective", "grpo", "--batch", "8")


def test_grpo_names_its_phases(capsys: pytest.CaptureFixture[str]) -> None:
    lengths = ("--max-prompt-length", "256", "--max-completion-length", "512")
    out = _json(capsys, "estimate", "--offline", *GRPO, "--num-generations", "4", *lengths)
    values = out["setup"]["values"]
    assert values["objective"] == "grpo"
    assert values["seq"] == 768
    assert values["reference"] == "none"  # beta 0.0, TRL 0.29's default
    assert values["grpo"]["generation_batch"] == 8
    assert set(out["phases"]) == {"generate", "forward", "backward", "optimizer_step"}
    # at the last generated token the cache holds prompt + completion − 1 tokens of all 8
    # completions: 24 blocks × 2 kv heads × 64 × 2 (K, V) × 2 B (bf16 autocast) per token
    long = ("--max-prompt-length", "256", "--max-completion-length", "4096")
    longer = _json(capsys, "estimate", "--offline", *GRPO, "--num-generations", "4", *long)
    kv = longer["phases"]["generate"]["components"]["kv_cache"]
    assert kv == 24 * 2 * 64 * 2 * 2 * (256 + 4096 - 1) * 8
    with_ref = _json(
        capsys, "estimate", "--offline", *GRPO, "--num-generations", "4", *lengths, "--beta", "0.04"
    )
    assert with_ref["setup"]["values"]["reference"] == "copy"
    assert "reference_forward" in with_ref["phases"]
    assert with_ref["allocated_peak_bytes"] > out["allocated_peak_bytes"]
    main(["estimate", "--offline", *GRPO, "--num-generations", "4", *lengths, "--beta", "0.04"])
    text = capsys.readouterr().out
    for phase in ("generate", "reference_forward", "forward", "backward", "optimizer_step"):
        assert phase in text
    assert "4 per prompt" in text


def test_grpo_with_vllm_colocate_holds_the_engines_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("estimate", "--offline", *GRPO, "--vllm", "colocate", "--gpu", "80GiB")
    out = _json(capsys, *args, "--vllm-gpu-memory-utilization", "0.4")
    share = int(0.4 * 80 * 2**30)
    for phase in out["phases"].values():
        assert phase["components"]["vllm_engine"] == share
    asleep = _json(capsys, *args, "--vllm-gpu-memory-utilization", "0.4", "--vllm-sleep-mode")
    assert asleep["phases"]["generate"]["components"]["vllm_engine"] == share
    assert "vllm_engine" not in asleep["phases"]["backward"]["components"]
    server = _json(capsys, "estimate", "--offline", *GRPO, "--vllm", "server")
    assert "kv_cache" not in server["phases"]["generate"]["components"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--objective", "grpo", "--num-generations", "3"), "must divide by num_generations"),
        (("--num-generations", "4"), "only with --objective grpo"),
        (("--objective", "dpo", "--beta", "0.1"), "only with --objective grpo"),
        (("--objective", "grpo", "--seq", "512"), "--max-prompt-length"),
        (("--objective", "grpo", "--vllm-sleep-mode"), "needs --vllm colocate"),
        (
            ("--objective", "grpo", "--vllm", "server", "--vllm-gpu-memory-utilization", "0.5"),
            "needs --vllm colocate",
        ),
        (("--objective", "grpo", "--vllm", "colocate"), "name the GPU"),
        (
            ("--objective", "grpo", "--vllm", "colocate", "--gpu", "H100"),
            None,
        ),
        (
            ("--objective", "grpo", "--vllm", "colocate", "--gpu", "H100")
            + ("--vllm-gpu-memory-utilization", "1.5"),
            "at most 1",
        ),
        (("--objective", "grpo", "--beta", "-0.1"), "beta must be 0 or more"),
        (("--objective", "grpo", "--num-generations", "1"), "at least 2"),
        (("--objective", "grpo", "--ref-model", "copy"), "--beta"),
        (("--objective", "grpo", "--loss", "liger"), "use_liger_loss"),
    ],
)
def test_grpo_flags_that_mean_nothing_are_usage_errors(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str | None
) -> None:
    code = main(["estimate", "--offline", "--model", "Qwen/Qwen2.5-0.5B-Instruct", *args])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_grpo_largest_micro_batch_is_a_multiple_of_the_generations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--objective", "grpo", "--gpu", "24GiB")
    out = _json(capsys, "estimate", "--offline", *args, "--num-generations", "6", "--max-batch")
    best = out["max_batch"]["value"]
    assert best > 0 and best % 6 == 0
    # the next multiple does not fit
    code = main(
        ["estimate", "--offline", *args, "--num-generations", "6", "--batch", str(best + 6)]
    )
    assert code == 0
    capsys.readouterr()
    over = _json(
        capsys, "estimate", "--offline", *args, "--num-generations", "6", "--batch", str(best + 6)
    )
    assert over["device_total_bytes"] > 24 * 2**30


@pytest.mark.parametrize(
    ("example", "reference"), [("dpo_lora.py", "adapter"), ("axolotl_dpo.yaml", "copy")]
)
def test_explain_shows_the_method_the_reference_and_the_phases(
    capsys: pytest.CaptureFixture[str], example: str, reference: str
) -> None:
    out = _json(capsys, "explain", str(EXAMPLES / example))
    assert out["plan"]["objective"]["value"] == "dpo"
    assert "reference_forward" in out["budget"]["phases"]
    has_copy = "reference_model" in out["budget"]["phases"]["optimizer_step"]["components"]
    assert has_copy is (reference == "copy")
    main(["explain", str(EXAMPLES / example)])
    text = capsys.readouterr().out
    assert "reference model" in text
    assert reference in text


def test_verify_on_a_gpu_says_a_preference_step_runs_on_the_cpu_or_simulated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["verify", str(EXAMPLES / "dpo_lora.py"), "--offline", "--device", "cuda"])
    assert code == 2
    assert "--device cpu or --simulate" in capsys.readouterr().err


def test_the_largest_micro_batch_is_searched_with_the_preference_step(
    capsys: pytest.CaptureFixture[str], trl_release: Callable[[str], Path]
) -> None:
    trl_release("0.29.1")  # DPO's full logits, policy and reference (1.15 on: the fused head)
    args = ("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--seq", "1024", "--gpu", "24GiB")
    sft = _json(capsys, "estimate", "--offline", *args, "--max-batch")
    dpo = _json(capsys, "estimate", "--offline", *args, "--method", "dpo", "--max-batch")
    assert 0 < dpo["max_batch"]["value"] < sft["max_batch"]["value"]


def test_explain_sizes_the_grpo_example_with_generation(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "explain", str(EXAMPLES / "grpo_vllm_colocate.py"), "--gpu", "A100-80GB")
    assert out["plan"]["objective"]["value"] == "grpo"
    phases = out["budget"]["phases"]
    assert {"generate", "forward", "backward", "optimizer_step"} <= set(phases)
    # the file's max_completion_length (1024) after TRL's prompt default (512)
    assert any("up to 1024 tokens after prompts of 512" in n for n in out["budget"]["notes"])
    # the file's use_vllm/vllm_mode/vllm_gpu_memory_utilization are read: 0.3 of the GPU
    gpu = out["budget"]["gpu"]["capacity_bytes"]
    assert out["budget"]["components"]["vllm_engine"] == pytest.approx(0.3 * gpu, rel=1e-6)
    assert not any("not read from the file" in n for n in out["budget"]["notes"])
    main(["explain", str(EXAMPLES / "grpo_vllm_colocate.py"), "--gpu", "A100-80GB"])
    text = capsys.readouterr().out
    assert "generate" in text
    assert "beta = 0" in text


PPO = ("--model", "Qwen/Qwen2.5-1.5B-Instruct", "--objective", "ppo", "--batch", "2")


def test_ppo_takes_its_models_and_lengths_as_flags(capsys: pytest.CaptureFixture[str]) -> None:
    base = _json(capsys, "estimate", "--offline", *PPO, "--seq", "256")
    assert base["setup"]["values"]["ppo"]["response_length"] == 53  # PPOConfig's default
    smaller = _json(
        capsys,
        "estimate",
        "--offline",
        *PPO,
        "--seq",
        "256",
        "--value-model",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "--reward-model",
        "Qwen/Qwen2.5-0.5B-Instruct",
    )
    ppo = smaller["setup"]["values"]["ppo"]
    assert ppo["value_model"] == ppo["reward_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert smaller["allocated_peak_bytes"] < base["allocated_peak_bytes"]
    longer = _json(capsys, "estimate", "--offline", *PPO, "--seq", "256", "--new-tokens", "512")
    assert longer["setup"]["values"]["ppo"]["response_length"] == 512
    assert longer["allocated_peak_bytes"] > base["allocated_peak_bytes"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--model", "Qwen/Qwen2.5-0.5B-Instruct", "--value-model", "x/y"), "--objective ppo"),
        ((*PPO, "--grad-accum", "1", "--mini-batches", "3"), "num_mini_batches"),
    ],
)
def test_ppo_flags_that_mean_nothing_are_refused(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], message: str
) -> None:
    code = main(["estimate", "--offline", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


# TRL 1.16.0's own docstring examples (trl/trainer/dpo_trainer.py, grpo_trainer.py), as a user
# copies them, beside a requirements file that pins the release
TRL_DOCS_DPO = """from trl import DPOTrainer
from datasets import load_dataset

dataset = load_dataset("trl-lib/ultrafeedback_binarized", split="train")

trainer = DPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    train_dataset=dataset,
)
trainer.train()
"""

TRL_DOCS_GRPO = """from trl import GRPOTrainer
from trl.rewards import accuracy_reward
from datasets import load_dataset

dataset = load_dataset("trl-lib/DeepMath-103K", split="train")

trainer = GRPOTrainer(
    model="Qwen/Qwen2.5-0.5B-Instruct",
    reward_funcs=accuracy_reward,
    train_dataset=dataset,
)
trainer.train()
"""


@pytest.mark.parametrize(("script", "reference"), [(TRL_DOCS_DPO, True), (TRL_DOCS_GRPO, False)])
def test_the_trl_docs_examples_are_explained_with_their_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], script: str, reference: bool
) -> None:
    (tmp_path / "requirements.txt").write_text("trl==1.16.0\ntransformers==5.24.0\n")
    path = tmp_path / "train.py"
    path.write_text(script)
    out = _json(capsys, "explain", str(path), "--gpu", "A100-80GB")
    budget = out["budget"]
    assert not out["problems"], out["problems"]
    # a model TRL loads by name is fp32 (create_model_from_path), trained under bf16 autocast
    params = 494_032_768
    assert budget["components"]["weights"] == pytest.approx(4 * params, rel=0.01)
    phases = list(budget["phases"])
    if reference:
        # full fine-tuning: a frozen fp32 copy, and its own forward in the step
        assert budget["components"]["reference_model"] == pytest.approx(4 * params, rel=0.01)
        assert "reference_forward" in phases
    else:
        # GRPOConfig's beta is 0: no reference model; the step generates
        assert "reference_model" not in budget["components"]
        assert "generate" in phases
    release_notes = [note for note in budget["notes"] if note.startswith("trl 1.16.0")]
    assert len(release_notes) == 1
