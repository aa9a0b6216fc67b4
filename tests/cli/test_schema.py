"""`llmmem schema`: the JSON Schemas of the `--format json` reports, generated from the report
models and shipped in the package, validate what real runs print; settings of the wrong type
are refused with the key and the expected type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "fixtures"
SHIPPED = ROOT / "analyzer" / "llmmem" / "schemas"

LINTED = [
    EXAMPLES / "qlora_sft.py",
    EXAMPLES / "full_finetune.py",
    FIXTURES / "python" / "trl_sft_lora.py",
    FIXTURES / "python" / "hf_trainer_full.py",
    FIXTURES / "python" / "pragma_script.py",
    FIXTURES / "configs" / "axolotl_qlora.yml",
    FIXTURES / "configs" / "ds_zero3.json",
    FIXTURES / "configs" / "broken_tabs.yaml",
    FIXTURES / "shell" / "launch_deepspeed.sh",
    FIXTURES / "notebooks" / "qlora_finetune.ipynb",
]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def schema_of(report: str) -> dict[str, Any]:
    proc = run("-m", "llmmem", "schema", report)
    assert proc.returncode == 0, proc.stderr
    schema: dict[str, Any] = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)  # a valid JSON Schema
    return schema


@pytest.mark.parametrize("report", ["explain", "lint"])
def test_schema_is_a_json_schema_and_the_shipped_file(report: str) -> None:
    schema = schema_of(report)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    shipped = json.loads((SHIPPED / f"{report}.schema.json").read_text(encoding="utf-8"))
    assert shipped == schema, f"regenerate: llmmem schema {report} > {SHIPPED}/{report}.schema.json"


def test_explain_json_validates() -> None:
    schema = schema_of("explain")
    for path in (EXAMPLES / "qlora_sft.py", FIXTURES / "configs" / "axolotl_qlora.yml"):
        proc = run("-m", "llmmem", "explain", str(path), "--format", "json", "--gpu", "A100-80GB")
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["budget"] is not None
        jsonschema.validate(report, schema)
    # an unknown model: no budget, still the schema's shape
    proc = run(
        "-m", "llmmem", "explain", str(FIXTURES / "python" / "torch_loop.py"), "--format", "json"
    )
    jsonschema.validate(json.loads(proc.stdout), schema)


def test_estimate_json_budget_fields_validate_and_carry_the_band() -> None:
    """`llmmem estimate --format json` prints the explain report's budget, with the band and the
    verdict, plus its setup and limits."""
    schema = schema_of("explain")
    budget_schema = {**schema["$defs"]["BudgetModel"], "$defs": schema["$defs"]}
    proc = run(
        "-m", "llmmem", "estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora",
        "--batch", "1", "--seq", "1024", "--gpu", "A100-80GB", "--offline", "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    budget = {key: out[key] for key in budget_schema["properties"]}
    jsonschema.validate(budget, budget_schema)
    assert out["band_low_bytes"] < out["device_total_bytes"] < out["band_high_bytes"]
    assert out["verdict"] == "fits"
    broken = {**budget, "verdict": "maybe"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, budget_schema)


def test_lint_json_validates_and_the_schema_catches_a_change() -> None:
    schema = schema_of("lint")
    lint = str(Path(sys.executable).parent / "llmmem-lint")  # the installed command
    proc = subprocess.run(
        [lint, *map(str, LINTED), "--gpu", "24GB", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    findings = json.loads(proc.stdout)
    assert {f["severity"] for f in findings} >= {"error", "info"}
    assert any(f["fixes"] for f in findings)
    jsonschema.validate(findings, schema)
    findings[0]["severity"] = "fatal"  # what a consumer must not be given
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(findings, schema)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()  # no pyproject.toml above it is read
    (tmp_path / "train.py").write_text((EXAMPLES / "qlora_sft.py").read_text())
    return tmp_path


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('world_size = "eight"', ["world_size", "integer", "'eight'"]),
        ("world_size = 0", ["world_size", "integer from 1"]),
        ("hub = 1", ["hub", "true or false"]),
        ('fail_on = "never"', ["fail_on", "one of error, warning, info"]),
        ("gpu = 80", ["gpu", "GPU name", "string"]),
        ('[tool.llmmem.severity]\nLLM001 = "loud"', ["severity.LLM001", "one of error"]),
        ('[tool.llmmem.local_model_paths]\n"org/m" = 3', ["local_model_paths.org/m", "path"]),
        ('gpus = "A100"', ["unknown key 'gpus'", "known: gpu"]),
    ],
)
@pytest.mark.parametrize("command", ["lint", "explain"])
def test_a_wrong_type_in_tool_llmmem_exits_2_naming_key_and_type(
    project: Path, table: str, words: list[str], command: str
) -> None:
    (project / "pyproject.toml").write_text(f"[tool.llmmem]\n{table}\n")
    proc = run("-m", "llmmem", command, "train.py", "--gpu", "A100-80GB", cwd=project)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pyproject.toml [tool.llmmem]" in lines[0]
    for word in words:
        assert word in lines[0], lines[0]


def test_good_settings_in_any_case_are_read(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.llmmem]\nworld_size = 2\nfail_on = "Info"\nhub = false\n'
        '[tool.llmmem.severity]\nLLM003 = "Warning"\n'
    )
    proc = run("-m", "llmmem", "lint", "train.py", "--gpu", "A100-80GB", cwd=project)
    assert "LLM003 [warning]" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 1


def test_a_bad_pragma_value_names_the_key_and_the_type(project: Path) -> None:
    script = project / "train.py"
    script.write_text("# llmmem: seq=2² gpu=''\n" + script.read_text())
    proc = run("-m", "llmmem", "explain", "train.py", "--format", "json", cwd=project)
    problems = json.loads(proc.stdout)["problems"]
    assert any("seq must be an integer from 1" in p and "2²" in p for p in problems), problems
    assert any("gpu must be a GPU name" in p for p in problems), problems


def test_a_5_mb_yaml_is_refused_quickly_with_a_message(tmp_path: Path) -> None:
    lines = ["# llmmem: gpu=A100-80GB", "model_name_or_path: meta-llama/Llama-3.1-8B", "datasets:"]
    lines += [f"  - path: org/dataset-{i}\n    type: alpaca" for i in range(112_000)]
    config = tmp_path / "big.yaml"
    config.write_text("\n".join(lines) + "\n")
    assert 5_000_000 < config.stat().st_size < 5 * 2**20  # the CLI refuses more than 5 MiB
    start = time.monotonic()
    proc = run("-m", "llmmem", "explain", str(config), "--format", "json", cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    problems = json.loads(proc.stdout)["problems"]
    assert any("MB llmmem parses" in problem for problem in problems), problems
    assert elapsed < 10, f"{elapsed:.1f} s"  # about 0.2 s unloaded; 2 minutes when parsed


EVERY_FILE = sorted(
    path
    for folder in (EXAMPLES, FIXTURES)
    for path in folder.rglob("*")
    if path.suffix in (".py", ".yaml", ".yml", ".json", ".sh", ".ipynb") and path.is_file()
)


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict[str, Any]]:
    return {report: schema_of(report) for report in ("explain", "lint")}


@pytest.mark.parametrize("path", EVERY_FILE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fixture_and_example_reports_json_that_validates(
    path: Path,
    schemas: dict[str, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every file the suite reads, through `explain` and `lint` with `--format json` (on two
    GPUs, so that fitting and not-fitting reports are both checked)."""
    from llmmem.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for gpu in ("T4", "H100"):
        code = main(["explain", str(path), "--format", "json", "--gpu", gpu])
        out = capsys.readouterr().out
        assert code in (0, 1, 2)
        if out.strip():
            jsonschema.validate(json.loads(out), schemas["explain"])
        code = main(["lint", str(path), "--format", "json", "--gpu", gpu])
        out = capsys.readouterr().out
        assert code in (0, 1, 2)
        if code != 2:
            jsonschema.validate(json.loads(out), schemas["lint"])
