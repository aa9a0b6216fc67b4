"""LLaMA-Factory's own DPO trainer (0.9.5, llamafactory/train/dpo/trainer.py), budgeted apart
from TRL's: its `get_batch_logps` casts the logits to fp32 and keeps a full log_softmax of them
for backward, where TRL 0.29.1 takes a per-row logsumexp over a shifted copy; the policy runs
before the reference; ORPO and SimPO have no reference and no cross-entropy. Each phase is
checked against a CPU step written the way LLaMA-Factory computes it
(`llmmem.verify.preference_grid`, trainer "llamafactory"), and a LLaMA-Factory YAML is checked
to reach that budget, with the reference copy in the compute dtype LLaMA-Factory loads it in.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from llmmem.budget.preference import estimate_preference_budget  # noqa: E402
from llmmem.budget.preference_setup import Objective, PreferenceSetup  # noqa: E402
from llmmem.budget.result import Component, Phase  # noqa: E402
from llmmem.budget.setup import Method, Precision, TrainingSetup  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402
from llmmem.verify.preference_grid import SMALL, Case, measure, predict  # noqa: E402

TOLERANCE = 0.05

CASES = [
    Case("llama", "dpo", "full", True, "fp32", trainer="llamafactory"),
    Case("llama", "dpo", "lora", False, "bf16", trainer="llamafactory"),
    Case("qwen2", "dpo", "lora", True, "bf16-true", trainer="llamafactory", batch=1, seq=128),
    Case("qwen2", "orpo", "full", False, "bf16", trainer="llamafactory"),
    # bf16 logits, cast to fp32 by the trainer itself (no accelerate mixed precision)
    Case("gemma2", "dpo", "full", True, "bf16-true", mixed=False, trainer="llamafactory"),
    Case("gemma2", "orpo", "lora", True, "fp32", trainer="llamafactory", batch=1, seq=128),
    # CustomKTOTrainer: the completions, then the KL batch, then the boolean-mask copies
    Case("llama", "kto", "full", True, "bf16", trainer="llamafactory"),
    Case("qwen2", "kto", "lora", False, "fp32", trainer="llamafactory"),
    Case("gemma2", "kto", "lora", True, "bf16-true", mixed=False, trainer="llamafactory"),
    # the rm stage: TRL's value-head model over the causal LM, its LM logits made and unread
    Case("llama", "reward", "full", True, "bf16", trainer="llamafactory"),
    Case("qwen2", "reward", "lora", False, "fp32", trainer="llamafactory"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_phase_within_five_percent_of_a_cpu_step(case: Case) -> None:
    measured = measure(case)
    predicted = predict(case)
    assert measured.keys() == predicted.keys()
    for phase, got in measured.items():
        error = (predicted[phase] - got) / got
        assert abs(error) <= TOLERANCE, f"{phase}: measured {got}, predicted {predicted[phase]}"


def _spec(family: str = "llama"):
    return spec_from_config(SMALL[family], model_id=f"small-{family}", source=ModelSource.CONFIG)


def _setup(**kw) -> TrainingSetup:
    base = dict(method=Method.FULL, batch=2, seq=64, precision=Precision.FP32, grad_ckpt=True)
    base.update(kw)
    return TrainingSetup(**base)


def test_the_full_log_softmax_and_its_reference_are_counted_from_the_shapes() -> None:
    # 2 pairs → 4 rows of 64 tokens over a 1000-token vocabulary, fp32
    rows, seq, vocab = 4, 64, 1000
    whole, shifted = rows * seq * vocab, rows * (seq - 1) * vocab
    budget = estimate_preference_budget(
        _spec(), _setup(), PreferenceSetup(objective=Objective.DPO, trainer="llamafactory")
    )
    forward = budget.phase(Phase.FORWARD)
    reference = budget.phase(Phase.REFERENCE_FORWARD)
    backward = budget.phase(Phase.BACKWARD)
    # the policy: fp32 logits, the kept log_softmax, and the kernel's contiguous copy of the
    # strided view `logits[:, :-1, :]` (CUDA's host_softmax)
    assert forward.components[Component.LOGITS].bytes == 4 * whole + 4 * shifted + 4 * shifted
    # at the reference's log_softmax the policy's copy is gone, the reference's made
    assert reference.components[Component.LOGITS].bytes == 4 * whole + 4 * shifted
    assert reference.components[Component.TEMPORARIES].bytes == 4 * whole + 8 * shifted
    # backward: the saved log_softmax, the gather's gradient and the input gradient
    assert backward.components[Component.LOGITS].bytes == 12 * shifted
    # nothing of TRL 0.29's metrics moment
    assert "entropy" not in reference.moment


def test_kto_counts_the_kl_batch_beside_the_completions_and_frees_it_before_the_reference() -> None:
    # 2 completions and 2 KL rows of 64 tokens over 1000 entries, fp32
    rows, seq, vocab = 2, 64, 1000
    whole, shifted = rows * seq * vocab, rows * (seq - 1) * vocab
    budget = estimate_preference_budget(
        _spec(),
        _setup(batch=2),
        PreferenceSetup(objective=Objective.KTO, trainer="llamafactory"),
    )
    forward = budget.phase(Phase.FORWARD)
    reference = budget.phase(Phase.REFERENCE_FORWARD)
    # inside the KL batch's log_softmax: both batches' logits, both log_softmax outputs, and
    # the kernel's copy of the KL view
    assert forward.components[Component.LOGITS].bytes == 8 * whole + 8 * shifted + 4 * shifted
    # the reference starts beside the masked copies of the policy's logits and its log_softmax
    assert reference.components[Component.LOGITS].bytes == 4 * whole + 4 * shifted
    assert reference.components[Component.TEMPORARIES].bytes == 8 * whole + 8 * shifted
    assert budget.phase(Phase.BACKWARD).components[Component.LOGITS].bytes == 12 * shifted


def test_the_rm_stage_keeps_the_lm_head_and_makes_its_logits() -> None:
    # 2 pairs → 4 sequences of 64 tokens, a 1000-token vocabulary, hidden 64, untied head;
    # full fine-tuning under bf16 autocast over fp32 weights (LLaMA-Factory's upcast)
    spec = _spec()
    setup = _setup(precision=Precision("bf16"))
    value_head = estimate_preference_budget(
        spec, setup, PreferenceSetup(objective=Objective.REWARD, trainer="llamafactory")
    )
    classifier = estimate_preference_budget(
        spec, setup, PreferenceSetup(objective=Objective.REWARD)
    )
    whole = 4 * 64 * 1000
    forward = value_head.phase(Phase.FORWARD)
    # the head's bf16 logits, the log_softmax of the causal LM's own cross-entropy (the
    # pairwise collator passes labels; the unread loss keeps it) and the logits' fp32 upcast,
    # all alive as the forward returns
    assert forward.components[Component.LOGITS].bytes == 2 * whole + 4 * whole + 4 * whole
    # the LM head's fp32 weights, which a sequence classifier does not have; no gradient
    head = 1000 * 64 * 4
    weights = forward.components[Component.WEIGHTS].bytes
    assert weights - classifier.phase(Phase.FORWARD).components[Component.WEIGHTS].bytes == head
    step = value_head.phase(Phase.OPTIMIZER_STEP)
    assert step.components[Component.GRADIENTS].bytes == (
        classifier.phase(Phase.OPTIMIZER_STEP).components[Component.GRADIENTS].bytes
    )
    assert value_head.allocated_peak_bytes > classifier.allocated_peak_bytes


def test_llamafactory_reads_lower_than_trl_where_trl_keeps_its_metrics() -> None:
    spec, setup = _spec(), _setup()
    trl = estimate_preference_budget(spec, setup, PreferenceSetup(objective=Objective.DPO))
    lf = estimate_preference_budget(
        spec, setup, PreferenceSetup(objective=Objective.DPO, trainer="llamafactory")
    )
    # TRL 0.29's peak is its metrics moment with both shifted copies alive; LLaMA-Factory
    # has no shifted copies and logs only means
    assert trl.peak_phase is Phase.REFERENCE_FORWARD
    assert lf.allocated_peak_bytes < trl.allocated_peak_bytes
    assert any("LLaMA-Factory" in note for note in lf.notes)


def test_an_unknown_trainer_is_a_clear_error() -> None:
    from llmmem.budget.setup import SetupError

    with pytest.raises(SetupError, match="trainer is one of trl, llamafactory"):
        PreferenceSetup(objective=Objective.DPO, trainer="openrlhf-ish")


LF_FULL_DPO = textwrap.dedent(
    """\
    model_name_or_path: meta-llama/Llama-2-7b-hf
    stage: dpo
    do_train: true
    finetuning_type: full
    pref_beta: 0.1
    pref_loss: sigmoid
    dataset: dpo_en_demo
    template: llama2
    cutoff_len: 1024
    output_dir: saves/llama2-7b/full/dpo
    per_device_train_batch_size: 1
    gradient_accumulation_steps: 8
    learning_rate: 5.0e-6
    bf16: true
    """
)


def test_a_llamafactory_yaml_is_sized_with_its_trainer_and_a_compute_dtype_reference(
    tmp_path: Path,
) -> None:
    from llmmem.extract import extract_plan
    from llmmem.preference_plan import preference_setup
    from llmmem.scenario import analyze

    path = tmp_path / "dpo_full.yaml"
    path.write_text(LF_FULL_DPO)
    analysis = analyze(extract_plan(path))
    pref = preference_setup(analysis.plan)
    assert pref is not None
    assert pref.trainer == "llamafactory"
    # create_ref_model loads the reference without the fp32 upcast the trained model gets
    assert pref.reference_bytes == 2
    budget = analysis.budget
    assert budget is not None
    ref = budget.phase(Phase.FORWARD).components[Component.REFERENCE_MODEL]
    params = budget.phase(Phase.FORWARD).components[Component.WEIGHTS].bytes // 4
    # Llama-2-7B's weights are fp32 (upcast, trained under bf16 autocast); the copy is bf16
    assert ref.bytes == pytest.approx(2 * params, rel=0.01)
