"""`llmmem-lint --fix` rewrites a file's text, not the file: its owner, group, mode, extended
attributes and (for a file with several names) its inode stay what they were.

Each case runs the installed command on a script it can fix (the micro-batch halved on an
RTX 3060) and looks at the file afterwards as `ls -l` and `stat` would.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

LINT = str(Path(sys.executable).parent / "llmmem-lint")  # the installed command
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

SCRIPT = """from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype="bfloat16")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    bf16=True,
    gradient_checkpointing=True,
    optim="adamw_bnb_8bit",
)
Trainer(model=model, args=args).train()
"""

as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file to another user"
)


def fix(path: Path, **options: object) -> subprocess.CompletedProcess[str]:
    options.setdefault("env", ENV)
    proc = subprocess.run(
        [LINT, "--fix", "--gpu", "RTX-3060", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        **options,  # type: ignore[call-overload]
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def fixed(text: str) -> bool:
    return (
        "per_device_train_batch_size=8," not in text
        and "gradient_accumulation_steps=2," not in text
    )


def test_the_script_is_fixed_at_all(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = fix(script)
    assert proc.returncode in (0, 1), proc.stderr
    assert fixed(script.read_text())


@as_root
def test_a_fix_by_root_keeps_the_files_owner_group_and_mode(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    os.chown(script, 1234, 5678)
    os.chmod(script, 0o640)
    fix(script)
    after = script.stat()
    assert fixed(script.read_text())
    assert (after.st_uid, after.st_gid) == (1234, 5678)  # not root:root
    assert stat.S_IMODE(after.st_mode) == 0o640


def test_a_fix_keeps_the_files_extended_attributes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    try:
        os.setxattr(script, "user.origin", b"shared notebook server")
    except OSError:
        pytest.skip("this file system keeps no user attributes")
    fix(script)
    assert fixed(script.read_text())
    assert os.getxattr(script, "user.origin") == b"shared notebook server"


def test_a_hard_linked_file_is_fixed_under_every_name(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    other = tmp_path / "jobs" / "train_copy.py"
    other.parent.mkdir()
    os.link(script, other)
    inode = script.stat().st_ino
    fix(script)
    assert fixed(script.read_text())
    assert other.read_text() == script.read_text()  # the other name shows the fix too
    assert script.stat().st_ino == inode and script.stat().st_nlink == 2


@as_root
def test_a_hard_linked_file_keeps_its_owner(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    os.link(script, tmp_path / "again.py")
    os.chown(script, 1234, 5678)
    os.chmod(script, 0o664)
    fix(script)
    after = script.stat()
    assert fixed((tmp_path / "again.py").read_text())
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (1234, 5678, 0o664)


@as_root
def test_a_group_member_fixing_a_colleagues_file_leaves_it_the_colleagues() -> None:
    """A user who may write a file owned by someone else (a shared group) cannot give a new
    file that owner: the fix is written through the file itself, which stays the owner's.
    (The writer runs in a child process that has become that user: this machine's Python is
    not one another user may start.)"""
    shared = tempfile.TemporaryDirectory(prefix="llmmem-shared-")  # a folder anyone may enter
    folder = Path(shared.name)
    os.chmod(folder, 0o777)  # the user may make a file here: the rename path is open
    script = folder / "train.py"
    script.write_text(SCRIPT)
    os.chown(script, 2000, 3000)
    os.chmod(script, 0o664)
    new_text = SCRIPT.replace("per_device_train_batch_size=8", "per_device_train_batch_size=4")
    with shared:
        written_as_member(script, new_text)
        after = script.stat()
        assert script.read_text() == new_text
        assert (after.st_uid, after.st_gid) == (2000, 3000)  # not the fixing user's
        assert stat.S_IMODE(after.st_mode) == 0o664
        assert [p.name for p in folder.iterdir()] == ["train.py"]  # no temporary left behind


def written_as_member(script: Path, new_text: str) -> None:
    """`write_in_place` run by user 1000 of group 3000, in a child process."""
    from llmmem.fix_writer import write_in_place

    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit status is the result
        try:
            os.setgroups([3000])
            os.setgid(3000)
            os.setuid(1000)
            write_in_place(script, new_text.encode())
            os._exit(0)
        except BaseException as err:
            os.write(2, f"{err!r}\n".encode())
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_read_only_file_is_still_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    os.link(script, tmp_path / "again.py")
    os.chmod(script, 0o444)
    proc = fix(script)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"llmmem-lint: error: {script}: cannot write the fixes (the file is read-only)"
    ]
    assert script.read_text() == SCRIPT
