"""A project's YAML that holds several runs side by side (`sft:`, `lora:`, `qlora:`, `dpo:`,
each with its own batch and length), read by the scripts that pick one: the file alone trains
nothing that can be sized, since which run is meant is the script's choice."""

from __future__ import annotations

from typing import Any

from llmmem.extract.frameworks.common import DocumentReader

# a key that gives a section its own micro-batch: the mark of one run's settings
BATCH_KEYS = frozenset(
    {"per_device_train_batch_size", "micro_batch_size", "train_batch_size", "batch_size"}
)
# sections that hold a batch of another kind beside the run's (evaluation, generation, data)
NOT_A_RUN = ("eval", "valid", "test", "infer", "generat", "predict", "rollout", "data", "ref")


def run_sections(document: Any) -> list[str]:
    """The top-level sections that each read as a whole run (a batch of their own), where the
    top level has no batch of its own; empty where the file describes one run."""
    if not isinstance(document, dict) or BATCH_KEYS & set(document):
        return []
    return [
        str(name)
        for name, section in document.items()
        if isinstance(section, dict)
        and BATCH_KEYS & set(section)
        and not any(word in str(name).lower() for word in NOT_A_RUN)
    ]


def read_run_sections(reader: DocumentReader, document: Any) -> None:
    """Two runs or more in one file: the plan trains nothing, and says which runs it holds."""
    runs = run_sections(document)
    if len(runs) < 2:
        return
    reader.put(
        "not_training",
        f"the file holds {len(runs)} runs ({', '.join(runs)}), each with its own batch; the "
        "script that picks one is the file to check",
        (runs[0],),
    )
