"""The declared types of the server's settings (`llmmem.*` in an editor), as a pydantic model.

`read_settings` checks the settings by hand and imports this module only when it refuses a value,
so that the message comes from here: the key as the editor writes it and the expected type (see
`llmmem.schema` for why pydantic is kept off the path of good input).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmmem.extract.numbers import MAX_COUNT
from llmmem.schema import invalid_messages


class ServerSettingsModel(BaseModel):
    """`initializationOptions` and the `llmmem` section of `workspace/configuration`."""

    model_config = ConfigDict(extra="ignore", strict=True, title="llmmem language server settings")

    gpu: str | None = Field(None, description="a GPU name such as A100-80GB")
    worldSize: int | None = Field(
        None, ge=0, le=MAX_COUNT, description="a positive integer (0 or null: not set)"
    )
    hub: bool = Field(True, description="true or false")
    detectGpu: bool = Field(True, description="true or false")
    hubTimeoutSeconds: float = Field(3.0, gt=0, le=60, description="between 0 and 60 (seconds)")
    analysisTimeoutSeconds: float = Field(
        10.0, gt=0, le=600, description="between 0 and 600 (seconds)"
    )
    debounceMs: int = Field(300, ge=0, le=10_000, description="0 to 10000 (milliseconds)")
    severity: dict[
        str,
        Annotated[
            Literal["error", "warning", "info", "off"],
            Field(description="one of error, warning, info, off"),
        ],
    ] = Field(default_factory=dict, description="a map of rule code to error/warning/info/off")


def settings_messages(raw: dict[str, Any]) -> list[str] | None:
    """One line per value of the editor's settings that the model refuses; None if none."""
    data = dict(raw)
    if isinstance(data.get("severity"), dict):
        data["severity"] = {
            code: level.lower() if isinstance(level, str) else level
            for code, level in data["severity"].items()
        }
    return invalid_messages(ServerSettingsModel, data, "llmmem.")
