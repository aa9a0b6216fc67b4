"""The command line under bad input: exit codes, one-line messages, no tracebacks, no hangs.

Every test runs the real command in a subprocess on small files written to tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

LINT = "from llmmem.lint_command import lint_main; raise SystemExit(lint_main())"

# a model small enough to size from its config.json alone
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
}


def run(
    *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
    )


def lint(
    *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run("-c", LINT, *args, cwd=cwd, timeout=timeout)


def llmmem(
    *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run("-m", "llmmem", *args, cwd=cwd, timeout=timeout)


def assert_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return directory


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory that is its own project (a git repository), so no pyproject.toml above it
    is read."""
    (tmp_path / ".git").mkdir()
    return tmp_path


# -- 1. --fail-on and --exit-zero ---------------------------------------------------------------


@pytest.fixture
def info_only(project: Path) -> Path:
    """A script whose only finding is LLM010 (info): a batch size, and no model named."""
    script = project / "no_model.py"
    script.write_text('# llmmem: batch=4\nprint("training starts")\n')
    return script


def test_info_findings_are_printed_but_pass_by_default(info_only: Path) -> None:
    proc = lint(str(info_only), "--gpu", "A100-80GB")
    assert "LLM010 [info]" in proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_fail_on_info_fails_on_an_info_finding(info_only: Path) -> None:
    proc = lint(str(info_only), "--gpu", "A100-80GB", "--fail-on", "info")
    assert proc.returncode == 1, proc.stdout + proc.stderr


def test_fail_on_error_passes_warnings_and_fails_errors(project: Path) -> None:
    shutil.copy(EXAMPLES / "full_finetune.py", project / "full_finetune.py")
    script = str(project / "full_finetune.py")
    assert lint(script, "--gpu", "A100-80GB", "--fail-on", "error").returncode == 1  # LLM001
    # the same error downgraded to a warning by the project passes --fail-on error
    (project / "pyproject.toml").write_text('[tool.llmmem.severity]\nLLM001 = "warning"\n')
    proc = lint(script, "--gpu", "A100-80GB", "--fail-on", "error")
    assert "LLM001 [warning]" in proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_exit_zero_passes_an_error_but_not_a_usage_error(project: Path) -> None:
    shutil.copy(EXAMPLES / "full_finetune.py", project / "full_finetune.py")
    proc = lint(str(project / "full_finetune.py"), "--gpu", "A100-80GB", "--exit-zero")
    assert "LLM001 [error]" in proc.stdout
    assert proc.returncode == 0
    assert lint(str(project / "missing.py"), "--exit-zero").returncode == 2


def test_fail_on_from_pyproject_and_the_flag_wins(info_only: Path, project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.llmmem]\nfail_on = "info"\n')
    assert lint(str(info_only), "--gpu", "A100-80GB").returncode == 1
    assert lint(str(info_only), "--gpu", "A100-80GB", "--fail-on", "warning").returncode == 0


def test_fail_on_takes_only_a_severity(info_only: Path) -> None:
    proc = lint(str(info_only), "--fail-on", "hint")
    assert proc.returncode == 2 and "--fail-on" in proc.stderr


# -- 2. an unknown GPU is a usage error -----------------------------------------------------------


