"""Peer estimators beside llmmem, each on the metric the row measured, in-sample and held out.

    python bench/peers.py

The rows:

- in-sample: every row of ../shared/calibration/measured.jsonl and measured-wide.jsonl. All of
  them are evidence of llmmem's error bands (bench/bands.py writes bands.json from them), and
  the core's rules were built while reading their residuals (README, Accuracy: the torch 1.10
  softmax and the LitGPT scatter on measured.jsonl's rows; the transformers loss releases, TRL's
  k-bit preparation, the FSDP1 retention and the allocator replay on measured-wide.jsonl's).
- held out: bench/held_out_rows.jsonl, published measurements found for this bench, each with
  its source, configuration and metric; nothing here was fitted or tuned to them. A row whose
  residual was studied and explained by a change to the budget carries `seen` (the change and
  why) and counts as in-sample from then on: LitGPT's config-hub QLoRA rows, which showed the
  previous step's graph beside the head (budget/stacks/litgpt.py). A row run on
  torchtune, ms-swift or unsloth is sized with that framework's own stack, as `llmmem estimate
  --framework` sizes it, and may state `attn`, `loss` and `adapter_dtype` where its release
  fixed them (with_stated_stack).

No row of either set is in a peer's own calibration (fitcheck-llm and torch-preflight were
fitted to runs of their own on a Tesla T4; the one T4 row here, unsloth's 2024 TinyLlama
notebook, is none of them).

Each peer (bench/peer_estimators.py) answers a row with its figure for the row's metric —
T: tensors only (allocated rows), R: total less the CUDA context (reserved rows), D: device
total (nvidia-smi rows) — or refuses it by a rule of its own (fitcheck's 2% parameter-count
check, given the true count; its MoE refusal), or has no option that expresses it. llmmem
predicts the row's own metric (bench/calibration.py `predicted_bytes`).

Printed per method (full, LoRA, QLoRA), in-sample rows then held-out rows: each row's error for
llmmem and each peer, then per peer the rows it answered, its refusals, its median |error| and
llmmem's median |error| on the same rows. Rows llmmem cannot express are listed with why.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import (  # noqa: E402
    CALIBRATION_FILE,
    HELD_OUT_FILE,
    WIDE_CALIBRATION_FILE,
    CalibrationCase,
    RowSkipped,
    case_from_row,
    load_rows,
    wide_case_from_row,
)
from peer_estimators import (  # noqa: E402
    ALLOCATED,
    ESTIMATORS,
    FIGURES,
    PEERS,
    RESERVED,
    Answer,
    PeerUnavailable,
    Refused,
    Unanswered,
    install,
    write_hub_cache,
)

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.setup import AttnImpl, Framework, LossImpl  # noqa: E402

IN_SAMPLE = "in-sample"
HELD_OUT = "held out"
METHODS = (("full", "full fine-tuning"), ("lora", "LoRA"), ("qlora", "QLoRA"))
METRIC_WORDS = {ALLOCATED: "allocated", RESERVED: "reserved"}


@dataclass(frozen=True)
class Row:
    case: CalibrationCase
    sample: str  # IN_SAMPLE or HELD_OUT

    @property
    def row_id(self) -> str:
        return self.case.row_id

    @property
    def method(self) -> str:
        return self.case.setup.method.value


@dataclass(frozen=True)
class Skipped:
    row_id: str
    method: str
    sample: str
    reason: str


# a held-out row's framework whose own stack llmmem sizes (llmmem.budget.stacks), as
# `llmmem estimate --framework` names it
STACK_FRAMEWORKS = {
    "torchtune": Framework.TORCHTUNE,
    "ms-swift": Framework.SWIFT,
    "unsloth": Framework.UNSLOTH,
}


def with_stated_stack(case: CalibrationCase) -> CalibrationCase:
    """The row's own stack and the settings it states beyond measured-wide.jsonl's fields:
    `attn` (eager, sdpa, flash_attention_2), `loss` (standard, chunked) and `adapter_dtype`
    (bf16: adapters in the base's dtype, as peft before 0.12 kept them)."""
    row = case.row
    changes: dict[str, object] = {}
    framework = STACK_FRAMEWORKS.get(str(row.get("framework", "")).lower())
    if framework is not None:
        changes["framework"] = framework
    if "attn" in row:
        changes["attn"] = AttnImpl(row["attn"])
    if "loss" in row:
        changes["loss"] = LossImpl(row["loss"])
    if row.get("adapter_dtype") == "bf16" and case.setup.lora is not None:
        changes["lora"] = replace(case.setup.lora, adapter_bytes=2)
    if not changes:
        return case
    return replace(case, setup=replace(case.setup, **changes))  # type: ignore[arg-type]


def bench_rows() -> tuple[list[Row], list[Skipped]]:
    rows = [Row(case_from_row(row), IN_SAMPLE) for row in load_rows(CALIBRATION_FILE)]
    skipped: list[Skipped] = []
    for path, sample in ((WIDE_CALIBRATION_FILE, IN_SAMPLE), (HELD_OUT_FILE, HELD_OUT)):
        for row in load_rows(path):
            seen = sample if not row.get("seen") else IN_SAMPLE
            try:
                rows.append(Row(with_stated_stack(wide_case_from_row(row)), seen))
            except RowSkipped as reason:
                skipped.append(Skipped(str(row["id"]), str(row["method"]), sample, str(reason)))
    return rows, skipped


def llmmem_error(case: CalibrationCase) -> float:
    budget = estimate_budget(case.spec, case.setup, case.gpu)
    return case.predicted_bytes(budget) / case.measured_bytes - 1


# a peer's outcome on a row: an answer, or why there is none
Outcome = Answer | Refused | Unanswered


def peer_outcomes(rows: list[Row]) -> tuple[dict[str, dict[str, Outcome]], dict[str, str]]:
    outcomes: dict[str, dict[str, Outcome]] = {}
    unavailable: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="llmmem-peers-") as temp:
        hub_home = Path(temp)
        write_hub_cache({str(row.case.row["model"]) for row in rows}, hub_home)
        for peer in PEERS:
            try:
                root = install(peer)
            except PeerUnavailable as failure:
                unavailable[peer.name] = str(failure)
                continue
            outcomes[peer.name] = {}
            for row in rows:
                try:
                    outcome: Outcome = ESTIMATORS[peer](root, row.case, hub_home)
                except (Refused, Unanswered) as reason:
                    outcome = reason
                outcomes[peer.name][row.row_id] = outcome
    return outcomes, unavailable


