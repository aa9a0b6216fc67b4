"""Files the server reads from the workspace: bounded, never blocking, regular files only.

pygls gives a document the editor has not opened the text of its file, read whole and blocking:
a request on a FIFO waits for a writer forever, one on `/dev/zero` reads until memory runs out,
and a notebook cell the editor opened without its text is read from the path in its
`vscode-notebook-cell:` URI (the notebook, or anything). Here such a document's text is read
with `llmmem.files.read_file_bytes` (the type checked before the file is opened and on what was
opened, opened with O_NONBLOCK, at most `MAX_DOCUMENT_BYTES` read); a file that cannot be read
so, and any URI that is no `file:` URI, has no text (""), with the reason logged once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pygls.uris import uri_scheme
from pygls.workspace import TextDocument, Workspace

log = logging.getLogger("llmmem_lsp")

MAX_DOCUMENT_BYTES = 5 * 1024 * 1024  # as `llmmem-lint` reads a file

_logged: set[str] = set()


def read_workspace_bytes(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, read without blocking; raises an
    OSError saying why not (a FIFO, a device, a directory, too large, missing)."""
    from llmmem.files import read_file_bytes

    return read_file_bytes(path, max_bytes)


def read_workspace_text(path: Path | str, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """`read_workspace_bytes` as text (UTF-8, a bad byte replaced, as `llmmem-lint` reads)."""
    return read_workspace_bytes(path, max_bytes).decode("utf-8", errors="replace")


class DiskDocument(TextDocument):
    """A document the editor has not opened: its file's text, read as above."""

    @property
    def source(self) -> str:
        if self._source is not None:
            return self._source
        if uri_scheme(self.uri) != "file" or not self.path:
            return ""  # a notebook cell or another URI with no file of its own
        try:
            return read_workspace_text(self.path)
        except OSError as err:
            if self.uri not in _logged:
                _logged.add(self.uri)
                log.info("%s is not read: %s", self.path, err)
            return ""


class DiskBoundedWorkspace(Workspace):
    """pygls's workspace, whose documents not opened by the editor are `DiskDocument`s."""

    def _create_text_document(
        self,
        doc_uri: str,
        source: str | None = None,
        version: int | None = None,
        language_id: str | None = None,
    ) -> TextDocument:
        return DiskDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self._position_codec,
        )


def bound_disk_reads(workspace: Any) -> None:
    """Makes the workspace pygls built at `initialize` a `DiskBoundedWorkspace` (pygls builds
    it itself, before any document is added, and has no parameter for its class)."""
    if isinstance(workspace, Workspace) and not isinstance(workspace, DiskBoundedWorkspace):
        workspace.__class__ = DiskBoundedWorkspace
