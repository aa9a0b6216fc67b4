"""The typed declaration of what llmmem reads and writes, as pydantic models.

- `ProjectSettingsModel`: `[tool.llmmem]` in pyproject.toml;
- `PragmaValuesModel`: the `key=value` pairs of a `# llmmem:` comment;
- `ExplainReport` and `LintReport`: `llmmem explain --format json` and
  `llmmem-lint --format json`, whose JSON Schemas `llmmem schema explain|lint` prints and the
  package ships (`schemas/*.schema.json`).

The language server's settings have their model beside the server (`llmmem_lsp.settings_model`).

Why the readers do not validate with these models on every run: importing pydantic and building
the models costs about 0.15 s, half of the 0.3 s that a cold `llmmem-lint` may take. So each
reader keeps a hand check that accepts a good value in microseconds, and only when it refuses a
value does it import this module and ask the model (`invalid_messages`) what is wrong. The
message is then the model's: the key as written and the expected type, from the field's
description. The models are the one declaration of the types, for the messages and the schema;
the tests check that a value the hand check refuses is refused by the model too.
"""

from __future__ import annotations

import json
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, RootModel, ValidationError

from llmmem.extract.numbers import MAX_COUNT

SeverityLevel = Literal["error", "warning", "info", "hint", "off"]
FailOnLevel = Literal["error", "warning", "info"]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
COUNT = f"an integer from 1 to {MAX_COUNT:,}"


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


# -- what a user writes -------------------------------------------------------------------------


class ProjectSettingsModel(BaseModel):
    """`[tool.llmmem]` in the nearest pyproject.toml (TOML types: no string for a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="[tool.llmmem]")

    gpu: Annotated[str, Field(min_length=1, pattern=r"\S")] | None = Field(
        None, description="a GPU name such as A100-80GB (a string)"
    )
    world_size: Count | None = Field(None, description=COUNT)
    hub: bool = Field(True, description="true or false")
    local_model_paths: dict[
        str, Annotated[str, Field(description="a directory path (a string)")]
    ] = Field(default_factory=dict, description="a table of model id = directory path")
    severity: dict[
        str,
        Annotated[
            SeverityLevel,
            Field(description="one of error, warning, info, hint, off"),
        ],
    ] = Field(default_factory=dict, description="a table of rule code = severity level")
    fail_on: FailOnLevel | None = Field(None, description="one of error, warning, info")

    @classmethod
    def normalised(cls, table: dict[str, Any]) -> dict[str, Any]:
        """The table as the hand reader reads it: levels in any case."""
        out = dict(table)
        if isinstance(out.get("fail_on"), str):
            out["fail_on"] = out["fail_on"].lower()
        if isinstance(out.get("severity"), dict):
            out["severity"] = {code: _lower(level) for code, level in out["severity"].items()}
        return out


class PragmaValuesModel(BaseModel):
    """The values of a `# llmmem:` comment (`# llmmem: model=... seq=4096 batch=4`); numbers
    are written in ASCII digits."""

    model_config = ConfigDict(extra="forbid", title="# llmmem: pragma", protected_namespaces=())

    gpu: str | None = Field(None, min_length=1, description="a GPU name such as A100-80GB")
    seq: Count | None = Field(None, description=COUNT)
    batch: Count | None = Field(None, description=COUNT)
    grad_accum: Count | None = Field(None, description=COUNT)
    world_size: Count | None = Field(None, description=COUNT)
    model: str | None = Field(None, min_length=1, description="a model id or a local path")
    model_config_path: str | None = Field(
        None,
        alias="model_config",
        min_length=1,
        description="the path of a model's config.json",
    )
    precision: str | None = Field(None, min_length=1, description="fp32, fp16, bf16, ...")
    optim: str | None = Field(None, min_length=1, description="an HF `optim` name")


def _expected(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The description of the field (or of a table's values) that `loc` points at."""
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    info = fields.get(str(loc[0])) if loc else None
    if info is None:
        return None
    if len(loc) == 1:
        return info.description
    for arg in typing.get_args(info.annotation)[1:]:  # dict[str, Annotated[..., Field(...)]]
        for meta in getattr(arg, "__metadata__", ()):
            if getattr(meta, "description", None):
                return str(meta.description)
    return info.description


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def invalid_messages(model: type[BaseModel], data: dict[str, Any], prefix: str) -> list[str] | None:
    """One line per value of `data` that `model` refuses: `<prefix><key> must be <expected>,
    got <value>`; an unknown key names the known ones. None when the model accepts it all."""
    try:
        model.model_validate(data)
    except ValidationError as err:
        known = ", ".join(info.alias or name for name, info in model.model_fields.items())
        lines = []
        for error in err.errors():
            loc = tuple(error["loc"])
            key = ".".join(str(part) for part in loc)
            if error["type"] == "extra_forbidden":
                lines.append(f"{prefix}unknown key '{key}' (known: {known})")
                continue
            expected = _expected(model, loc) or error["msg"]
            lines.append(f"{prefix}{key} must be {expected}, got {_shown(error['input'])}")
        return lines
    return None


# -- what llmmem writes -------------------------------------------------------------------------


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class RangeModel(_Report):
    """A range of a file, 0-based lines and columns (as LSP counts them), end exclusive."""

    path: str | None = Field(description="the file, when it is not the file analysed")
    start_line: int
    start_col: int
    end_line: int
    end_col: int


class TextEditModel(_Report):
    range: RangeModel
    new_text: str


class FixModel(_Report):
    title: str
    edits: list[TextEditModel]
    predicted_device_bytes: int | None = Field(description="the device total after the fix")
    fits: bool | None
    safe: bool = Field(description="applied by llmmem-lint --fix")