def _error(outcome: Outcome, case: CalibrationCase) -> float | None:
    if isinstance(outcome, Answer):
        return outcome.predicted_bytes / case.measured_bytes - 1
    return None


def _cell(outcome: Outcome, case: CalibrationCase) -> str:
    error = _error(outcome, case)
    if error is not None:
        assert isinstance(outcome, Answer)
        return f"{100 * error:+.1f}% {outcome.figure}"
    return "refused" if isinstance(outcome, Refused) else "-"


def _short(name: str) -> str:
    return name.split()[0]


def section_lines(
    title: str,
    rows: list[Row],
    skipped: list[Skipped],
    ours: dict[str, float],
    outcomes: dict[str, dict[str, Outcome]],
) -> Iterator[str]:
    yield f"== {title}: {len(rows)} rows" + (
        f", {len(skipped)} llmmem cannot express" if skipped else ""
    )
    if rows:
        names = list(outcomes)
        width = max(len(row.row_id) for row in rows)
        yield f"  {'row':<{width}} {'metric':<9} {'llmmem':>8} " + " ".join(
            f"{_short(n):>16}" for n in names
        )
        for row in rows:
            metric = METRIC_WORDS.get(row.case.metric, "nvidia-smi")
            cells = " ".join(f"{_cell(outcomes[n][row.row_id], row.case):>16}" for n in names)
            yield f"  {row.row_id:<{width}} {metric:<9} {100 * ours[row.row_id]:>+7.1f}% {cells}"
        for name in names:
            answered = {
                row.row_id: error
                for row in rows
                if (error := _error(outcomes[name][row.row_id], row.case)) is not None
            }
            refused = [r for r in rows if isinstance(outcomes[name][r.row_id], Refused)]
            unanswered = len(rows) - len(answered) - len(refused)
            if answered:
                peer = statistics.median(abs(e) for e in answered.values())
                mine = statistics.median(abs(ours[r]) for r in answered)
                verdict = "llmmem lower" if mine < peer else "peer lower or equal"
                medians = (
                    f"median |error| {100 * peer:.1f}% vs llmmem {100 * mine:.1f}% ({verdict})"
                )
            else:
                medians = "no row answered"
            yield (
                f"  {name}: {len(answered)} answered, {len(refused)} refused by its own rules, "
                f"{unanswered} no answer; {medians}"
            )
            for row in refused:
                yield f"    refused {row.row_id}: {outcomes[name][row.row_id]}"
            reasons = Counter(
                str(o) for r in rows if isinstance(o := outcomes[name][r.row_id], Unanswered)
            )
            for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
                yield f"    no answer ({count}): {reason}"
    for skip in skipped:
        yield f"  llmmem cannot express {skip.row_id}: {skip.reason}"


