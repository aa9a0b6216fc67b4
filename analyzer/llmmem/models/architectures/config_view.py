"""Typed reads from an HF `config.json` dict, with the transformers config-class defaults behind it.

A hub `config.json` only lists the keys its author saved; transformers fills the rest from the
defaults of the config class of that `model_type`. `ConfigView` does the same from a table of those
defaults, remembers which keys it had to take from the table (they end up in `ModelSpec.notes`), and
turns a missing or malformed size key into a `ConfigFieldError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmmem.models.spec import ModelSpecError


class ConfigFieldError(ModelSpecError):
    """A key the reader cannot do without is absent, null or of the wrong type."""


@dataclass
class ConfigView:
    model_type: str
    config_class: str  # the transformers class whose defaults fill absent keys, e.g. "LlamaConfig"
    values: Mapping[str, Any]
    defaults: Mapping[str, Any]
    defaulted: dict[str, Any] = field(default_factory=dict)  # absent keys read from `defaults`

    def value(self, key: str, *aliases: str) -> Any:
        """The saved value of `key` (or of its first saved alias), else the class default.

        A key saved as null stays None: in a config.json null is a setting ("no sliding window").
        """
        for name in (key, *aliases):
            if name in self.values:
                return self.values[name]
        if key in self.defaults:
            self.defaulted[key] = self.defaults[key]
            return self.defaults[key]
        return None

    def is_saved(self, key: str, *aliases: str) -> bool:
        return any(name in self.values for name in (key, *aliases))

    def required_int(self, key: str, *aliases: str) -> int:
        """A size the config must state itself: a class default would describe another model."""
        for name in (key, *aliases):
            if name in self.values and self.values[name] is not None:
                found = self._as_int(name, self.values[name])
                if found <= 0:
                    raise ConfigFieldError(f"the {self.model_type} config has {name}={found}")
                return found
        spelled = " or ".join(repr(name) for name in (key, *aliases))
        raise ConfigFieldError(f"the {self.model_type} config has no {spelled}")

    def optional_int(self, key: str, *aliases: str) -> int | None:
        raw = self.value(key, *aliases)
        return None if raw is None else self._as_int(key, raw)

    def int_or(self, fallback: int, key: str, *aliases: str) -> int:
        """The saved or default value of `key`, or `fallback` where both are null."""
        found = self.optional_int(key, *aliases)
        return fallback if found is None else found

    def flag(self, key: str, *aliases: str) -> bool:
        return bool(self.value(key, *aliases))

    def number(self, key: str, *aliases: str) -> float | None:
        raw = self.value(key, *aliases)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ConfigFieldError(
                f"the {self.model_type} config has a non-numeric {key!r}: {raw!r}"
            )
        return float(raw)

    def text(self, key: str, *aliases: str) -> str | None:
        raw = self.value(key, *aliases)
        return None if raw is None else str(raw)

    def int_list(self, key: str) -> list[int]:
        raw = self.value(key)
        if raw is None:
            return []
        if not isinstance(raw, list) or not all(_is_int(item) for item in raw):
            raise ConfigFieldError(f"the {self.model_type} config has a malformed {key!r}: {raw!r}")
        return [int(item) for item in raw]

    def text_list(self, key: str) -> list[str] | None:
        raw = self.value(key)
        if raw is None:
            return None
        if not isinstance(raw, list):
            raise ConfigFieldError(f"the {self.model_type} config has a malformed {key!r}: {raw!r}")
        return [str(item) for item in raw]

    def defaults_note(self) -> str | None:
        """One line naming the class defaults that stood in for absent keys.

        A None default means "derived from other keys" (head_dim from hidden / heads); left out.
        """
        used = {key: value for key, value in self.defaulted.items() if value is not None}
        if not used:
            return None
        listed = ", ".join(f"{key}={value!r}" for key, value in sorted(used.items()))
        return f"absent keys read as transformers {self.config_class} defaults: {listed}"

    def _as_int(self, key: str, raw: Any) -> int:
        if not _is_int(raw):
            raise ConfigFieldError(
                f"the {self.model_type} config has a non-integer {key!r}: {raw!r}"
            )
        return int(raw)


def _is_int(raw: Any) -> bool:
    if isinstance(raw, bool):
        return False
    return isinstance(raw, int) or (isinstance(raw, float) and raw.is_integer())
