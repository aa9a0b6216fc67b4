"""Files of the long tail that name their model where the reader did not look: each is sized
from the model it names (or, for GRPO, from the fewest GPUs its batch allows).

- a launch whose script is not beside it, with the model as the script's positional argument;
- a model path passed through a helper that asks the file system (`os.path.isdir(merged)`);
- an arguments object handed to a helper of a module not in reach (`merge_overrides(run, cfg)`);
- a model loaded by a helper of a module not in reach, from the script's --model_name_or_path;
- a GPT-NeoX model (Polyglot-Ko) with its own module names, from the bundled catalog;
- a GRPO batch that one GPU cannot hold (GRPOConfig raises): the fewest GPUs that can.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from llmmem.check import check_text
from llmmem.extract import ProjectSettings
from llmmem.models.spec import ModelSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "longtail"
EXPLAIN = Path(sys.executable).parent / "llmmem"


def checked(tmp_path: Path, name: str) -> Any:
    (tmp_path / ".git").mkdir(exist_ok=True)
    target = tmp_path / name
    shutil.copy(FIXTURES / name, target)
    return check_text(
        target, target.read_text(), gpu="A100-80GB", hub=False, settings=ProjectSettings()
    )


def test_a_positional_model_of_a_script_not_here_is_read(tmp_path: Path) -> None:
    analysis = checked(tmp_path, "grpo_launch_positional.sh").analysis
    assert analysis.plan.model_id.value == "/data/shared/models/Qwen2.5-3B-Instruct"
    assert analysis.plan.model_id.range.start_line == 2  # where MODEL_NAME is written
    assert analysis.spec.model_id == "Qwen/Qwen2.5-3B-Instruct"
    assert analysis.budget is not None


def test_a_file_system_probe_reads_false_and_the_given_path_is_used(tmp_path: Path) -> None:
    analysis = checked(tmp_path, "grpo_merged_or_given.py").analysis
    assert analysis.plan.model_id.value == "Qwen/Qwen2.5-1.5B-Instruct"
    assert analysis.budget is not None and not analysis.spec.is_guess


def test_an_arguments_object_updated_by_a_helper_not_here_keeps_its_defaults(
    tmp_path: Path,
) -> None:
    analysis = checked(tmp_path, "sft_overrides_helper.py").analysis
    plan = analysis.plan
    assert plan.model_id.value == "Qwen/Qwen2.5-0.5B-Instruct"
    assert plan.per_device_train_batch_size.value == 4
    assert plan.max_seq_length.value == 1024
    assert analysis.budget is not None


def test_a_model_loaded_by_a_helper_not_here_is_the_model_argument(tmp_path: Path) -> None:
    analysis = checked(tmp_path, "helper_loads_model.py").analysis
    assert analysis.plan.model_id.value == "./Mistral-7B-Instruct-v0.2"
    assert "what loads it is not read here" in analysis.plan.model_id.note
    assert analysis.spec.model_id == "mistralai/Mistral-7B-Instruct-v0.2"
    assert analysis.budget is not None


def test_polyglot_ko_is_sized_with_its_own_modules(tmp_path: Path) -> None:
    result = checked(tmp_path, "polyglot_lora.py")
    spec = result.analysis.spec
    assert spec.source is ModelSource.CATALOG
    assert spec.architecture == "GPTNeoXForCausalLM" and spec.total_params == 1_331_810_304
    assert result.analysis.budget is not None
    assert "LLM013" not in [finding.code for finding in result.findings]


def test_a_grpo_batch_one_gpu_cannot_hold_assumes_the_fewest_gpus_that_can(
    tmp_path: Path,
) -> None:
    # 2 per device x 2 steps per generation = 4 completions: 6 generations need 3 GPUs
    analysis = checked(tmp_path, "grpo_merged_or_given.py").analysis
    world = analysis.plan.distributed.world_size
    assert (world.value, world.source.value) == (3, "assumed")
    assert "fewest GRPOConfig accepts" in world.note
    assert not any("must divide by num_generations" in p for p in analysis.problems)


def test_the_installed_command_sizes_the_positional_model(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    shutil.copy(FIXTURES / "grpo_launch_positional.sh", tmp_path / "run.sh")
    proc = subprocess.run(
        [str(EXPLAIN), "explain", "run.sh", "--gpu", "A100-80GB"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Qwen/Qwen2.5-3B-Instruct" in proc.stdout
