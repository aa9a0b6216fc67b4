"""llmmem in an axolotl run, with no code: two lines of the YAML.

    plugins:
      - llmmem.integrations.axolotl.LlmmemPlugin
    llmmem_gpu: A100-80GB        # optional: by default the GPU torch sees
    llmmem_on_oom: raise         # optional: warn (default), raise or ignore

axolotl loads a plugin by its dotted path (`axolotl.integrations.base.load_plugin`: import the
module, take the class, instantiate it) and asks each plugin for callbacks once the trainer is
built (`add_callbacks_post_trainer`). This plugin answers with `LlmmemCallback` for the config
file axolotl was started with (`cfg.axolotl_config_path`), so the run is sized before its first
step and recorded against that YAML: the next `llmmem explain` of it takes its band from the run.
`get_input_args` names the plugin's keys, which axolotl's config check then accepts.

The classes subclass axolotl's and pydantic's, so they are made when first asked for (this module
imports neither until then).
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["LlmmemArgs", "LlmmemPlugin"]  # noqa: F822 - made on first use (__getattr__)


@cache
def _args_class() -> Any:
    from pydantic import BaseModel

    class LlmmemArgs(BaseModel):
        """The plugin's keys in an axolotl YAML."""

        llmmem_gpu: str | None = None
        llmmem_on_oom: str = "warn"
        llmmem_meter: str = "auto"
        llmmem_record: bool = True

    LlmmemArgs.__module__ = __name__
    return LlmmemArgs


@cache
def _plugin_class() -> Any:
    from axolotl.integrations.base import BasePlugin

    class LlmmemPlugin(BasePlugin):  # type: ignore[misc, valid-type]
        """Preflight before step one and the first steps recorded, for an axolotl run."""

        def get_input_args(self) -> str:
            return f"{__name__}.LlmmemArgs"

        def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
            from llmmem.integrations.callback import LlmmemCallback

            def setting(key: str, default: Any) -> Any:
                value = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
                return default if value is None else value

            config = setting("axolotl_config_path", None)
            return [
                LlmmemCallback(
                    gpu=setting("llmmem_gpu", None),
                    on_oom=setting("llmmem_on_oom", "warn"),
                    meter=setting("llmmem_meter", "auto"),
                    record=bool(setting("llmmem_record", True)),
                    script=str(config) if config else None,
                )
            ]

    LlmmemPlugin.__module__ = __name__
    return LlmmemPlugin


def __getattr__(name: str) -> Any:
    if name == "LlmmemPlugin":
        return _plugin_class()
    if name == "LlmmemArgs":
        return _args_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
