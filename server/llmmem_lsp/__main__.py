"""`llmmem-lsp` / `python -m llmmem_lsp`: serve LSP over stdio (the default) or TCP."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from llmmem import __version__

    parser = argparse.ArgumentParser(
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
