"""A real LSP client (pytest-lsp) talking to `python -m llmmem_lsp` over stdio."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsp_helpers import SERVER_ENV, make_client
from pytest_lsp import ClientServerConfig, LanguageClient

CONFIG = ClientServerConfig(
    server_command=[sys.executable, "-m", "llmmem_lsp"],
    server_env=SERVER_ENV,
    client_factory=make_client,
)


@pytest_lsp.fixture(config=CONFIG)
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    """A started server, not yet initialized: each test picks the client it plays."""
    yield lsp_client
    await lsp_client.shutdown_session()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".git").mkdir()  # stop the pyproject.toml search here
    return tmp_path
