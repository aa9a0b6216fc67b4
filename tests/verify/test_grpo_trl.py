"""The GRPO budget against TRL 0.29.1's own GRPOTrainer, phase by phase.

bench/trl_step.py trains a tiny Llama with GRPOTrainer on the CPU (transformers' generation,
every completion run to its full length) under the project's StorageTracker and splits the
measured step where TRL's methods return: `_generate_single_turn`, the rest of
`_generate_and_score_completions` (the reference's log-probabilities), `compute_loss`, backward,
the optimizer step. It needs TRL, which llmmem does not depend on: `python bench/trl_trainers.py
--objective grpo` makes its environment and runs that comparison (its table is in its
docstring); the tests here hold the moments it found with hand-derived bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llmmem.budget.grpo import estimate_grpo_budget, grpo_log_probs  # noqa: E402
from llmmem.budget.result import Component, Phase  # noqa: E402
from llmmem.verify.grpo_grid import Case, _grpo, _setup, _spec  # noqa: E402

TOLERANCE = 0.05


def test_the_policy_forward_peaks_in_trl_029s_entropy_chunk() -> None:
    # TRL 0.29.1 `_get_per_token_logps_and_entropies`: with the divided logits alive (4 rows ×
    # 32 completion tokens × 1000 words, fp32, kept by selective_log_softmax's logsumexp),
    # `entropy_from_logits` holds a 128-row chunk's log-softmax, its exp and their product:
    # 4 B × 4 × 32 × 1000 + 3 × 4 B × 128 × 1000 = 512,000 + 1,536,000 bytes. The moment before
    # it (the model's 4 × 33 × 1000 logits beside their divided copy) is only 1,040,000.
    case = Case(2, 32, 0.0, batch=4)
    budget = estimate_grpo_budget(_spec(case), _setup(case), _grpo(case))
    forward = budget.phase(Phase.FORWARD)
    assert forward.components[Component.LOGITS].bytes == 2_048_000
    assert "entropies" in forward.moment


def _no_grad(case: Case) -> tuple[Any, Any]:
    spec, setup, grpo = _spec(case), _setup(case), _grpo(case)
    budget = estimate_grpo_budget(spec, setup, grpo)
    return budget.phase(Phase.REFERENCE_FORWARD), grpo_log_probs(spec, setup, grpo)


def test_a_second_chunk_runs_its_lm_head_beside_the_first_chunks_divided_logits() -> None:
    # steps_per_generation 2, one accumulation step: the old and the reference log-probabilities
    # run over 8 completions in chunks of 4. TRL 0.29.1's `_get_per_token_logps_and_entropies`
    # still holds chunk 1's `logits / temperature` (fp32, 4 × 32 × 1000 × 4 B = 512,000) when
    # chunk 2's LM head makes its logits (4 × 33 × 1000 × 4 B = 528,000) from the final norm's
    # output over all 48 positions (4 × 48 × 64 × 4 B = 49,152) and the 33 kept positions
    # copied for the head (4 × 33 × 64 × 4 B = 33,792): 1,122,944 bytes a counter sees. A GPU
    # sees more at the division (528,000 + 512,000 and one row's fp32 logsumexp, 32 × 1000 ×
    # 4 B): 1,168,000, of which 45,056 are inside the kernel.
    phase, lp = _no_grad(Case(2, 32, 0.04, batch=4, spg=2))
    assert phase.components[Component.LOGITS].bytes == 1_168_000
    assert lp.inside_kernel == 1_168_000 - 1_122_944


def test_under_mixed_precision_a_second_chunks_fp32_copy_comes_beside_the_first() -> None:
    # bf16 autocast over fp32 weights: accelerate's `convert_outputs_to_fp32` copies chunk 2's
    # bf16 logits (4 × 33 × 1000 × 2 B = 264,000) to fp32 (528,000) while chunk 1's fp32
    # divided logits (512,000) are alive: 1,304,000 bytes, outside the forward's autocast
    _, lp = _no_grad(Case(2, 32, 0.04, batch=4, dtype="bf16", spg=2))
    assert lp.no_grad_outside_autocast is not None
    assert lp.no_grad_outside_autocast.bytes == 1_304_000
    # one chunk: no such moment
    _, single = _no_grad(Case(2, 32, 0.04, batch=4, dtype="bf16"))
    assert single.no_grad_outside_autocast is None
