"""The moments of TRL 0.29's preference trainers that are that release's own code.

- DPOTrainer._compute_loss (trl/trainer/dpo_trainer.py at 0.29.1) logs its metrics after the
  loss, while the policy's and the reference's logits and shifted copies are alive:
  `entropy_from_logits` (log_softmax, exp and their product over 128-row chunks) and a
  boolean-mask copy of the chosen completions' logits. bench/trl_trainers.py found the real
  trainer's step peaking there.
- ORPOTrainer (trl/experimental/orpo at 0.29.1) takes the log-probabilities on a view of the
  logits (no shifted copy) and adds the chosen half's NLL, a cross-entropy over a shifted copy
  of that half.

Bytes below are worked out by hand from those lines of TRL for the tiny Llama of the
preference grid (vocabulary 1000), 2 pairs of 64 tokens unless said: L = 4 × 64 × 1000 logits,
L' = 4 × 63 × 1000 shifted, the chosen half H = 2 × 63 × 1000.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmmem.budget.preference import estimate_preference_budget
from llmmem.budget.preference_log_probs import log_prob_moments
from llmmem.budget.preference_setup import Objective, PreferenceSetup
from llmmem.budget.result import Phase
from llmmem.budget.setup import Method, Precision, SetupError, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.preference_grid import SMALL, Case, measure, predict

# the preference grid's tiny Llama: hidden 64, MLP 160, 2 layers, 4 heads (2 K/V), vocab 1,000
TINY = SMALL["llama"]


def _spec():  # type: ignore[no-untyped-def]
    return spec_from_config(TINY, model_id="tiny-llama", source=ModelSource.CONFIG)


def _setup(seq: int = 64, precision: str = "fp32") -> TrainingSetup:
    return TrainingSetup(
        method=Method.FULL, batch=2, seq=seq, precision=Precision(precision), optim="adamw_torch"
    )


def _phase(objective: Objective, release: str | None, phase: Phase, seq: int = 64):  # type: ignore[no-untyped-def]
    pref = PreferenceSetup(objective=objective, trl_release=release)
    budget = estimate_preference_budget(_spec(), _setup(seq), pref)
    return next(p for p in budget.phases if p.phase is phase)


def test_dpo_at_trl_029_peaks_in_its_entropy_metric_after_the_reference() -> None:
    before = _phase(Objective.DPO, "0.28.0", Phase.REFERENCE_FORWARD)
    after = _phase(Objective.DPO, "0.29.1", Phase.REFERENCE_FORWARD)
    assert "entropy_from_logits" in after.moment
    # the reference's one-row logsumexp temporary (63 × 1000 fp32) is given back; three
    # 128-row chunks of fp32 log-probabilities are made (4 × 63 = 252 rows: 128 a chunk)
    row = 4 * 63 * 1000
    chunks = 4 * 1000 * 3 * 128
    assert after.allocated_bytes - before.allocated_bytes == chunks - row == 1_284_000


def test_dpo_metrics_on_long_sequences_copy_the_chosen_completions() -> None:
    # 2 pairs of 512 tokens: the chosen half's 2 × 511 rows outweigh three 128-row chunks
    before = _phase(Objective.DPO, "0.28.0", Phase.REFERENCE_FORWARD, seq=512)
    after = _phase(Objective.DPO, "0.29.1", Phase.REFERENCE_FORWARD, seq=512)
    assert after.allocated_bytes - before.allocated_bytes == 4 * 1000 * (2 * 511 - 511)


def test_dpo_metrics_are_only_trl_029s() -> None:
    for release in ("0.28.0", "1.16.0"):
        phase = _phase(Objective.DPO, release, Phase.REFERENCE_FORWARD)
        assert "entropy_from_logits" not in phase.moment
    # None: the release these budgets follow
    assert "entropy_from_logits" in _phase(Objective.DPO, None, Phase.REFERENCE_FORWARD).moment


def test_orpo_at_trl_029_keeps_the_logits_and_the_chosen_cross_entropy() -> None:
    rows = 4
    setup = replace(_setup(), batch=rows)
    fp32 = log_prob_moments(_spec(), setup, rows, fp32=True, chosen_nll=True)
    whole, shifted, half = 4 * 64 * 1000, 4 * 63 * 1000, 2 * 63 * 1000
    # inside the chosen half's cross-entropy: the logits, the half's copy and its log_softmax
    assert fp32.forward_end == 4 * (whole + half + half) == 2_032_000
    # backward: the logits (kept by the logsumexp's saved rows), the saved log_softmax of the
    # chosen half, three L'-sized gradients
    assert fp32.backward_peak == 4 * (whole + half + 3 * shifted) == 4_552_000
    assert fp32.reference == 0
    bf16 = log_prob_moments(
        _spec(), replace(setup, precision=Precision("bf16-true")), rows, chosen_nll=True
    )
    # 16-bit logits: the per-row log_softmax of the view kept beside the half's; backward at
    # three L-sized gradients
    assert bf16.forward_end == 2 * (whole + half + shifted) == 1_268_000
    assert bf16.backward_peak == 3 * 2 * whole == 1_536_000


def test_orpo_with_one_pair_copies_nothing_for_its_nll() -> None:
    # `logits[:1][..., :-1, :]` of one sequence is contiguous: `.contiguous()` returns it, and
    # the forward peaks at the per-row logsumexp, whose row temporary (127 × 1000 fp32, inside
    # the kernel: a GPU allocates it) is the size the copy would have been
    rows = 2
    setup = replace(_setup(seq=128), batch=rows)
    one = log_prob_moments(_spec(), setup, rows, fp32=True, chosen_nll=True)
    whole, row = 2 * 128 * 1000, 127 * 1000
    assert one.forward_end == 4 * (whole + row + row)
    assert one.inside_kernel == 4 * row == 508_000


def test_orpo_backward_is_larger_than_the_dpo_like_step_before() -> None:
    before = _phase(Objective.ORPO, "0.28.0", Phase.BACKWARD)
    after = _phase(Objective.ORPO, "0.29.1", Phase.BACKWARD)
    # 4·L + 4·H + 12·L' instead of 16·L'
    assert after.allocated_bytes - before.allocated_bytes == 4 * (
        64 * 4 * 1000 + 2 * 63 * 1000 - 4 * 63 * 1000
    )


def test_a_release_that_is_not_one_says_so() -> None:
    with pytest.raises(SetupError, match="trl_release must look like"):
        PreferenceSetup(objective=Objective.DPO, trl_release="latest")


def test_the_trl_release_a_file_runs_with_reaches_the_preference_budget(
    tmp_path: Path, estimate_json: Any
) -> None:
    """The release read beside the file (here a requirements file) or given with --versions
    decides whether TRL 0.29's own DPO metrics moment is counted: a TRL 0.28 run does not
    have it, and its estimate is lower than a 0.29 run's."""
    from llmmem.extract import extract_plan
    from llmmem.scenario import analyze

    base = ("--model", "Qwen/Qwen2.5-0.5B", "--method", "dpo", "--batch", "2", "--seq", "1024")
    at_029 = estimate_json(*base, "--versions", "trl=0.29.1")["allocated_peak_bytes"]
    at_028 = estimate_json(*base, "--versions", "trl=0.28.0")["allocated_peak_bytes"]
    assert at_028 < at_029

    script = tmp_path / "train.py"
    script.write_text(
        "from transformers import AutoModelForCausalLM\n"
        "from trl import DPOConfig, DPOTrainer\n"
        "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
        "args = DPOConfig(output_dir='o', per_device_train_batch_size=2, max_length=1024)\n"
        "DPOTrainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    peaks = {}
    for pin in ("0.28.0", "0.29.1"):
        (tmp_path / "requirements.txt").write_text(f"trl=={pin}\n", encoding="utf-8")
        analysis = analyze(extract_plan(script))
        assert analysis.setup is not None and analysis.setup.trl_version == pin[:4]
        assert analysis.budget is not None
        peaks[pin] = analysis.budget.allocated_peak_bytes
    assert peaks["0.28.0"] < peaks["0.29.1"]


@pytest.mark.parametrize("objective", [Objective.ORPO, Objective.CPO])
def test_orpo_and_cpo_at_trl_1x_keep_the_view_and_the_chosen_cross_entropy(
    objective: Objective,
) -> None:
    # trl.experimental's ORPO and CPO trainers run 0.29's code at 1.16 (no fused head there):
    # TRL 1.16's own ORPOTrainer peaks where 0.29's does (bench/trl_trainers.py --trl 1.16.0)
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        at_1x = _phase(objective, "1.16.0", phase)
        at_029 = _phase(objective, "0.29.1", phase)
        assert at_1x.allocated_bytes == at_029.allocated_bytes
    # an older release is not sized with that code
    assert _phase(objective, "0.24.0", Phase.BACKWARD).allocated_bytes != (
        _phase(objective, "0.29.1", Phase.BACKWARD).allocated_bytes
    )


def test_dpo_from_trl_16_takes_the_views_without_the_shifted_copies() -> None:
    # TRL 1.6 to 1.13: selective_log_softmax of logits[..., :-1, :] (no .contiguous());
    # 2 pairs → 4 rows × 64 tokens × 1000, fp32: the policy keeps its logits and one row's
    # logsumexp temporary; at 0.29 the shifted copy is kept beside them
    whole, shifted, row = 4 * 64 * 1000, 4 * 63 * 1000, 63 * 1000
    views = _phase(Objective.DPO, "1.6.0", Phase.FORWARD)
    copies = _phase(Objective.DPO, "0.29.1", Phase.FORWARD)
    from llmmem.budget.result import Component

    assert views.components[Component.LOGITS].bytes == 4 * whole + 4 * row
    assert copies.components[Component.LOGITS].bytes == 4 * whole + 4 * shifted
    # 1.6's metrics still take entropy_from_logits, which copies the view as it reshapes it
    metrics = _phase(Objective.DPO, "1.6.0", Phase.REFERENCE_FORWARD)
    assert "metrics" in metrics.moment


@pytest.mark.parametrize(
    "case",
    [
        Case("llama", "dpo", "full", True, "fp32", trainer="trl-views"),
        Case("qwen2", "dpo", "lora", False, "bf16", trainer="trl-views"),
        Case("gemma2", "dpo", "full", True, "bf16-true", mixed=False, trainer="trl-views"),
    ],
    ids=lambda c: c.id,
)
def test_dpo_on_views_within_five_percent_of_a_cpu_step(case: Case) -> None:
    measured = measure(case)
    predicted = predict(case)
    for phase, got in measured.items():
        assert abs(predicted[phase] - got) / got <= 0.05, (phase, got, predicted[phase])
