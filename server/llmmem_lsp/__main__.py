"""`llmmem-lsp` / `python -m llmmem_lsp`: serve LSP over stdio (the default) or TCP."""

from __future__ import annotations

import os
import sys


def _drop_working_directory() -> None:
    """`python -m` puts the working directory first on sys.path, so a `logging.py` or
    `torch.py` in the workspace an editor starts the server in would be imported instead of the
    real module. Nothing the server imports lives there: drop it before any other import."""
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:
        here = None
    sys.path[:] = [
        entry
        for entry in sys.path
        if entry not in ("", ".") and (here is None or os.path.realpath(entry) != here)
    ]


_drop_working_directory()

import argparse  # noqa: E402 - after the working directory has left sys.path
import logging  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from llmmem.errors import OneLineParser
    from llmmem.version import __version__

    parser: argparse.ArgumentParser = OneLineParser(
        prog="llmmem-lsp",
        description="llmmem's language server: GPU memory of LLM training steps in the editor.",
    )
    parser.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (default)")
    parser.add_argument("--tcp", metavar="PORT", type=int, help="listen on 127.0.0.1:PORT")
    parser.add_argument(
        "--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument("--version", action="version", version=f"llmmem-lsp {__version__}")
    args = parser.parse_args(argv)
    # stdout carries the protocol: logs go to stderr, which editors show in their output panel
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level, format="%(levelname)s %(name)s: %(message)s"
    )
    from llmmem_lsp.server import server

    if args.tcp is not None:
        server.start_tcp("127.0.0.1", args.tcp)
    else:
        server.start_io()
    # the protocol's rule: 0 after `shutdown`, 1 when `exit` (or the end of input) came first
    return 0 if server.shutdown_received else 1


if __name__ == "__main__":
    sys.exit(main())
