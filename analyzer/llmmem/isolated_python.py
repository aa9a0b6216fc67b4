"""Starting another Python process of llmmem's: never importing from the user's project, and
never reaching the network unless the user said it may.

A process started as `python -m MODULE` in the user's folder would import that folder's
`json.py`, `torch.py` or `transformers.py` before the real ones (`-m` puts the working directory
first on `sys.path`), and `PYTHONPATH`, `PYTHONSTARTUP` or a `.pth` file pointing there would do
the same. So a child runs as `python -I` (no working directory, no user site-packages, no
`PYTHON*` variables) from a working directory of llmmem's own, and its `sys.path` is set to the
one this process imports from, less anything that names the working directory.

Transformers and huggingface_hub reach the hub on their own (a hub kernel for a layer, a
version check, telemetry): unless the user allowed hub lookups, a child runs with the hub's
offline switches set and transformers' hub kernels turned off.

`python -m llmmem` itself runs `without_working_directory` before it imports anything else, so
this module imports only `os` and `sys` (loaded before any of the user's files can be) and no
`__future__`, which would be looked up on the unsafe path like any other module.
"""

import os
import sys

# run by `python -I -c`: set the path this process imports from, then run the module as `-m` would
_BOOTSTRAP = (
    "import json, runpy, sys; "
    "sys.path[:] = json.loads(sys.argv[1]); "
    "module = sys.argv[2]; "
    "sys.argv[:] = [module, *sys.argv[3:]]; "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)

# what keeps transformers, huggingface_hub and datasets off the network
OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "USE_HUB_KERNELS": "0",  # transformers: no layer or function replaced by a hub kernel
}


def without_working_directory(path: list[str]) -> list[str]:
    """`path` less the entries that name the working directory: '', relative entries (they
    are read from it) and the directory itself."""
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:  # a working directory removed under us: only relative entries name it
        here = None
    return [
        entry
        for entry in path
        if os.path.isabs(entry) and (here is None or os.path.realpath(entry) != here)
    ]


def isolated_python(module: str, *args: str) -> list[str]:
    """The command that runs `python -m module args` isolated: `-I` and an explicit `sys.path`
    (`-u`: `-I` ignores PYTHONUNBUFFERED, and the parent reads the child's progress as it comes).
    The arguments are passed as they are, so paths in them must be absolute."""
    import json

    path = json.dumps(without_working_directory(sys.path))
    return [sys.executable, "-I", "-u", "-c", _BOOTSTRAP, path, module, *args]


def child_environment(*, allow_network: bool) -> dict[str, str]:
    """This process's environment for a child, with the offline switches set unless the user
    allowed hub lookups."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not allow_network:
        environment.update(OFFLINE_ENVIRONMENT)
    return environment
