"""How well and how fast the extractors read the test fixtures.

    python bench/extraction.py

Compares each fixture's TrainingPlan with `bench/extraction_expected.json`, which lists, per
fixture, only the values the file (or a file it references) states. A field counts as found
when the extractor gave it a provenance other than a framework default or an assumption, and as
correct when that found value equals the expected one. The same counts are printed per
framework (the reader that took the file: Python scripts, each config framework, shell
launchers, notebooks) and per long-tail class (the expectations file's `classes`: fixtures
written the way real projects write the cases readers used to miss, each with the fields the
class is about). Also times extraction of every fixture and of a generated 1,000-line
script, in-process (median of 20 runs). Always exits 0.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
EXPECTED = Path(__file__).resolve().parent / "extraction_expected.json"
RUNS = 20
SCRIPT_LINES = 1000

FIELDS = [
    "model_id",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "gradient_checkpointing",
    "precision",
    "optim",
    "attn_implementation",
    "lora.r",
    "lora.alpha",
    "lora.target_modules",
    "quantization.quant_type",
    "quantization.double_quant",
    "distributed.world_size",
    "distributed.zero_stage",
]

MISSING = object()

# the per-framework table's rows, in order: a file's row is its reader's
GROUP_COUNTS = ("files", "stated", "found", "correct")
GROUPS = [
    "HF/TRL Python",
    "HF YAML",
    "axolotl",
    "LLaMA-Factory",
    "torchtune",
    "LitGPT",
    "DeepSpeed",
    "accelerate",
    "verl",
    "shell launchers",
    "notebooks",
]
KIND_GROUPS = {"python": "HF/TRL Python", "shell": "shell launchers", "notebook": "notebooks"}
CONFIG_GROUPS = {
    "hf": "HF YAML",
    "trl": "HF YAML",
    "axolotl": "axolotl",
    "llamafactory": "LLaMA-Factory",
    "torchtune": "torchtune",
    "litgpt": "LitGPT",
    "deepspeed": "DeepSpeed",
    "accelerate": "accelerate",
    "verl": "verl",
}


def group_of(path: Path, plan: Any) -> str:
    """The per-framework row a fixture counts in: by file kind, and a config by the framework
    its reader detected (a YAML file that LLaMA-Factory reads is LLaMA-Factory's wherever it
    lies)."""
    from llmmem.extract import file_kind

    kind = plan.kind if plan is not None else file_kind(path)
    if kind in KIND_GROUPS:
        return KIND_GROUPS[kind]
    framework = plan.framework if plan is not None else "hf"
    return CONFIG_GROUPS.get(framework, f"{kind} ({framework})")


def framework_table(groups: dict[str, dict[str, int]]) -> list[str]:
    """The per-framework counts as a Markdown table (printed as is, and kept in the README)."""
    rows = [name for name in GROUPS if name in groups]
    rows += sorted(name for name in groups if name not in GROUPS)
    lines = [
        "| reader | files | stated | found | correct |",
        "|---|---:|---:|---:|---:|",
    ]
    totals = {"files": 0, "stated": 0, "found": 0, "correct": 0}
    for name in rows:
        row = groups[name]
        for key in totals:
            totals[key] += row[key]
        lines.append(
            f"| {name} | {row['files']} | {row['stated']} | {row['found']} | {row['correct']} |"
        )
    lines.append(
        f"| total | {totals['files']} | {totals['stated']} | {totals['found']}"
        f" | {totals['correct']} |"
    )
    return lines


def class_table(
    classes: dict[str, dict[str, Any]],
    expected: dict[str, dict[str, Any]],
    results: dict[str, dict[str, tuple[bool, bool]]],
) -> list[str]:
    """The per-class counts as a Markdown table (printed as is, and kept in the README).
    `results` holds, per fixture and stated field, whether it was found and whether correctly;
    a class counts the fields it names for each of its fixtures ("*": all stated)."""
    lines = [
        "| long-tail class | files | stated | found | correct |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, fixtures in classes.items():
        stated = found = correct = 0
        for name, fields in fixtures.items():
            named = list(expected.get(name, {})) if fields == "*" else fields
            for field in named:
                got = results.get(name, {}).get(field, (False, False))
                stated += 1
                found += int(got[0])
                correct += int(got[1])
        lines.append(f"| {label} | {len(fixtures)} | {stated} | {found} | {correct} |")
    return lines


def lookup(plan: Any, key: str) -> Any:
    """The Sourced value at `key` (`lora.r`, `distributed.zero_stage`), or None."""
    owner = plan
    for part in key.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return owner


def is_found(sourced: Any) -> bool:
    from llmmem.plan import Provenance

    if sourced is None:
        return False
    return sourced.source not in (Provenance.DEFAULT, Provenance.ASSUMED)


def same(expected: Any, got: Any) -> bool:
    if isinstance(expected, list) and isinstance(got, list):
        return sorted(map(str, expected)) == sorted(map(str, got))
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return float(expected) == float(got)
    return expected == got


def show(sourced: Any) -> str:
    if sourced is None:
        return "(absent)"
    return f"{sourced.value!r} [{sourced.source.value}]"


def median_ms(path: Path) -> float:
    from llmmem.extract import extract_plan

    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        extract_plan(path)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def generated_script() -> str:
    """A SCRIPT_LINES-line training script: the HF Trainer fixture's code, repeated with unique
    names, ending in the run that is trained."""
    header = [
        '"""Generated benchmark script: many experiments, one training run."""',
        "",
        "import torch",
        "from datasets import load_dataset",
        "from transformers import (",
        "    AutoModelForCausalLM,",
        "    AutoTokenizer,",
        "    DataCollatorForLanguageModeling,",
        "    Trainer,",
        "    TrainingArguments,",
        ")",
        "",
    ]

    def block(i: int) -> list[str]:
        return [
            f'MODEL_ID_{i} = "Qwen/Qwen2.5-0.5B"',
            f"MAX_LEN_{i} = {512 + i % 4 * 256}",
            f"tokenizer_{i} = AutoTokenizer.from_pretrained(MODEL_ID_{i})",
            f"tokenizer_{i}.pad_token = tokenizer_{i}.eos_token",
            f"model_{i} = AutoModelForCausalLM.from_pretrained(",
            f"    MODEL_ID_{i},",
            "    torch_dtype=torch.bfloat16,",
            '    attn_implementation="sdpa",',
            ")",
            f"model_{i}.config.use_cache = False",
            f'dataset_{i} = load_dataset("HuggingFaceH4/ultrachat_200k", split="train_sft[:2000]")',
            "",
            "",
            f"def tokenize_{i}(example):",
            f'    text = tokenizer_{i}.apply_chat_template(example["messages"], tokenize=False)',
            f"    return tokenizer_{i}(text, truncation=True, max_length=MAX_LEN_{i})",
            "",
            "",
            f"dataset_{i} = dataset_{i}.map(tokenize_{i}, remove_columns=dataset_{i}.column_names)",
            f"training_args_{i} = TrainingArguments(",
            f'    output_dir="out/run-{i}",',
            f"    per_device_train_batch_size={1 + i % 8},",
            f"    gradient_accumulation_steps={1 + i % 4},",
            "    learning_rate=1e-5,",
            "    num_train_epochs=1,",
            f"    gradient_checkpointing={i % 2 == 0},",
            "    bf16=True,",
            '    optim="adamw_torch_fused",',
            "    logging_steps=10,",
            '    save_strategy="no",',
            '    report_to="none",',
            ")",
            f"trainer_{i} = Trainer(",
            f"    model=model_{i},",
            f"    args=training_args_{i},",
            f"    train_dataset=dataset_{i},",
            f"    data_collator=DataCollatorForLanguageModeling(tokenizer_{i}, mlm=False),",
            ")",
            "",
        ]

    footer_size = 1
    lines = list(header)
    i = 0
    while len(lines) + len(block(i)) + footer_size <= SCRIPT_LINES:
        lines.extend(block(i))
        i += 1
    lines.append(f"trainer_{i - 1}.train()")
    while len(lines) < SCRIPT_LINES:
        lines.insert(len(header), f"# experiment notes, line {len(lines)}")
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.path.insert(0, str(ROOT / "analyzer"))
    from llmmem.extract import extract_plan

    document = json.loads(EXPECTED.read_text(encoding="utf-8"))
    expected: dict[str, dict[str, Any]] = document["fixtures"]
    classes: dict[str, dict[str, Any]] = document.get("classes", {})
    results: dict[str, dict[str, tuple[bool, bool]]] = {}  # fixture -> field -> found, correct
    stats = {field: {"stated": 0, "found": 0, "correct": 0, "extra": 0} for field in FIELDS}
    groups: dict[str, dict[str, int]] = {}
    mismatches: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    errors: dict[str, str] = {}

    for name, fields in expected.items():
        path = FIXTURES / name
        try:
            plan = extract_plan(path)
        except Exception:  # extract_plan promises never to raise; report it if it does
            errors[name] = traceback.format_exc(limit=1).strip().splitlines()[-1]
            group = groups.setdefault(group_of(path, None), dict.fromkeys(GROUP_COUNTS, 0))
            group["files"] += 1
            for field in fields:
                stats[field]["stated"] += 1
                group["stated"] += 1
            continue
        group = groups.setdefault(group_of(path, plan), dict.fromkeys(GROUP_COUNTS, 0))
        group["files"] += 1
        for field in FIELDS:
            want = fields.get(field, MISSING)
            got = lookup(plan, field)
            found = is_found(got)
            if want is MISSING:
                if found:
                    stats[field]["extra"] += 1
                    extras.setdefault(name, []).append(f"{field}: got {show(got)}")
                continue
            stats[field]["stated"] += 1
            stats[field]["found"] += int(found)
            group["stated"] += 1
            group["found"] += int(found)
            correct = found and same(want, got.value)
            results.setdefault(name, {})[field] = (found, correct)
            if correct:
                stats[field]["correct"] += 1
                group["correct"] += 1
            else:
                mismatches.setdefault(name, []).append(
                    f"{field}: expected {want!r}, got {show(got)}"
                )

    width = max(len(field) for field in FIELDS)
    print(f"Extraction accuracy ({len(expected)} fixtures, {EXPECTED.name})")
    print()
    head = f"{'field':<{width}}  stated  found  correct  extra"
    print(head)
    print("-" * len(head))
    totals = {"stated": 0, "found": 0, "correct": 0, "extra": 0}
    for field in FIELDS:
        row = stats[field]
        for key in totals:
            totals[key] += row[key]
        print(
            f"{field:<{width}}  {row['stated']:>6}  {row['found']:>5}  {row['correct']:>7}"
            f"  {row['extra']:>5}"
        )
    print("-" * len(head))
    print(
        f"{'total':<{width}}  {totals['stated']:>6}  {totals['found']:>5}  {totals['correct']:>7}"
        f"  {totals['extra']:>5}"
    )
    if totals["stated"]:
        recall = 100 * totals["found"] / totals["stated"]
        accuracy = 100 * totals["correct"] / totals["stated"]
        print(f"found {recall:.1f}% of stated values, {accuracy:.1f}% correct")
    print(
        "(found: provenance other than a framework default or an assumption; "
        "extra: found where the file states nothing)"
    )

    print()
    print("Per framework (stated values found and correct, by the reader that took the file)")
    print()
    for line in framework_table(groups):
        print(line)

    if classes:
        print()
        print("Per long-tail class (the fields each class is about, in its fixtures)")
        print()
        for line in class_table(classes, expected, results):
            print(line)

    print()
    print("Mismatches (expected vs got [provenance])")
    if not mismatches and not errors:
        print("  none")
    for name, error in errors.items():
        print(f"  {name}: raised {error}")
    for name, lines in mismatches.items():
        print(f"  {name}")
        for line in lines:
            print(f"    {line}")

    print()
    print("Extra (found where the file states nothing)")
    if not extras:
        print("  none")
    for name, lines in extras.items():
        print(f"  {name}")
        for line in lines:
            print(f"    {line}")

    print()
    print(f"Extraction time, in-process, median of {RUNS} runs")
    timings: list[tuple[str, float]] = []
    for name in expected:
        try:
            timings.append((name, median_ms(FIXTURES / name)))
        except Exception:
            timings.append((name, float("nan")))
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "generated_train.py"
        text = generated_script()
        script.write_text(text, encoding="utf-8")
        label = f"generated script ({text.count(chr(10))} lines)"
        try:
            timings.append((label, median_ms(script)))
        except Exception:
            timings.append((label, float("nan")))
    name_width = max(len(name) for name, _ in timings)
    for name, ms in timings:
        print(f"  {name:<{name_width}}  {ms:8.2f} ms")
    return 0


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
    sys.exit(0)
