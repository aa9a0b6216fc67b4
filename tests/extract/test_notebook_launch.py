"""A notebook that trains through a shell line: `!llamafactory-cli train` over a config its
`%%writefile` cell writes, `!accelerate launch train.py --flags`. The launch is read as a
launcher script would be, every value pointing at the cell it is written in."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from llmmem.extract import extract_plan
from llmmem.plan import Provenance

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "notebooks"
LINT = Path(sys.executable).parent / "llmmem-lint"


def copied(tmp_path: Path, name: str) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    target = tmp_path / name
    shutil.copy(FIXTURES / name, target)
    return target


def test_a_writefile_config_run_by_a_shell_cell_is_the_plan(tmp_path: Path) -> None:
    path = copied(tmp_path, "lf_writefile_launch.ipynb")
    plan = extract_plan(path)
    assert plan.kind == "notebook" and plan.framework == "llamafactory"
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B-Instruct"
    assert plan.per_device_train_batch_size.value == 2
    assert plan.gradient_accumulation_steps.value == 8
    assert plan.max_seq_length.value == 1536
    assert plan.lora is not None and plan.lora.r.value == 16
    # written in the notebook's third cell, on the lines the editor shows
    where = plan.per_device_train_batch_size.range
    assert where is not None and where.path == f"{path}#cell=2" and where.start_line == 10
    assert plan.per_device_train_batch_size.source is Provenance.EXPLICIT


def test_flags_of_an_accelerate_launch_line_are_read(tmp_path: Path) -> None:
    path = copied(tmp_path, "accelerate_launch_cell.ipynb")
    plan = extract_plan(path)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-0.5B-Instruct"
    assert plan.per_device_train_batch_size.value == 4
    assert plan.gradient_accumulation_steps.value == 2
    assert plan.precision.value == "bf16"
    where = plan.gradient_accumulation_steps.range
    assert where is not None and where.path == f"{path}#cell=1" and where.start_line == 4


def test_fix_halves_the_batch_on_the_shell_line(tmp_path: Path) -> None:
    path = copied(tmp_path, "accelerate_launch_cell.ipynb")
    before = json.loads(path.read_text())
    proc = subprocess.run(
        [str(LINT), "--gpu", "T4", "--fix", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    after = json.loads(path.read_text())
    cell = "".join(after["cells"][1]["source"])
    assert "--per_device_train_batch_size 2 \\" in cell
    assert "--gradient_accumulation_steps 4 \\" in cell
    assert after["cells"][0] == before["cells"][0] and after["cells"][2] == before["cells"][2]


def test_a_pragma_in_a_cell_speaks_for_the_launch(tmp_path: Path) -> None:
    path = copied(tmp_path, "accelerate_launch_cell.ipynb")
    notebook = json.loads(path.read_text())
    source = "".join(notebook["cells"][1]["source"])
    notebook["cells"][1]["source"] = source.replace(
        "--model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\\n  ", ""
    ).replace("# one GPU", "# llmmem: model=Qwen/Qwen2.5-1.5B-Instruct\n# one GPU")
    path.write_text(json.dumps(notebook))
    plan = extract_plan(path)
    assert plan.model_id is not None and plan.model_id.value == "Qwen/Qwen2.5-1.5B-Instruct"
    assert plan.model_id.source is Provenance.PRAGMA
