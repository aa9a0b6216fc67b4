"""`python -m llmmem` is the `llmmem` command."""

from llmmem.cli import main

raise SystemExit(main())