class RelatedModel(_Report):
    range: RangeModel
    message: str


class FindingModel(_Report):
    code: str = Field(pattern=r"^LLM\d{3}$")
    severity: Literal["error", "warning", "info", "hint"]
    message: str
    path: str
    range: RangeModel | None
    fixes: list[FixModel]
    related: list[RelatedModel]


class LintReport(RootModel[list[FindingModel]]):
    """`llmmem-lint --format json`: every finding of every file linted."""

    model_config = ConfigDict(title="llmmem-lint --format json")


class SourcedModel(_Report):
    """A setting and where it came from."""

    value: JsonValue
    source: Literal["explicit", "default", "cli-default", "pragma", "config", "cli", "assumed"]
    range: RangeModel | None
    note: str | None = None


class LoraModel(_Report):
    r: SourcedModel | None
    alpha: SourcedModel | None
    target_modules: SourcedModel | None


class QuantizationModel(_Report):
    bits: SourcedModel | None
    quant_type: SourcedModel | None
    double_quant: SourcedModel | None
    compute_dtype: SourcedModel | None


class DeepSpeedModel(_Report):
    config: SourcedModel | None
    zero_stage: SourcedModel | None
    offload_optimizer: SourcedModel | None
    offload_params: SourcedModel | None
    reduce_bucket_size: SourcedModel | None
    overlap_comm: SourcedModel | None
    contiguous_gradients: SourcedModel | None
    stage3_max_reuse_distance: SourcedModel | None
    stage3_prefetch_bucket_size: SourcedModel | None
    stage3_param_persistence_threshold: SourcedModel | None


class PlanModel(_Report):
    """The training plan read from the file: each value with its provenance."""

    path: str
    kind: str = Field(description="python, yaml, json, shell or notebook")
    framework: str | None
    model_id: SourcedModel | None
    objective: SourcedModel | None = Field(
        default=None,
        description="the training objective (dpo, orpo, cpo, kto, reward, grpo, ppo); null for "
        "supervised fine-tuning",
    )
    per_device_train_batch_size: SourcedModel | None
    gradient_accumulation_steps: SourcedModel | None
    max_seq_length: SourcedModel | None
    gradient_checkpointing: SourcedModel | None
    precision: SourcedModel | None
    optim: SourcedModel | None
    attn_implementation: SourcedModel | None
    lora: LoraModel | None
    quantization: QuantizationModel | None
    deepspeed: DeepSpeedModel
    fsdp: SourcedModel | None
    world_size: SourcedModel | None
    problems: list[str]


class ModelSpecModel(_Report):
    id: str
    model_type: str | None
    architecture: str | None
    params: int
    source: str = Field(description="where the model's shape came from (catalog, hub, ...)")
    source_detail: str | None
    is_guess: bool


class TermModel(_Report):
    bytes: int
    formula: str


class PhaseModel(_Report):
    moment: str
    allocated_bytes: int
    components: dict[str, int] = Field(description="component -> bytes")


class GpuModel(_Report):
    name: str
    capacity_bytes: int


class BudgetModel(_Report):
    """The memory of one training step: bytes per component, per phase."""

    model: ModelSpecModel
    trainable_params: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    device_total_bytes: int
    band_low_bytes: int = Field(
        description="the low end of the device total's band: where measured peaks of the "
        "prediction's class fell (bench/bands.py)"
    )
    band_high_bytes: int = Field(description="the high end of the device total's band")
    band_basis: str = Field(
        description="the band's class (framework, method, metric, sharding) and how many "
        "measured rows it rests on, or why it is the wide default"
    )
    first_step_allocated_peak_bytes: int | None
    peak_phase: str
    peak_moment: str
    components: dict[str, int] = Field(description="component -> bytes at the peak")
    formulas: dict[str, str] = Field(description="component -> the formula of its bytes")
    overheads: dict[str, TermModel]
    phases: dict[str, PhaseModel]
    gpu: GpuModel | None
    fits: bool | None = Field(description="the prediction itself within the capacity")
    verdict: Literal["fits", "tight", "does not fit"] | None = Field(
        description="fits: the whole band within the capacity; tight: the band crosses it; "
        "null without a GPU"
    )
    headroom_bytes: int | None
    notes: list[str]


class VersionModel(_Report):
    """One library's release for the run, and where it was read (llmmem.versions)."""

    version: str
    source: str = Field(
        description="where it was read: an environment folder (.venv), a requirement or lock "
        "file (requirements.txt, uv.lock, ...), or the tests' pin"
    )
    kind: Literal["environment", "workspace", "default"]
    path: str | None = Field(description="the file or site-packages folder it was read from")
    line: int | None = Field(description="0-based line in path, where known")
    label: str = Field(description="e.g. 'transformers 4.44.0 (requirements.txt)'")
    note: str | None = None


class ExplainReport(_Report):
    """`llmmem explain FILE --format json`."""

    model_config = ConfigDict(title="llmmem explain --format json")

    plan: PlanModel
    budget: BudgetModel | None = Field(description="null when the model is unknown")
    findings: list[FindingModel]
    problems: list[str]
    versions: dict[str, VersionModel] = Field(
        default_factory=dict,
        description="library -> its release for the run (torch, transformers, peft, trl, "
        "bitsandbytes, deepspeed, accelerate, torchtune; those no source names are left out)",
    )


REPORTS: dict[str, type[BaseModel]] = {"explain": ExplainReport, "lint": LintReport}


def report_schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one report, generated from its model."""
    schema = REPORTS[name].model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def report_schema_text(name: str) -> str:
    return json.dumps(report_schema(name), indent=2, ensure_ascii=False) + "\n"
