"""The server's settings: `initializationOptions` and `workspace/configuration` section `llmmem`.

Both carry the same object (camelCase, as editors write settings); unknown keys are ignored and a
wrong value is reported once and replaced by its default, so a typo in a settings file never
stops the server. The types are declared in `settings_model.ServerSettingsModel`, which words
the message when a value is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

SEVERITY_LEVELS = ("error", "warning", "info", "off")


@dataclass(frozen=True)
class ServerSettings:
    gpu: str | None = None  # a GPU name or capacity; None: pragma, pyproject, then this machine's
    world_size: int | None = None  # used where no file or launcher says
    hub: bool = True  # may llmmem look models up on the Hugging Face Hub
    hub_timeout_s: float = 3.0
    severity: dict[str, str] = field(default_factory=dict)  # rule code -> error|warning|info|off
    debounce_ms: int = 300  # quiet time after the last edit before analysing
    detect_gpu: bool = True  # look for a local GPU when no GPU is set anywhere
    analysis_timeout_s: float = 10.0  # one document's analysis is abandoned after this


def read_settings(raw: Any, base: ServerSettings | None = None) -> tuple[ServerSettings, list[str]]:
    """Settings from an editor's object (either the section itself or `{"llmmem": {...}}`),
    on top of `base`; returns them with one line per value that was not understood."""
    settings = base or ServerSettings()
    problems: list[str] = []
    if raw is None:
        return settings, problems
    if isinstance(raw, dict) and isinstance(raw.get("llmmem"), dict):
        raw = raw["llmmem"]
    if not isinstance(raw, dict):
        return settings, [f"llmmem settings must be an object, got {type(raw).__name__}"]
    changes: dict[str, Any] = {}

    gpu = raw.get("gpu")
    if "gpu" in raw:
        if gpu is None or (isinstance(gpu, str) and not gpu.strip()):
            changes["gpu"] = None
        elif isinstance(gpu, str):
            changes["gpu"] = gpu.strip()
        else:
            problems.append(f"llmmem.gpu must be a GPU name such as A100-80GB, got {gpu!r}")

    if "worldSize" in raw:
        world_size = raw["worldSize"]
        if world_size is None or world_size == 0:  # VS Code's default: null
            changes["world_size"] = None
        elif isinstance(world_size, int) and not isinstance(world_size, bool) and world_size > 0:
            # here, not at start: the bound's module loads the extractors
            from llmmem.extract.numbers import MAX_COUNT

            if world_size <= MAX_COUNT:
                changes["world_size"] = world_size
            else:
                problems.append(f"llmmem.worldSize must be a positive integer, got {world_size!r}")
        else:
            problems.append(f"llmmem.worldSize must be a positive integer, got {world_size!r}")

    for key, name in (("hub", "hub"), ("detectGpu", "detect_gpu")):
        if key in raw:
            if isinstance(raw[key], bool):
                changes[name] = raw[key]
            else:
                problems.append(f"llmmem.{key} must be true or false, got {raw[key]!r}")

    if "hubTimeoutSeconds" in raw:
        value = raw["hubTimeoutSeconds"]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 60:
            changes["hub_timeout_s"] = float(value)
        else:
            problems.append(f"llmmem.hubTimeoutSeconds must be between 0 and 60, got {value!r}")

    if "analysisTimeoutSeconds" in raw:
        value = raw["analysisTimeoutSeconds"]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 600:
            changes["analysis_timeout_s"] = float(value)
        else:
            problems.append(
                f"llmmem.analysisTimeoutSeconds must be between 0 and 600, got {value!r}"
            )

    if "debounceMs" in raw:
        value = raw["debounceMs"]
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10_000:
            changes["debounce_ms"] = value
        else:
            problems.append(f"llmmem.debounceMs must be 0 to 10000, got {value!r}")

    if "severity" in raw:
        value = raw["severity"]
        if isinstance(value, dict):
            levels: dict[str, str] = {}
            for code, level in value.items():
                if isinstance(level, str) and level.lower() in SEVERITY_LEVELS:
                    levels[str(code).upper()] = level.lower()
                else:
                    problems.append(
                        f"llmmem.severity.{code} must be one of {', '.join(SEVERITY_LEVELS)}, "
                        f"got {level!r}"
                    )
            changes["severity"] = levels
        else:
            problems.append("llmmem.severity must map rule codes to error/warning/info/off")

    if problems:  # worded by the declared types; the hand lines only if the model disagrees
        from llmmem_lsp.settings_model import settings_messages

        problems = settings_messages(raw) or problems
    return replace(settings, **changes), problems
