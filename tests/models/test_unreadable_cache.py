"""A home llmmem cannot read (as `docker run --user` gives) still sizes a bundled model.

The Hugging Face cache and llmmem's copy of hub lookups live under HOME. When HOME cannot be
read, the lookup there fails with ENOTDIR (a HOME that is a file) or EACCES (a directory the
user may not enter): the run says so once, as a warning naming the path, and goes on to the
bundled catalog. Each case runs the installed `llmmem-lint` in a subprocess. Tests run as root,
which reads any directory: the EACCES case drops the capabilities that let it (setpriv), as a
user without them is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
LINT = str(BIN / "llmmem-lint") if (BIN / "llmmem-lint").exists() else "llmmem-lint"

# a bundled model that does not fit the GPU the file names: sized, it is an error (exit 1)
SCRIPT = """from transformers import AutoModelForCausalLM, TrainingArguments
# llmmem: gpu=24GiB
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, bf16=True)
"""
CACHE_VARIABLES = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "XDG_CACHE_HOME",
    "LLMMEM_CACHE_DIR",
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / ".git").mkdir(parents=True)
    (folder / "train.py").write_text(SCRIPT)
    return folder


def lint(
    project: Path, home: Path, prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    env["HOME"] = str(home)
    return subprocess.run(
        [*(prefix or []), LINT, "train.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def assert_sized_with_one_warning(proc: subprocess.CompletedProcess[str], hub_cache: Path) -> None:
    assert "LLM010" not in proc.stdout, proc.stdout  # not "cannot size"
    assert "LLM001 [error] Will not fit 24GiB" in proc.stdout, proc.stdout
    assert proc.returncode == 1, proc.stdout + proc.stderr
    warnings = proc.stderr.strip().splitlines()
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith(
        f"llmmem: warning: cannot read the Hugging Face cache at {hub_cache} ("
    )
    assert "Traceback" not in proc.stderr


def test_a_home_that_is_a_file(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory\n")
    proc = lint(project, home)
    assert_sized_with_one_warning(proc, home / ".cache" / "huggingface" / "hub")
    assert "(not a directory)" in proc.stderr.lower()


def _without_override() -> list[str] | None:
    """A prefix that runs a command without the capabilities to read any directory, or None
    when this process has none to drop (not root) or cannot drop them."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except OSError:
        return None
    return prefix if probe.returncode == 0 else None


def test_a_home_the_user_may_not_enter(project: Path, tmp_path: Path) -> None:
    prefix = _without_override()
    if prefix is None:
        pytest.skip("cannot run without the capability to read any directory")
    home = tmp_path / "home"
    (home / ".cache" / "huggingface" / "hub").mkdir(parents=True)
    home.chmod(0)
    try:
        proc = lint(project, home, prefix)
    finally:
        home.chmod(0o755)
    assert_sized_with_one_warning(proc, home / ".cache" / "huggingface" / "hub")
    assert "(Permission denied)" in proc.stderr


def test_resolution_goes_on_to_the_catalog_and_says_what_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from llmmem.models.resolve import resolve_model
    from llmmem.models.spec import ModelSource

    home = tmp_path / "home"
    home.write_text("")
    for variable in CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(home))
    hub_cache = home / ".cache" / "huggingface" / "hub"
    with caplog.at_level("WARNING", logger="llmmem"):
        first = resolve_model("meta-llama/Llama-3.1-8B", hub=False)
        second = resolve_model("meta-llama/Llama-3.1-8B", hub=False)
    assert first.source is ModelSource.CATALOG and second.source is ModelSource.CATALOG
    note = f"cannot read the Hugging Face cache at {hub_cache} (Not a directory)"
    assert note in first.notes
    said = [r.getMessage() for r in caplog.records if str(hub_cache) in r.getMessage()]
    assert said == [f"llmmem: warning: {note}; going on without it"]  # once a process