@pytest.mark.parametrize("command", ["lint", "explain", "estimate", "verify"])
def test_unknown_gpu_flag_exits_2_with_close_matches(project: Path, command: str) -> None:
    shutil.copy(EXAMPLES / "qlora_sft.py", project / "qlora_sft.py")
    script = str(project / "qlora_sft.py")
    if command == "lint":
        proc = lint(script, "--gpu", "A10O")
    elif command == "estimate":
        proc = llmmem("estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "A10O")
    elif command == "verify":
        proc = llmmem("verify", script, "--simulate", "--offline", "--gpu", "A10O")
    else:
        proc = llmmem("explain", script, "--gpu", "A10O")
    assert_usage_error(proc, "A10O", "A100-80GB")
    assert proc.stdout == ""


def test_unknown_gpu_in_pyproject_exits_2(project: Path) -> None:
    shutil.copy(EXAMPLES / "qlora_sft.py", project / "qlora_sft.py")
    (project / "pyproject.toml").write_text('[tool.llmmem]\ngpu = "RTX-4900"\n')
    script = str(project / "qlora_sft.py")
    for proc in (lint(script), llmmem("explain", script)):
        assert_usage_error(proc, "pyproject.toml", "RTX-4900", "RTX-4090")
    # a --gpu on the command line replaces the setting
    assert lint(script, "--gpu", "H100").returncode in (0, 1)


def test_a_gpu_capacity_past_any_gpu_is_unknown_not_a_crash() -> None:
    proc = llmmem("estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "9" * 400 + "GB")
    assert_usage_error(proc, "unknown GPU")


# -- 3. numbers: bounded integers, a clear message past the bound, never a traceback ------------

HUGE = "9" * 400  # past float range
OVER_LIMIT = "9" * 5000  # past Python's int-from-text limit


def lint_json(path: Path) -> list[dict]:
    proc = lint(str(path), "--gpu", "A100-80GB", "--format", "json")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def out_of_range(findings: list[dict]) -> list[tuple[int, str]]:
    return [(f["range"]["start_line"], f["message"]) for f in findings if f["code"] == "LLM011"]


@pytest.mark.parametrize(
    ("name", "text", "line", "setting"),
    [
        (
            "power.py",
            "from transformers import AutoModelForCausalLM, TrainingArguments\n"
            'model = AutoModelForCausalLM.from_pretrained("tiny")\n'
            'args = TrainingArguments(output_dir="o", per_device_train_batch_size=10**309)\n',
            2,
            "per_device_train_batch_size",
        ),
        (
            "literal.py",
            "from transformers import AutoModelForCausalLM, TrainingArguments\n"
            'model = AutoModelForCausalLM.from_pretrained("tiny")\n'
            f'args = TrainingArguments(output_dir="o", per_device_train_batch_size={HUGE})\n',
            2,
            "per_device_train_batch_size",
        ),
        ("pragma.py", f"# llmmem: model=tiny batch={HUGE}\n", 0, "batch="),
        ("pragma_limit.py", f"# llmmem: model=tiny seq={OVER_LIMIT}\n", 0, "seq="),
        (
            "sft.yaml",
            f"model_name_or_path: tiny\nper_device_train_batch_size: {HUGE}\n",
            1,
            "per_device_train_batch_size",
        ),
        (
            "limit.yaml",
            f"model_name_or_path: tiny\nmax_seq_length: {OVER_LIMIT}\n",
            1,
            "max_seq_length",
        ),
    ],
)
def test_a_number_past_the_bound_is_a_finding_on_its_line(
    project: Path, name: str, text: str, line: int, setting: str
) -> None:
    tiny_model(project / "tiny")
    path = project / name
    path.write_text(text)
    found = out_of_range(lint_json(path))
    assert len(found) == 1, found
    at, message = found[0]
    assert at == line
    assert setting in message and "1,000,000,000" in message
    assert len(message) < 300  # the number is cut, not printed in full


def test_the_bound_itself_is_read(project: Path) -> None:
    tiny_model(project / "tiny")
    path = project / "train.py"
    path.write_text("# llmmem: model=tiny batch=1000000000 seq=1000000000\n")
    proc = llmmem("explain", str(path), "--format", "json", "--gpu", "A100-80GB")
    out = json.loads(proc.stdout)
    assert out["plan"]["per_device_train_batch_size"]["value"] == 10**9
    assert out["plan"]["max_seq_length"]["value"] == 10**9
    assert out_of_range(out["findings"]) == []
    assert out["budget"]["fits"] is False


def test_a_superscript_digit_in_a_pragma_is_a_problem_not_a_crash(project: Path) -> None:
    tiny_model(project / "tiny")
    path = project / "train.py"
    path.write_text("# llmmem: model=tiny seq=2\u00b2 batch=3\n")
    proc = llmmem("explain", str(path), "--format", "json", "--gpu", "A100-80GB")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert any("seq" in p and "2\u00b2" in p for p in out["problems"]), out["problems"]
    assert out["plan"]["per_device_train_batch_size"]["value"] == 3  # the rest still read


@pytest.mark.parametrize(
    "flags",
    [
        ["--batch", HUGE],
        ["--seq", OVER_LIMIT],
        ["--batch", "2\u00b2"],
        ["--grad-accum", "1000000001"],
        ["--method", "lora", "--lora-alpha", "inf"],
        ["--mode", "generate", "--new-tokens", OVER_LIMIT],
    ],
)
def test_estimate_flags_past_the_bound_exit_2(flags: list[str]) -> None:
    proc = llmmem("estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "80GB", *flags)
    assert_usage_error(proc, flags[-2])
    assert len(proc.stderr) < 400


# -- 4. text from a file is never markup ----------------------------------------------------------


def test_markup_in_a_model_path_prints_literally(project: Path) -> None:
    model_dir = tiny_model(project / "ckpt[/bold]" / "[red]run[/red] [/exp1] :smile:")
    script = project / "train.py"
    script.write_text(f'# llmmem: model="{model_dir}" batch=2 seq=128\n')
    proc = llmmem("explain", str(script), "--gpu", "24GiB")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "MarkupError" not in proc.stderr
    flat = proc.stdout.replace("\n", "").replace("│", "").replace(" ", "")
    assert "ckpt[/bold]/[red]run[/red][/exp1]:smile:" in flat  # the path, as written
    assert "█" in proc.stdout  # the budget was rendered


# -- 5. verify --output into a missing directory --------------------------------------------------


def test_verify_output_into_a_missing_directory(project: Path) -> None:
    tiny_model(project / "tiny")
    script = project / "train.py"
    script.write_text("# llmmem: model_config=tiny/config.json batch=1 seq=16\n")
    proc = llmmem(
        "verify", str(script), "--simulate", "--output", str(project / "no" / "such" / "r.json")
    )
    assert_usage_error(proc, "does not exist")
    assert not (project / "no").exists()


# -- 6. paths named in a file: regular files only, size-capped, never a hang --------------------


def explain_json(script: Path, cwd: Path) -> dict:
    proc = llmmem("explain", str(script), "--format", "json", "--gpu", "24GiB", cwd=cwd, timeout=10)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_model_config_pragma_sizes_the_model(project: Path) -> None:
    tiny_model(project / "shapes")
    script = project / "train.py"
    script.write_text(
        "# llmmem: model=my-org/private-model model_config=shapes/config.json batch=1 seq=16\n"
    )
    out = explain_json(script, project)
    assert out["budget"] is not None, out["problems"]
    assert out["budget"]["gpu"]["name"] == "24GiB"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize(
    ("target", "reason", "advice"),
    [
        ("fifo.json", "named pipe", "named pipe"),
        ("/dev/zero", "device", "device"),
        ("big.json", "larger than", "is it a config.json?"),
        ("folder.json", "has no config.json", "point at a folder written by save_pretrained"),
    ],
)
def test_model_config_that_is_not_a_small_regular_file(
    project: Path, target: str, reason: str, advice: str
) -> None:
    os.mkfifo(project / "fifo.json")
    with open(project / "big.json", "wb") as big:  # sparse: takes no disk
        big.truncate(64 * 1024 * 1024)
    (project / "folder.json").mkdir()
    script = project / "train.py"
    script.write_text(f"# llmmem: model_config={target} batch=1 seq=16\n")
    out = explain_json(script, project)
    assert out["budget"] is None
    assert any(reason in problem for problem in out["problems"]), out["problems"]
    lint_proc = lint(str(script), "--gpu", "24GiB", cwd=project, timeout=10)
    assert lint_proc.returncode == 0 and "Traceback" not in lint_proc.stderr
    assert "LLM010" in lint_proc.stdout and advice in lint_proc.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_deepspeed_keyword_naming_a_fifo(project: Path) -> None:
    os.mkfifo(project / "ds_config.json")
    tiny_model(project / "tiny")
    script = project / "train.py"
    script.write_text(
        "from transformers import AutoModelForCausalLM, TrainingArguments\n"
        'model = AutoModelForCausalLM.from_pretrained("tiny")\n'
        'args = TrainingArguments(output_dir="out", deepspeed="ds_config.json")\n'
    )
    out = explain_json(script, project)
    assert any("ds_config.json" in p and "named pipe" in p for p in out["problems"]), out
    assert out["budget"] is not None  # the rest of the script is still estimated


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_deepspeed_yaml_key_naming_a_fifo(project: Path) -> None:
    os.mkfifo(project / "ds_config.json")
    config = project / "sft.yaml"
    config.write_text("model_name_or_path: tiny\ndeepspeed: ds_config.json\n")
    tiny_model(project / "tiny")
    out = explain_json(config, project)
    assert out["plan"]["deepspeed"]["zero_stage"]["value"] == 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_local_model_path_and_pyproject_that_are_fifos(tmp_path: Path) -> None:
    project = tmp_path / "with_settings"
    project.mkdir()
    (project / ".git").mkdir()
    os.mkfifo(project / "config-pipe.json")
    (project / "pyproject.toml").write_text(
        '[tool.llmmem.local_model_paths]\n"my-org/private" = "config-pipe.json"\n'
    )
    script = project / "train.py"
    script.write_text("# llmmem: model=my-org/private batch=1 seq=16\n")
    out = explain_json(script, project)
    assert any("named pipe" in problem for problem in out["problems"]), out["problems"]

    piped = tmp_path / "piped_settings"
    piped.mkdir()
    (piped / ".git").mkdir()
    os.mkfifo(piped / "pyproject.toml")
    (piped / "train.py").write_text("# llmmem: model=my-org/private batch=1 seq=16\n")
    out = explain_json(piped / "train.py", piped)
    assert any("pyproject.toml" in p and "named pipe" in p for p in out["problems"]), out


# -- 7. GitHub annotations cannot be injected through a file name ---------------------------------


def test_github_annotation_escapes_a_hostile_file_name(project: Path) -> None:
    name = "x,title=LLM999:\n::error file=evil.py::pwned%0A.py"
    (project / name).write_text('# llmmem: batch=4\nprint("hi")\n')
    proc = lint(str(project / name), "--gpu", "A100-80GB", "--format", "github")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("::notice ")
    properties, message = lines[0].removeprefix("::notice ").split("::", 1)
    keys = [item.split("=", 1)[0] for item in properties.split(",")]
    assert keys == ["file", "line", "col", "title"]
    assert properties.endswith("title=LLM010")
    # GitHub decodes %XX: the file name comes back as written
    file_value = properties.split(",", 1)[0].removeprefix("file=")
    decoded = (
        file_value.replace("%0A", "\n")
        .replace("%0D", "\r")
        .replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
    )
    assert decoded == str(project / name)
    assert "no model found" in message


# -- 8. no module from the working directory in the verify worker or the language server ----------


HOSTILE = "import pathlib\npathlib.Path(__file__).with_name('{marker}').write_text('imported')\n"


def test_verify_worker_ignores_a_torch_py_in_the_working_directory(project: Path) -> None:
    tiny_model(project / "tiny")
    script = project / "train.py"
    script.write_text("# llmmem: model=tiny batch=1 seq=16 precision=fp32\n")
    (project / "torch.py").write_text(
        HOSTILE.format(marker="torch-imported") + "raise SystemExit(99)\n"
    )
    proc = llmmem("verify", "train.py", "--simulate", "--offline", "--format", "json", cwd=project)
    assert not (project / "torch-imported").exists()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["measurement"]["allocated_peak_bytes"] > 0


def test_language_server_ignores_modules_in_the_working_directory(tmp_path: Path) -> None:
    # `logging` and `argparse` are the first modules the server imports
    for name in ("logging", "argparse"):
        (tmp_path / f"{name}.py").write_text(HOSTILE.format(marker=f"{name}-imported"))
    proc = run("-m", "llmmem_lsp", "--version", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "llmmem-lsp" in proc.stdout
    assert sorted(p.name for p in tmp_path.glob("*-imported")) == []


# -- 9. the script reader has bounds: values stop growing, reading stops after a number of steps --

TRAINING_TAIL = (
    'model = AutoModelForCausalLM.from_pretrained("tiny")\n'
    'args = TrainingArguments(output_dir="out", per_device_train_batch_size=2)\n'
    "Trainer(model=model, args=args).train()\n"
)
IMPORTS = "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"

BOMBS = {
    # each doubles a value forty times: 2**40 characters, items or paths if nothing stops it
    "string": ('s = "ab"\n' + "s = s + s\n" * 40, "a string of more than"),
    "f-string": ('s = "ab"\n' + 's = f"{s}{s}"\n' * 40, "a string of more than"),
    "list": ('xs = ["a", "b"]\n' + "xs = xs + xs\n" * 40, "a list of more than"),
    "starred list": ("xs = [1]\n" + "xs = [*xs, *xs]\n" * 40, "a list of more than"),
    "shared dict": (
        'd = {"a": 1}\n'
        + 'd = {"x": d, "y": d}\n'
        + "d = {'x': d, 'y': d}\n" * 39
        + "label = str(d)\n",
        "a value of more than",
    ),
    "huge range loop": (
        'xs = ["a"]\nfor step in range(10**12):\n    xs = xs + xs\n    n = 10 ** step\n',
        "",
    ),
}


def run_limited(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the CLI with 1 GB of address space; returns the process and its wall time."""
    import resource
    import time

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "llmmem", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
        cwd=cwd,
        preexec_fn=limit,
    )
    return proc, time.monotonic() - started


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_value_that_doubles_forty_times_is_given_up_on(project: Path, name: str) -> None:
    bomb, note = BOMBS[name]
    tiny_model(project / "tiny")
    script = project / "train.py"
    script.write_text(IMPORTS + bomb + TRAINING_TAIL)
    proc, seconds = run_limited(["explain", "train.py", "--format", "json"], project)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert seconds < 5, seconds
    out = json.loads(proc.stdout)
    assert out["budget"] is not None, out["problems"]  # the rest of the script still counts
    assert out["plan"]["per_device_train_batch_size"]["value"] == 2
    if note:
        assert any(note in problem for problem in out["problems"]), out["problems"]


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_reading_stops_after_a_bounded_number_of_steps(project: Path) -> None:
    tiny_model(project / "tiny")
    body = "def grow(a, b=2):\n" + "    a = a * b + 1\n" * 3000 + "    return a\n"
    script = project / "train.py"
    script.write_text(IMPORTS + TRAINING_TAIL + body + "grow(1)\n" * 300)
    proc, seconds = run_limited(["explain", "train.py", "--format", "json"], project)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert seconds < 5, seconds
    out = json.loads(proc.stdout)
    assert out["budget"] is not None
    assert any("stopped reading at line" in problem for problem in out["problems"]), out


# -- 10. no silent passes: unknown names are findings; files that are not training say nothing ----

FULL_8B = (
    "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
    'model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")\n'
    'args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, optim="{optim}")\n'
    "Trainer(model=model, args=args).train()\n"
)


def test_an_unknown_optimizer_is_an_error_with_close_matches(project: Path) -> None:
    script = project / "train.py"
    script.write_text(FULL_8B.format(optim="adamw_bnb_8bt"))
    proc = lint(str(script), "--gpu", "H100")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    assert line.startswith(f"{script}:3:81: LLM012 [error] unknown optimizer 'adamw_bnb_8bt'")
    assert "did you mean adamw_bnb_8bit" in line
    (finding,) = lint_json(script)
    titles = [fix["title"] for fix in finding["fixes"]]
    assert titles[0] == "Use optim=adamw_bnb_8bit"
    assert finding["fixes"][0]["edits"][0]["new_text"] == '"adamw_bnb_8bit"'
    # spelled right, the same file is estimated (and does not fit an H100)
    script.write_text(FULL_8B.format(optim="adamw_bnb_8bit"))
    assert "LLM012" not in lint(str(script), "--gpu", "H100").stdout


def test_lora_targets_that_match_no_module_are_a_warning_with_the_models_names(
    project: Path,
) -> None:
    script = project / "train.py"
    script.write_text(
        "from peft import LoraConfig, get_peft_model\n"
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
        'model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_prj", "v_prj"]))\n'
        'args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, bf16=True)\n'
        "Trainer(model=model, args=args).train()\n"
    )
    proc = lint(str(script), "--gpu", "H100")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    assert f"{script}:4:" in line and "LLM013 [warning]" in line
    assert "did you mean q_proj for q_prj, v_proj for v_prj?" in line
    assert "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj" in line
    (finding,) = lint_json(script)
    assert finding["fixes"][0]["edits"][0]["new_text"] == '["q_proj", "v_proj"]'


def test_files_without_any_training_signal_get_no_finding(project: Path) -> None:
    files = {
        "util.py": "import os\n\nprint(os.getcwd())\n",
        "ci.yaml": "name: ci\non: push\njobs: {}\n",
        "data.json": '{"rows": [1, 2, 3]}\n',
        "run.sh": "#!/bin/sh\nls -la\n",
    }
    for name, text in files.items():
        (project / name).write_text(text)
    proc = lint(*(str(project / name) for name in files), "--gpu", "H100", "--fail-on", "info")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    # a file that does say something about training, without a model, still asks for one
    (project / "args_only.py").write_text(
        "from transformers import TrainingArguments\n"
        'args = TrainingArguments(output_dir="out", per_device_train_batch_size=4)\n'
    )
    proc = lint(str(project / "args_only.py"), "--gpu", "H100")
    assert (
        "LLM010 [info] line" not in proc.stdout and ": LLM010 [info] no model found" in proc.stdout
    )


def test_pre_commit_passes_a_fitting_qlora_script_printing_its_info_finding(
    project: Path,
) -> None:
    pre_commit = shutil.which("pre-commit") or str(Path(sys.executable).parent / "pre-commit")
    (project / ".git").rmdir()
    (project / "fits_qlora.py").write_text(
        "import torch\n"
        "from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training\n"
        "from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer\n"
        "from transformers import TrainingArguments\n"
        'quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",\n'
        "                           bnb_4bit_compute_dtype=torch.bfloat16)\n"
        'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B",\n'
        "                                             quantization_config=quant)\n"
        "model = prepare_model_for_kbit_training(model)\n"
        'model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))\n'
        'args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, bf16=True,\n'
        '                         optim="paged_adamw_8bit")\n'
        "Trainer(model=model, args=args).train()\n"
    )
    (project / "util.py").write_text("import os\n\nprint(os.getcwd())\n")
    (project / "settings.yaml").write_text("name: ci\n")
    (project / "pyproject.toml").write_text('[tool.llmmem]\ngpu = "H200"\n')
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "."], cwd=project, check=True)
    env = {**ENV, "PRE_COMMIT_HOME": str(project / ".pre-commit-cache"), "PIP_NO_INPUT": "1"}
    proc = subprocess.run(
        [pre_commit, "try-repo", str(REPO), "llmmem-lint", "--all-files", "--verbose"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "fits_qlora.py:" in output and "LLM003 [info]" in output
    assert "util.py" not in output and "settings.yaml" not in output and "LLM010" not in output


# -- paths and durations named on the command line ---------------------------------------------


def test_a_fifo_named_on_the_command_line_is_called_what_it_is(tmp_path: Path) -> None:
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    assert_usage_error(lint(str(fifo), timeout=10), "named pipe (FIFO), not a file")
    for command in ("explain", "verify"):
        assert_usage_error(llmmem(command, str(fifo), timeout=10), "named pipe (FIFO)")
    assert_usage_error(lint(str(tmp_path / "missing.py"), timeout=10), "no such file")


@pytest.mark.parametrize("seconds", ["nan", "inf", "-5", "0", "soon"])
def test_verify_timeout_is_a_finite_number_of_seconds(seconds: str) -> None:
    proc = llmmem("verify", str(EXAMPLES / "qlora_sft.py"), "--simulate", "--timeout", seconds)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--timeout" in proc.stderr


@pytest.mark.parametrize("written", ["0", "-1", '"abc"'])
def test_an_invalid_batch_is_a_finding_on_its_line_not_a_silent_default(
    tmp_path: Path, written: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        IMPORTS
        + 'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
        + f'args = TrainingArguments(output_dir="out", per_device_train_batch_size={written})\n'
    )
    proc = lint(str(script), "--gpu", "A100-80GB", "--format", "json")
    assert "Traceback" not in proc.stderr
    found = [f for f in json.loads(proc.stdout) if f["code"] == "LLM011"]
    assert len(found) == 1, proc.stdout
    assert found[0]["range"]["start_line"] == 2
    assert "per_device_train_batch_size" in found[0]["message"]
    assert proc.returncode == 1  # a warning fails the default --fail-on warning


def test_a_broken_pyproject_is_a_usage_error_not_a_dropped_setting(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.llmmem\ngpu = "T4"\n')
    script = tmp_path / "train.py"
    shutil.copy(EXAMPLES / "qlora_sft.py", script)
    for proc in (lint(str(script), cwd=tmp_path), llmmem("explain", str(script), cwd=tmp_path)):
        assert_usage_error(proc, "pyproject.toml is not valid TOML", "[tool.llmmem]")
