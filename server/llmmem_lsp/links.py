"""Document links: from a DeepSpeed config's name (`deepspeed="ds.json"`, `--deepspeed ds.json`,
`deepspeed: ds.json`, `"deepspeed": "ds.json"`) and from a `# llmmem: model_config=...` comment
to the file they name, resolved against the document's folder; a name that is no file gets no
link."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from lsprotocol import types

_DEEPSPEED = re.compile(
    r"(?:--deepspeed(?:\s+|=)|(?:^|[\s,({\[])[\"']?deepspeed[\"']?\s*[=:]\s*)"
    r"(?P<quote>[\"']?)(?P<path>[^\s\"',)\]}]+)"
)
_MODEL_CONFIG = re.compile(
    r"#\s*llmmem\s*:.*?(?:^|\s)model_config\s*=\s*(?P<quote>[\"']?)(?P<path>[^\s\"']+)"
)


def _target(folder: Path, written: str) -> Path | None:
    path = Path(written).expanduser()
    if not path.is_absolute():
        path = folder / path
    try:
        return path.resolve() if path.is_file() else None
    except OSError:
        return None


def document_links(
    lines: list[str], folder: Path, to_client: Callable[[int, int], int]
) -> list[types.DocumentLink]:
    """The links of a text whose relative names are relative to `folder`."""
    out: list[types.DocumentLink] = []
    for number, line in enumerate(lines):
        if "deepspeed" not in line and "model_config" not in line:
            continue
        found = [*_DEEPSPEED.finditer(line), *_MODEL_CONFIG.finditer(line)]
        for match in found:
            target = _target(folder, match.group("path"))
            if target is None:
                continue
            start, end = match.span("path")
            out.append(
                types.DocumentLink(
                    range=types.Range(
                        start=types.Position(line=number, character=to_client(number, start)),
                        end=types.Position(line=number, character=to_client(number, end)),
                    ),
                    target=target.as_uri(),
                    tooltip=f"Open {match.group('path')}",
                )
            )
    return out
