"""A cache on disk that cannot be read: said once, as a warning naming the path, and then done
without.

Model resolution reads two caches under the user's home: the Hugging Face hub cache and
llmmem's copy of earlier hub lookups. A home the user cannot read (`docker run --user` with the
image's HOME, a HOME that is a file) makes every read there fail with EACCES or ENOTDIR. That is
not "not cached", which is silent, and not a reason to give up on the model either: the bundled
catalog and the rest of the order still size it. So the failure is a warning, on the `llmmem`
logger (a command with no logging set up prints it to stderr as one line), given once per path a
process, and the text is also returned for the notes of the model that was sized without it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

_logger = logging.getLogger("llmmem")
_said: set[str] = set()
_said_lock = threading.Lock()


def unreadable_cache(what: str, path: Path | str, reason: str) -> str:
    """Warn once that `what` (the Hugging Face cache, llmmem's hub cache) at `path` cannot be
    read because of `reason`; what could not be read, in words, for a note."""
    text = f"cannot read {what} at {path} ({reason})"
    with _said_lock:
        first = text not in _said
        _said.add(text)
    if first:
        _logger.warning("llmmem: warning: %s; going on without it", text)
    return text


def reason_of(error: BaseException) -> str:
    """An OSError's reason without the path it names (the warning names the cache instead)."""
    if isinstance(error, OSError) and error.strerror:
        return str(error.strerror)
    return str(error) or type(error).__name__
