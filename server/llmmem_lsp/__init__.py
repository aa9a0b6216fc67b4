"""llmmem's language server (`llmmem-lsp`, `python -m llmmem_lsp`): hovers, diagnostics, code
actions, code lens and inlay hints over LSP, computed by the `llmmem` analyzer."""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from llmmem_lsp.__main__ import main as run

    return run(argv)
