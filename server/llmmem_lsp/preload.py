"""Import the analyzer once, on the event loop's thread, before any worker thread does.

The server answers on the event loop and analyses in worker threads, and both import the
analyzer's modules lazily. Two threads importing a package and one of its submodules for the
first time at the same moment can deadlock in Python's import system: one holds the
submodule's lock and waits for the package's, the other runs the package's `__init__` and
waits for the submodule's (Python then raises `_DeadlockError` in one of them, which reached a
user as a failed completion request). Importing every module once, on one thread, before the
first analysis starts leaves no first import to race: `preload` runs before an analysis thread
starts and before a job goes to a `PreloadingExecutor` (the event loop's default executor and
the hub lookups' pool), each on the event loop's thread.

Left out: the modules of `llmmem.verify` (the in-process step runners: they import torch, and
the server runs `llmmem verify` in a subprocess) and of `llmmem.integrations` (the in-run API,
for the training process), so a start stays free of torch; walking the packages still imports
their `__init__` modules, which import no torch. Third-party libraries the analysis imports late
(huggingface_hub for a cached model, urllib in a hub lookup) are not preloaded: they are
imported by one analysis or lookup thread at a time in the usual case, not guarded.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

R = TypeVar("R")

log = logging.getLogger("llmmem_lsp")

SKIPPED = ("llmmem.verify", "llmmem.integrations")

_done = False


def preloaded_modules() -> list[str]:
    """The modules `preload` imports, in the order it imports them."""
    names = []
    for package in ("llmmem", "llmmem_lsp"):
        spec = importlib.util.find_spec(package)
        where = spec.submodule_search_locations if spec else None
        for found in pkgutil.walk_packages(list(where or ()), package + "."):
            name = found.name
            if name.rsplit(".", 1)[-1] == "__main__":
                continue
            if any(name == skip or name.startswith(skip + ".") for skip in SKIPPED):
                continue
            names.append(name)
    return names


def preload() -> None:
    """Import the analyzer and the server's modules (once; later calls return at once).

    Call it on the event loop's thread before starting a worker thread. A module that fails
    to import is left for the analysis that needs it to say what is wrong."""
    global _done
    if _done:
        return
    _done = True
    try:
        names = preloaded_modules()  # walking the packages imports their __init__ modules
    except Exception:
        log.debug("preloading the analyzer failed", exc_info=True)
        return
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            log.debug("preloading %s failed", name, exc_info=True)


class PreloadingExecutor(ThreadPoolExecutor):
    """A thread pool whose first job waits for `preload` on the submitting thread (the event
    loop's), so a job never imports a module for the first time beside another thread."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        preload()
        return super().submit(fn, *args, **kwargs)
