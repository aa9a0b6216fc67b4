"""The PPO budget (llmmem.budget.ppo) against a PPO update run on the CPU.

The update (`llmmem.verify.ppo_grid`, which `python -m llmmem.verify.grid --ppo` runs too) is
TRL 0.29.1's PPOTrainer restated on tiny models built from a config: a policy, a value model of
the policy's size or smaller, a frozen reference (a copy, or under LoRA the policy with its
adapter disabled) and a frozen reward model; generation with kept scores, the rollout's forwards
without gradient, the wrapper's forward and backward on a micro-batch, an AdamW step over both
trainables, the entropy. A warm-up update makes the optimizer states; the second is measured with
the project's StorageTracker, one peak per phase.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from llmmem.budget.ppo import estimate_ppo_budget  # noqa: E402
from llmmem.budget.ppo_setup import PpoSetup  # noqa: E402
from llmmem.budget.preference import estimate_preference_budget  # noqa: E402
from llmmem.budget.preference_setup import Objective, PreferenceSetup, Reference  # noqa: E402
from llmmem.budget.result import Component, Phase  # noqa: E402
from llmmem.budget.setup import SetupError, TrainingSetup  # noqa: E402
from llmmem.verify.ppo_grid import Case, measure, ppo_of, predict, setup_of, spec_of  # noqa: E402

TOLERANCE = 0.05
HELD = (Component.WEIGHTS, Component.REFERENCE_MODEL, Component.OPTIMIZER_STATES)

CASES = [
    Case(),
    Case(method="lora"),
    Case(dtype="bf16-true"),
    Case(method="lora", dtype="bf16"),
    Case(value="small"),
    Case(batch=2, grad_accum=2, method="lora", value="small"),
    Case(batch=4, chunk=2, prompt=32, response=16),
    Case(family="qwen2", method="lora", dtype="bf16-true"),
    # bf16 weights with bf16=False: no fp32 outputs
    Case(dtype="bf16-true", mixed=False),
    Case(family="qwen2", dtype="bf16"),
    # a value model larger than the policy (its backbone is the rollout's peak), and long
    # queries with short responses (the generation's peak is the prefill)
    Case(value="large", prompt=64, response=8, method="lora"),
    # padded queries (every case above too): SDPA gets the padding mask and K/V repeated to
    # every head in the training forward; and queries all of one length, with no mask
    Case(method="lora", prompt=32, response=64),
    Case(method="lora", prompt=32, response=64, padded=False),
    # two micro-batches: the first one's entropy runs with its gradients accumulated, the
    # second's after the step, the first one's softmax dying as the new one is assigned
    Case(batch=2, grad_accum=2, method="lora", value="small", prompt=32, response=64),
    # Gemma-2 (eager attention, soft-capped logits): the policy's tanh kept in training, the
    # reference's capped head and, in 16 bits, its eager attention peaking the rollout
    Case(family="gemma2"),
    Case(family="gemma2", method="lora", dtype="bf16-true", prompt=32, response=64),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_phase_within_five_percent_of_a_cpu_update(case: Case) -> None:
    measured = measure(case)
    predicted = predict(case)
    assert (
        set(measured)
        == set(predicted)
        == {
            "generate",
            "reference_forward",
            "forward",
            "backward",
            "optimizer_step",
        }
    )
    budget = estimate_ppo_budget(spec_of(case), setup_of(case), ppo_of(case))
    for phase, got in measured.items():
        error = (predicted[phase] - got) / got
        assert abs(error) <= TOLERANCE, (
            f"{case.id} {phase}: measured {got} B, predicted {predicted[phase]} B ({error:+.1%})"
        )
        # the four models' weights and the states dwarf the rest in tiny models: what the
        # phase adds beside them is held to 15% too
        held = sum(t.bytes for c, t in budget.phase(Phase(phase)).components.items() if c in HELD)
        beside = (predicted[phase] - held - (got - held)) / (got - held)
        assert abs(beside) <= 0.15, f"{case.id} {phase}: {beside:+.1%} beside the weights"


def _setup(**fields: object) -> TrainingSetup:
    return replace(setup_of(Case()), **fields)


def test_padded_queries_cost_the_masks_and_the_repeated_heads_in_the_training_forward() -> None:
    # llama small: 2 blocks, 4 query heads and 2 K/V heads of 16, h = 64; the value model is
    # the policy's size; 2 rows of 16 + 32 tokens, fp32
    case = Case()
    spec = spec_of(case)
    padded = estimate_ppo_budget(spec, setup_of(case), ppo_of(case))
    same = estimate_ppo_budget(spec, setup_of(case), replace(ppo_of(case), padded_queries=False))
    rows, seq, layers = 2, 48, 2 + 2
    # per layer of either model: SDPA's additive mask (4 B × rows × seq²) and K and V repeated
    # from 2 heads to 4 (2 × 4 B × rows × seq × (64 − 32) more than the unrepeated ones)
    per_layer = 4 * rows * seq**2 + 2 * 4 * rows * seq * (64 - 32)
    added = padded.phase(Phase.FORWARD).allocated_bytes - same.phase(Phase.FORWARD).allocated_bytes
    # (and at most the boolean mask transformers builds once per forward, 1 B × rows × seq²)
    assert layers * per_layer <= added <= layers * per_layer + rows * seq**2
    # generation and the rollout run without gradient: nothing kept
    for phase in (Phase.GENERATE, Phase.REFERENCE_FORWARD):
        assert padded.phase(phase).allocated_bytes == same.phase(phase).allocated_bytes


def test_the_value_backbones_cache_and_score_input_are_alive_at_the_policys_head() -> None:
    # PolicyAndValueWrapper.forward binds the value backbone's output until it returns: its KV
    # cache is alive while the policy's LM head runs. llama small: 2 blocks, 2 K/V heads of 16;
    # 2 rows of 16 + 32 tokens, fp32; the value model is the policy's size
    case = Case()
    budget = estimate_ppo_budget(spec_of(case), setup_of(case), ppo_of(case))
    forward = budget.phase(Phase.FORWARD)
    one_cache = 2 * 2 * 2 * 16 * 48 * 2 * 4  # K and V × blocks × kv heads × dim × tokens × rows
    assert forward.components[Component.KV_CACHE].bytes == 2 * one_cache  # policy's and value's
    assert "LM head" in forward.moment
    # at the head the logits exist once (4 B × 2 rows × 48 × V = 1000), beside the kept scores
    # (4 B × 2 rows × 32 × V)
    assert forward.components[Component.LOGITS].bytes == 4 * 2 * 48 * 1000 + 4 * 2 * 32 * 1000
    # the score head (hidden × 1 over every position) keeps its input: 4 B × 2 × 48 × 64, in
    # the forward and until the value model's backward
    without = estimate_ppo_budget(
        spec_of(case), setup_of(case), replace(ppo_of(case), value="head")
    )
    assert "value score head's input" in forward.components[Component.ACTIVATIONS].formula
    assert "value score head's input" not in (
        without.phase(Phase.FORWARD).components[Component.ACTIVATIONS].formula
    )
    backward = budget.phase(Phase.BACKWARD).components[Component.ACTIVATIONS]
    assert "value" in backward.formula


def test_16_bit_hidden_states_held_only_by_the_output_are_counted() -> None:
    # an RMS norm saves its fp32 copy of a 16-bit residual, not the residual: the embeddings'
    # output and the first block's (llama small: 2 blocks; 2 rows of 48 tokens, h = 64, 2 B)
    # live only in the policy's output (output_hidden_states=True)
    case = Case(dtype="bf16-true", mixed=False)
    budget = estimate_ppo_budget(spec_of(case), setup_of(case), ppo_of(case))
    text = "hidden states autograd does not keep"
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        acts = budget.phase(phase).components[Component.ACTIVATIONS]
        assert text in acts.formula, phase
    fp32 = estimate_ppo_budget(spec_of(Case()), setup_of(Case()), ppo_of(Case()))
    assert text not in fp32.phase(Phase.FORWARD).components[Component.ACTIVATIONS].formula
    # 2 × 2×48×64 × 2 B, and the whole forward within 5% of the CPU update (CASES)
    assert "2 × 2×48×64 × 2 B (the output's " + text in (
        budget.phase(Phase.FORWARD).components[Component.ACTIVATIONS].formula
    )


def test_the_four_models_and_the_phases_are_named() -> None:
    budget = estimate_ppo_budget(spec_of(Case()), _setup(), ppo_of(Case()))
    assert [p.phase for p in budget.phases] == [
        Phase.GENERATE,
        Phase.REFERENCE_FORWARD,
        Phase.FORWARD,
        Phase.BACKWARD,
        Phase.OPTIMIZER_STEP,
    ]
    four = next(n for n in budget.notes if n.startswith("ppo: four models"))
    for model in ("policy", "value model", "reference a frozen copy", "reward"):
        assert model in four


def test_a_smaller_value_model_costs_less_and_lora_drops_the_reference_copy() -> None:
    spec = spec_of(Case())
    same = estimate_ppo_budget(spec, _setup(), ppo_of(Case()))
    small = estimate_ppo_budget(spec, _setup(), ppo_of(Case(value="small")))
    assert small.allocated_peak_bytes < same.allocated_peak_bytes
    lora = estimate_ppo_budget(spec, setup_of(Case(method="lora")), ppo_of(Case()))
    frozen = lora.phase(Phase.FORWARD).components[Component.REFERENCE_MODEL]
    assert "reference" not in frozen.formula and "reward" in frozen.formula


def test_the_kept_scores_grow_with_the_response_and_the_rollout_batch() -> None:
    spec = spec_of(Case())

    def kept(ppo: PpoSetup, **fields: object) -> int:
        budget = estimate_ppo_budget(spec, _setup(**fields), ppo)
        return budget.phase(Phase.REFERENCE_FORWARD).components[Component.LOGITS].bytes

    base = PpoSetup(query_length=16, response_length=32, local_rollout_forward_batch_size=2)
    assert kept(base) == 2 * 32 * 1000 * 4  # 2 queries × 32 tokens × the vocabulary, fp32
    assert kept(replace(base, response_length=64)) == 2 * kept(base)
    assert kept(base, grad_accum=4) == 4 * kept(base)


def test_reached_from_the_preference_budget() -> None:
    spec = spec_of(Case())
    pref = PreferenceSetup(objective=Objective.PPO, ppo=ppo_of(Case()))
    via = estimate_preference_budget(spec, _setup(), pref)
    direct = estimate_ppo_budget(spec, _setup(), ppo_of(Case()))
    assert via.allocated_peak_bytes == direct.allocated_peak_bytes
    with pytest.raises(SetupError, match="adapter-disabled"):
        estimate_preference_budget(
            spec, _setup(), PreferenceSetup(objective=Objective.PPO, reference=Reference.ADAPTER)
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"response_length": 0}, "response_length"),
        ({"local_rollout_forward_batch_size": -1}, "local_rollout_forward_batch_size"),
        ({"reward": "server"}, "model, adapter or api"),
        ({"reference": "precomputed"}, "a copy, the policy with its adapter disabled"),
    ],
)
def test_bad_settings_are_refused_with_a_message(fields: dict, message: str) -> None:
    with pytest.raises(SetupError, match=message):
        PpoSetup(**fields)


def test_mini_batches_must_divide_the_rollout() -> None:
    with pytest.raises(SetupError, match="num_mini_batches"):
        estimate_ppo_budget(spec_of(Case()), _setup(), PpoSetup(num_mini_batches=3))


def _plan(tmp_path: Path, name: str, text: str):  # type: ignore[no-untyped-def]
    from llmmem.extract import extract_plan

    path = tmp_path / name
    path.write_text(text)
    return extract_plan(path, text)


def test_a_llamafactory_ppo_yaml_puts_the_value_on_the_policy(tmp_path: Path) -> None:
    from llmmem.preference_plan import ppo_setup

    plan = _plan(
        tmp_path,
        "ppo.yaml",
        "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nstage: ppo\nfinetuning_type: lora\n"
        "reward_model: saves/rm\nmax_new_tokens: 512\ncutoff_len: 1024\n",
    )
    ppo = ppo_setup(plan)
    assert (ppo.value, ppo.reward, ppo.response_length, ppo.keep_scores) == (
        "head",
        "adapter",
        512,
        False,
    )
    api = _plan(
        tmp_path,
        "api.yaml",
        "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nstage: ppo\nfinetuning_type: full\n"
        "reward_model: http://localhost:8000\nreward_model_type: api\n",
    )
    assert ppo_setup(api).reward == "api"
    full = _plan(
        tmp_path,
        "full.yaml",
        "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nstage: ppo\nfinetuning_type: full\n"
        "reward_model: Qwen/Qwen2.5-1.5B-Instruct\nreward_model_type: full\n",
    )
    sized = ppo_setup(full)
    assert sized.reward == "model" and sized.reward_model.total_params > 1e9


def test_verl_ppo_says_it_is_not_modelled(tmp_path: Path) -> None:
    from llmmem.preference_plan import preference_setup

    plan = _plan(
        tmp_path,
        "verl.yaml",
        "algorithm:\n  adv_estimator: gae\nactor_rollout_ref:\n  model:\n"
        "    path: Qwen/Qwen2.5-0.5B-Instruct\ndata:\n  max_prompt_length: 512\n"
        "  max_response_length: 512\n",
    )
    with pytest.raises(SetupError, match="not modelled"):
        preference_setup(plan)


def test_a_trl_ppo_script_gives_its_lengths() -> None:
    from llmmem.extract import extract_plan
    from llmmem.preference_plan import ppo_setup

    path = Path(__file__).parents[2] / "examples" / "ppo_lora.py"
    ppo = ppo_setup(extract_plan(path))
    assert (ppo.response_length, ppo.local_rollout_forward_batch_size) == (256, 16)


def test_eager_attention_peaks_the_rollout_with_a_layers_scores() -> None:
    from llmmem.budget.setup import AttnImpl

    # llama small, 2 rows of 128 + 16 tokens, fp32, the value and reward models the policy's
    # size: under eager attention a layer's scores (4 heads × 144 × 144, fp32) and their
    # softmax, the causal mask (144 × 144) and K/V repeated from 2 heads to 4 (2 × 144 × 64)
    # join the reference's hidden states (3 × 144 × 64) and its cache, and outweigh its logits
    case = Case(prompt=128, response=16)
    spec = spec_of(case)

    def rollout(attn: AttnImpl) -> int:
        setup = replace(setup_of(case), attn=attn)
        budget = estimate_ppo_budget(spec, setup, ppo_of(case))
        return budget.phase(Phase.REFERENCE_FORWARD).allocated_bytes

    rows, seq = 2, 144
    attention = 2 * 4 * rows * 4 * seq * seq + 4 * rows * seq * seq + 2 * 4 * rows * seq * 64
    hidden = 3 * rows * seq * 64 * 4
    cache = 2 * 2 * 2 * 16 * seq * rows * 4
    held = estimate_ppo_budget(spec, setup_of(case), ppo_of(case)).phase(Phase.REFERENCE_FORWARD)
    kept = sum(t.bytes for c, t in held.components.items() if c is not Component.ACTIVATIONS)
    sdpa, eager = rollout(AttnImpl.SDPA), rollout(AttnImpl.EAGER)
    assert eager == kept + hidden + cache + attention > sdpa