def summary_lines(
    rows: list[Row], ours: dict[str, float], outcomes: dict[str, dict[str, Outcome]]
) -> Iterator[str]:
    """One line per method, sample and peer: the README's table."""
    yield "| method | rows | peer | answered | refused | peer | llmmem |"
    yield "|---|---|---|---:|---:|---:|---:|"
    for method, words in METHODS:
        for sample in (IN_SAMPLE, HELD_OUT):
            chosen = [r for r in rows if r.method == method and r.sample == sample]
            for name, by_row in outcomes.items():
                errors = [
                    (row.row_id, e)
                    for row in chosen
                    if (e := _error(by_row[row.row_id], row.case)) is not None
                ]
                refused = sum(isinstance(by_row[row.row_id], Refused) for row in chosen)
                if not errors and not refused:
                    continue
                peer = (
                    f"{100 * statistics.median(abs(e) for _, e in errors):.1f}%" if errors else "-"
                )
                mine = (
                    f"{100 * statistics.median(abs(ours[r]) for r, _ in errors):.1f}%"
                    if errors
                    else "-"
                )
                yield (
                    f"| {words} | {sample} | {_short(name)} | {len(errors)} | {refused} | "
                    f"{peer} | {mine} |"
                )


def main() -> int:
    rows, skipped = bench_rows()
    ours = {row.row_id: llmmem_error(row.case) for row in rows}
    outcomes, unavailable = peer_outcomes(rows)

    in_sample = sum(row.sample == IN_SAMPLE for row in rows)
    held_out = sum(s.sample == HELD_OUT for s in skipped) + len(rows) - in_sample
    print(
        f"in-sample: {in_sample} rows of {CALIBRATION_FILE.name} and {WIDE_CALIBRATION_FILE.name}"
        " (band evidence; the core's rules were built reading their residuals)"
    )
    print(f"held out: {held_out} rows of bench/{HELD_OUT_FILE.name} (nothing fitted to them)")
    print("a peer's figure: " + "; ".join(f"{tag} {words}" for tag, words in FIGURES.items()))
    for name, reason in unavailable.items():
        print(f"{name}: not installed here ({reason})")
    for method, words in METHODS:
        for sample in (IN_SAMPLE, HELD_OUT):
            print()
            chosen = [r for r in rows if r.method == method and r.sample == sample]
            left_out = [s for s in skipped if s.method == method and s.sample == sample]
            for line in section_lines(f"{words}, {sample}", chosen, left_out, ours, outcomes):
                print(line)
    print()
    for line in summary_lines(rows, ours, outcomes):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
