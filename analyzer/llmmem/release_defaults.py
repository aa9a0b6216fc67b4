"""What a file's run does by default under the library releases it runs with, where the default
changed between releases. The readers write today's defaults; these rules take them back to the
releases found beside the file (llmmem.versions), only where the file says nothing itself:

- the HF Trainer's optimizer (`TrainingArguments.optim`, read in the released wheels):
  transformers <= 4.31 "adamw_hf" (4.15 has no `optim` field: its Trainer builds transformers'
  own AdamW), 4.32 to 4.53 "adamw_torch", from 4.54 "adamw_torch_fused" where torch >= 2.8,
  else "adamw_torch";
- attention: transformers gives Llama-style decoders SDPA from 4.36 and BERT from 4.41; before,
  they train eager attention (with its dropout on the probabilities);
- the CUDA context: torch sets `CUDA_MODULE_LOADING=LAZY` itself from 1.13, and lazy loading
  needs a CUDA 11.7 runtime; before either, every kernel image is loaded at the first CUDA call;
- the sequence: a length llmmem assumed (no file said one) is not longer than the model's
  positions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from llmmem.budget.setup import AttnImpl, TrainingSetup, release
from llmmem.models.spec import ModelSpec
from llmmem.plan import Provenance, Sourced, TrainingPlan

# the first transformers release that gives each model type SDPA (read in the wheels:
# modeling_llama.py from 4.36, modeling_bert.py from 4.41)
SDPA_SINCE = {"bert": (4, 41)}
SDPA_SINCE_DEFAULT = (4, 36)


@dataclass(frozen=True, slots=True, kw_only=True)
class Unstated:
    """Which settings nothing stated (a file's defaults and assumptions, or flags not given):
    only those follow the releases."""

    optim: bool
    attn: bool
    seq: bool  # the length is llmmem's assumption, not a framework's default


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseDefaults:
    """The setup as the releases make it, a note per change, and each changed setting's
    value with why, by the plan's name for it (optim, attn_implementation, max_seq_length)."""

    setup: TrainingSetup
    notes: list[str]
    restated: dict[str, tuple[Any, str]]


def _defaulted(plan: TrainingPlan, name: str) -> bool:
    value = getattr(plan, name, None)
    return value is not None and value.source in (Provenance.DEFAULT, Provenance.ASSUMED)


def unstated_in_plan(plan: TrainingPlan) -> Unstated:
    return Unstated(
        optim=_defaulted(plan, "optim"),
        attn=_defaulted(plan, "attn_implementation"),
        seq=plan.max_seq_length.source is Provenance.ASSUMED,
    )


def _cuda_runtime(torch_version: str) -> tuple[int, int] | None:
    """The CUDA release of a torch wheel's local version: "1.10.1+cu111" -> (11, 1)."""
    found = re.search(r"\+cu(\d{2,3})(\d)$", torch_version)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2))


def with_release_defaults(
    plan: TrainingPlan, spec: ModelSpec, setup: TrainingSetup, versions: dict[str, Any]
) -> tuple[TrainingSetup, list[str]]:
    """A file's setup under its releases; the plan's values restated as sized."""
    torch_found = versions.get("torch")
    made = release_defaults(
        spec,
        setup,
        unstated_in_plan(plan),
        torch_build=str(torch_found.version) if torch_found is not None else None,
    )
    for name, (value, note) in made.restated.items():
        old = getattr(plan, name)
        setattr(plan, name, Sourced(value=value, source=old.source, range=old.range, note=note))
    return made.setup, made.notes


def release_defaults(
    spec: ModelSpec, setup: TrainingSetup, unstated: Unstated, *, torch_build: str | None
) -> ReleaseDefaults:
    """What the releases of `setup` (its transformers and torch) do with the settings nothing
    stated; `torch_build` is the torch wheel's full version where known ("1.10.1+cu111"), for
    its CUDA runtime. Both `llmmem explain` (a file's plan) and `llmmem estimate` (flags not
    given) take their defaults from here."""
    notes: list[str] = []
    restated: dict[str, tuple[Any, str]] = {}
    transformers = release(setup.transformers_version)
    torch = release(setup.torch_version)
    if unstated.optim and setup.optim == "adamw_torch_fused":
        if transformers <= (4, 31):
            setup = replace(setup, optim="adamw_hf")
            notes.append(
                f"transformers {setup.transformers_version}: the Trainer's default optimizer is "
                "its own AdamW (adamw_hf), a loop over the parameters"
            )
            restated["optim"] = (
                "adamw_hf",
                f"the default of transformers {setup.transformers_version}",
            )
        elif transformers < (4, 54) or torch < (2, 8):
            setup = replace(setup, optim="adamw_torch")
            notes.append(
                f"transformers {setup.transformers_version} with torch {setup.torch_version}: "
                "the Trainer's default optimizer is torch's AdamW, foreach (fused from "
                "transformers 4.54 with torch 2.8)"
            )
            restated["optim"] = (
                "adamw_torch",
                f"the default of transformers {setup.transformers_version}, "
                f"torch {setup.torch_version}",
            )
    since = SDPA_SINCE.get(spec.model_type, SDPA_SINCE_DEFAULT)
    if unstated.attn and setup.attn is AttnImpl.SDPA and transformers < since:
        setup = replace(setup, attn=AttnImpl.EAGER)
        restated["attn_implementation"] = ("eager", f"no SDPA before {since[0]}.{since[1]}")
        notes.append(
            f"transformers {setup.transformers_version}: {spec.model_type} has no SDPA before "
            f"{since[0]}.{since[1]}; eager attention"
        )
    cuda = _cuda_runtime(torch_build) if torch_build is not None else None
    if setup.cuda_module_loading == "lazy" and (
        torch < (1, 13) or (cuda is not None and cuda < (11, 7))
    ):
        setup = replace(setup, cuda_module_loading="eager")
        notes.append(
            f"torch {torch_build or setup.torch_version}: CUDA kernels "
            "load eagerly (lazy loading needs torch 1.13 and CUDA 11.7)"
        )
    positions = spec.max_position_embeddings
    if positions and setup.seq > positions and unstated.seq:
        notes.append(
            f"no sequence length found: {positions}, {spec.model_id}'s positions, instead of "
            f"the assumed {setup.seq}"
        )
        setup = replace(setup, seq=positions)
        restated["max_seq_length"] = (positions, f"{spec.model_id}'s positions")
    return ReleaseDefaults(setup=setup, notes=notes, restated=restated)
