"""`python -m llmmem` is the `llmmem` command.

`-m` puts the working directory first on `sys.path`, and the working directory is the user's
project: its own `json.py`, `typing.py` or `transformers.py` would be imported, and run, in place
of the libraries llmmem uses. The working directory is taken off the path before anything else is
imported: `llmmem/__init__.py` imports nothing, `llmmem.isolated_python` only `os` and `sys`, and
there is no `__future__` import here (it is a module looked up on the path like any other).
"""

import sys

from llmmem.isolated_python import without_working_directory

sys.path[:] = without_working_directory(sys.path)

from llmmem.cli import main  # noqa: E402  (only once the path is safe)

raise SystemExit(main())
