"""The GRPO budget against TRL 0.29.1's own GRPOTrainer, phase by phase.

bench/trl_step.py trains a tiny Llama with GRPOTrainer on the CPU (transformers' generation,
every completion run to its full length) under the project's StorageTracker and splits the
measured step where TRL's methods return: `_generate_single_turn`, the rest of
`_generate_and_score_completions` (the reference's log-probabilities), `compute_loss`, backward,
the optimizer step. It needs TRL, which llmmem does not depend on: the comparison runs only where
bench/trl_trainers.py has made its environment (bench/.trl), and is skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llmmem.budget.grpo import estimate_grpo_budget  # noqa: E402
from llmmem.budget.result import Component, Phase  # noqa: E402
from llmmem.verify.grpo_grid import PROMPT, Case, _grpo, _setup, _spec, predict  # noqa: E402
from llmmem.verify.preference_grid import CONFIGS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRL_PYTHON = REPO / "bench" / ".trl" / "bin" / "python"
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


def _trl_step(case: Case) -> dict[str, int]:
    payload = {
        "objective": "grpo",
        "method": case.method,
        "batch": case.batch,
        "seq": PROMPT + case.completion,
        "prompt": PROMPT,
        "completion": case.completion,
        "generations": case.generations,
        "beta": case.beta,
        "grad_ckpt": case.grad_ckpt,
        "config": CONFIGS["small"][case.family],
    }
    done = subprocess.run(
        [str(TRL_PYTHON), str(REPO / "bench" / "trl_step.py"), json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO / "analyzer"),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


TRL_CASES = [
    # a frozen reference copy, TRL's default checkpointing
    Case(2, 32, 0.04, batch=4, grad_ckpt=True),
    # the reference is the policy with its adapter disabled
    Case(4, 32, 0.04, batch=4, method="lora"),
]


@pytest.mark.skipif(not TRL_PYTHON.exists(), reason="bench/.trl (TRL 0.29.1) is not made here")
@pytest.mark.parametrize("case", TRL_CASES, ids=[c.id for c in TRL_CASES])
def test_each_phase_within_five_percent_of_trls_grpo_trainer(case: Case) -> None:
    got = _trl_step(case)
    budget = predict(case)
    for phase, measured_key in [
        ("generate", "generate"),
        ("reference_forward", "reference_forward"),
        ("forward", "forward"),
        ("backward", "backward"),
        ("optimizer_step", "optimizer"),
    ]:
        measured = got[measured_key]
        assert abs(budget[phase] - measured) <= TOLERANCE * measured, (phase, measured, budget)
    # the policy's forward peaks where TRL takes the entropies
    assert "entropy_from_logits" in got["forward where"]
