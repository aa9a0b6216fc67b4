"""The GRPO budget (llmmem.budget.grpo) against a GRPO step run on the CPU.

The step is TRL 0.29.1's GRPOTrainer restated on a tiny Llama built from a config, each part
following the trainer's code (trl/trainer/grpo_trainer.py at 0.29.1):

- generation: `_generate_single_turn`'s regular path (`unwrapped_model.generate(...)` under
  `torch.no_grad()`): each prompt repeated `num_generations` times (the sampler's
  `RepeatSampler`), transformers' `generate` with its KV cache, sampling, every completion run
  to `max_completion_length` (no EOS: the longest case);
- with `beta != 0`, the reference log-probabilities of `_generate_and_score_completions` under
  `torch.no_grad()`, chunked by `per_device_train_batch_size`: a frozen copy in full
  fine-tuning, the policy with its adapter disabled under LoRA;
- the policy's `_get_per_token_logps_and_entropies`: `logits_to_keep = C + 1`, the last logit
  dropped, `logits / temperature`, `selective_log_softmax` (trl/trainer/utils.py, restated in
  llmmem.verify.preference_grid), `entropy_from_logits` without gradient in 128-row chunks;
- `_compute_loss` with the default `loss_type="dapo"`: the clipped ratio against the detached
  log-probabilities, the k3 KL term when `beta != 0`, summed over the completion tokens;
- backward and an AdamW step.

The cases run in fp32, in bf16 and under bf16 autocast over fp32 weights (accelerate's mixed
precision: the models' forward wrapped in autocast, generation's steps included).

A warm-up step makes the optimizer states; the second is measured with the project's
StorageTracker, one peak per phase. The no-gradient pass's budget counts one row's fp32
logsumexp temporary that aten makes inside the kernel (a GPU allocates it, a dispatch-level
counter cannot see it): it is left out of the comparison, by name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch.nn.functional as F  # noqa: E402

from llmmem.budget.grpo import GrpoSetup, estimate_grpo_budget, grpo_log_probs  # noqa: E402
from llmmem.budget.preference import (  # noqa: E402
    Objective,
    PreferenceSetup,
    estimate_preference_budget,  # noqa: E402
)
from llmmem.budget.result import Component, GpuTarget, Phase  # noqa: E402
from llmmem.budget.setup import LoraSetup, SetupError, TrainingSetup  # noqa: E402
from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.spec import ModelSource  # noqa: E402
from llmmem.verify.preference_grid import SMALL, selective_log_softmax  # noqa: E402
from llmmem.verify.tracker import StorageTracker  # noqa: E402

TOLERANCE = 0.05
PROMPT = 16


@dataclass(frozen=True)
class Case:
    generations: int = 2
    completion: int = 32
    beta: float = 0.0
    batch: int = 4  # per_device_train_batch_size: completions
    method: str = "full"
    dtype: str = "fp32"
    grad_ckpt: bool = False

    @property
    def id(self) -> str:
        parts = [f"g{self.generations}", f"c{self.completion}", f"b{self.batch}"]
        parts += [f"beta{self.beta:g}", self.method, self.dtype]
        return "-".join(parts + (["ckpt"] if self.grad_ckpt else []))


CASES = [
    Case(generations, completion, beta)
    for generations in (2, 4)
    for completion in (32, 64)
    for beta in (0.0, 0.04)
] + [
    Case(2, 64, 0.04, method="lora"),
    Case(2, 32, 0.04, dtype="bf16-true"),
    Case(4, 64, 0.0, dtype="bf16-true"),
    Case(4, 32, 0.0, batch=8, grad_ckpt=True),
    Case(2, 32, 0.0, dtype="bf16"),
    Case(2, 64, 0.04, dtype="bf16"),
    Case(4, 32, 0.0, dtype="bf16", grad_ckpt=True),
]


def _spec() -> Any:
    return spec_from_config(SMALL["llama"], model_id="tiny-llama", source=ModelSource.CONFIG)


def _setup(case: Case) -> TrainingSetup:
    lora = LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"]) if case.method == "lora" else None
    return TrainingSetup(
        method=case.method,
        batch=case.batch,
        seq=PROMPT + case.completion,
        precision=case.dtype,
        optim="adamw_torch",
        grad_ckpt=case.grad_ckpt,
        lora=lora,
    )


def _grpo(case: Case) -> GrpoSetup:
    return GrpoSetup(
        num_generations=case.generations,
        max_prompt_length=PROMPT,
        max_completion_length=case.completion,
        beta=case.beta,
    )


def _log_probs(model: Any, ids: Any, mask: Any, keep: int, rows: int, entropy: bool) -> Any:
    """`_get_per_token_logps_and_entropies` (grpo_trainer.py, 0.29.1), temperature 1."""
    logps, entropies = [], []
    for start in range(0, ids.size(0), rows):
        chunk = ids[start : start + rows]
        logits = model(
            input_ids=chunk,
            attention_mask=mask[start : start + rows],
            logits_to_keep=keep + 1,
            use_cache=False,
        ).logits
        logits = logits[:, :-1, :]
        logits = logits[:, -keep:, :]
        logits = logits / 1.0
        logps.append(selective_log_softmax(logits, chunk[:, -keep:]))
        if entropy:  # trl/trainer/utils.py `entropy_from_logits`, 128 rows at a time
            with torch.no_grad():
                flat = logits.reshape(-1, logits.shape[-1])
                parts = []
                for piece in flat.split(128, dim=0):
                    piece_logps = F.log_softmax(piece, dim=-1)
                    parts.append(-(torch.exp(piece_logps) * piece_logps).sum(-1))
                entropies.append(torch.cat(parts).reshape(logits.shape[:-1]))
    return torch.cat(logps), torch.cat(entropies) if entropy else None


def measure(case: Case) -> dict[str, int]:
    """Each phase's peak of allocated bytes, weights (and a reference copy) included."""
    import peft
    import transformers

    config = dict(SMALL["llama"])
    config.pop("architectures")
    vocab = config["vocab_size"]
    torch.manual_seed(0)
    dtype = torch.bfloat16 if case.dtype == "bf16-true" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), dtype=dtype, attn_implementation="sdpa"
    )
    model.train()
    ref = None
    if case.beta and case.method == "full":
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    if case.dtype == "bf16":
        # mixed precision: accelerate wraps each prepared model's forward in autocast (the
        # reference's too); generate calls that forward, the loss runs outside it
        for wrapped in [model] + ([ref] if ref is not None else []):
            wrapped.forward = torch.autocast("cpu", dtype=torch.bfloat16)(wrapped.forward)
    if case.grad_ckpt:
        model.gradient_checkpointing_enable()
    if case.method == "lora":
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        model = peft.get_peft_model(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=True)
    c = case.completion
    peaks: dict[str, int] = {}
    tracker = StorageTracker()
    with tracker:
        frozen = list(model.parameters()) + list(model.buffers())
        if ref is not None:
            frozen += list(ref.parameters()) + list(ref.buffers())
        for tensor in frozen:
            tracker.track(tensor, "weights")
        for _ in range(2):  # a warm-up step, then the measured one
            tracker.reset_peak("activations")
            prompts = torch.randint(3, vocab, (case.batch // case.generations, PROMPT))
            prompts = prompts.repeat_interleave(case.generations, dim=0)
            prompt_mask = torch.ones_like(prompts)
            with torch.no_grad():
                out = model.generate(
                    input_ids=prompts,
                    attention_mask=prompt_mask,
                    max_new_tokens=c,
                    min_new_tokens=c,
                    do_sample=True,
                    pad_token_id=0,
                    eos_token_id=None,
                    use_cache=True,
                    disable_compile=True,
                )
            peaks["generate"] = tracker.peak
            completion = out[:, PROMPT:]
            del out
            ids = torch.cat([prompts, completion], dim=1)
            mask = torch.cat([prompt_mask, torch.ones_like(completion)], dim=1)
            ref_logps = None
            if case.beta:
                tracker.reset_peak("activations")
                with torch.no_grad():
                    if ref is None:
                        with model.disable_adapter():
                            ref_logps, _ = _log_probs(model, ids, mask, c, case.batch, False)
                    else:
                        ref_logps, _ = _log_probs(ref, ids, mask, c, case.batch, False)
                peaks["reference_forward"] = tracker.peak
            advantages = torch.randn(case.batch).unsqueeze(1)
            tracker.reset_peak("activations")
            logps, _ = _log_probs(model, ids, mask, c, case.batch, True)
            ratio = torch.exp(logps - logps.detach())
            clipped = torch.clamp(ratio, 0.8, 1.28)
            per_token = -torch.min(ratio * advantages, clipped * advantages)
            if case.beta:
                diff = ref_logps - logps
                per_token = per_token + case.beta * (torch.exp(diff) - diff - 1)
            loss = per_token.sum() / per_token.numel()
            peaks["forward"] = tracker.peak
            tracker.reset_peak("temporaries")
            loss.backward()
            del loss, per_token, ratio, clipped, logps
            peaks["backward"] = tracker.peak
            tracker.reset_peak("temporaries")
            optimizer.step()
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        tracker.track(value, "optimizer_states")
            peaks["optimizer_step"] = tracker.peak
            optimizer.zero_grad()
    return peaks


def predict(case: Case) -> dict[str, int]:
    spec = _spec()
    setup = _setup(case)
    budget = estimate_grpo_budget(spec, setup, _grpo(case))
    phases = {p.phase.value: p.allocated_bytes for p in budget.phases}
    if Phase.REFERENCE_FORWARD.value in phases:
        phases[Phase.REFERENCE_FORWARD.value] -= grpo_log_probs(
            spec, setup, _grpo(case)
        ).inside_kernel
    return phases


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_phase_within_five_percent_of_a_cpu_step(case: Case) -> None:
    measured = measure(case)
    predicted = predict(case)
    assert set(measured) == set(predicted)
    for phase, got in measured.items():
        error = (predicted[phase] - got) / got
        assert abs(error) <= TOLERANCE, (
            f"{case.id} {phase}: measured {got} B, predicted {predicted[phase]} B ({error:+.1%})"
        )


@pytest.mark.parametrize(("rows", "prompt", "completion"), [(4, 16, 64), (8, 16, 128), (8, 64, 16)])
def test_generation_beside_the_weights_within_five_percent(
    rows: int, prompt: int, completion: int
) -> None:
    """What `generate` adds to the weights (its KV cache, the token ids, the last position's
    logits, a block's intermediates at the prefill), measured alone: in the step above the
    weights and optimizer states dwarf it."""
    import transformers

    config = dict(SMALL["llama"])
    config.pop("architectures")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), attn_implementation="sdpa"
    )
    model.train()
    tracker = StorageTracker()
    with tracker:
        for tensor in list(model.parameters()) + list(model.buffers()):
            tracker.track(tensor, "weights")
        weights = tracker.current
        tracker.reset_peak("activations")
        prompts = torch.randint(3, config["vocab_size"], (rows, prompt))
        with torch.no_grad():
            model.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=completion,
                min_new_tokens=completion,
                do_sample=True,
                pad_token_id=0,
                eos_token_id=None,
                use_cache=True,
                disable_compile=True,
            )
        measured = tracker.peak - weights
    setup = TrainingSetup(batch=rows, seq=prompt + completion, precision="fp32", optim="sgd")
    grpo = GrpoSetup(num_generations=2, max_prompt_length=prompt, max_completion_length=completion)
    generate = estimate_grpo_budget(_spec(), setup, grpo, None).phase(Phase.GENERATE)
    predicted = generate.allocated_bytes - sum(
        term.bytes
        for component, term in generate.components.items()
        if component in (Component.WEIGHTS, Component.OPTIMIZER_STATES)
    )
    error = (predicted - measured) / measured
    assert abs(error) <= TOLERANCE, f"measured {measured} B, predicted {predicted} B ({error:+.1%})"


def _budget(case: Case, **grpo: Any) -> Any:
    fields = {
        "num_generations": case.generations,
        "max_prompt_length": PROMPT,
        "max_completion_length": case.completion,
        "beta": case.beta,
    } | grpo
    gpu = GpuTarget(name="80GiB", capacity_bytes=80 * 2**30)
    return estimate_grpo_budget(_spec(), _setup(case), GrpoSetup(**fields), gpu)


def _phases(budget: Any) -> set[str]:
    return {p.phase.value for p in budget.phases}


def test_a_reference_only_with_beta() -> None:
    spec = _spec()
    plain = _budget(Case())
    assert _phases(plain) == {"generate", "forward", "backward", "optimizer_step"}
    assert all(Component.REFERENCE_MODEL not in p.components for p in plain.phases)
    copy_ = _budget(Case(beta=0.04))
    assert "reference_forward" in _phases(copy_)
    for phase in copy_.phases:  # the frozen copy lives through the whole step
        assert phase.components[Component.REFERENCE_MODEL].bytes == spec.total_params * 4
    adapter = _budget(Case(beta=0.04, method="lora"))
    assert "reference_forward" in _phases(adapter)
    assert all(Component.REFERENCE_MODEL not in p.components for p in adapter.phases)


def test_the_kv_cache_holds_every_completion_to_its_last_token() -> None:
    def cache(case: Case) -> int:
        return _budget(case).phase(Phase.GENERATE).components[Component.KV_CACHE].bytes

    # 2 (K, V) × 2 layers × 2 kv heads × 16 head dim × (prompt + completion − 1) × rows × 4 B
    assert cache(Case(completion=64)) == 2 * 2 * 2 * 16 * (PROMPT + 63) * 4 * 4
    assert cache(Case(completion=64, batch=8)) == 2 * cache(Case(completion=64))


def test_vllm_colocate_holds_its_share_of_the_gpu() -> None:
    case = Case(completion=64)
    share = int(0.3 * 80 * 2**30)
    awake = _budget(case, vllm="colocate")
    for phase in awake.phases:
        assert phase.components[Component.VLLM_ENGINE].bytes == share
    assert Component.KV_CACHE not in awake.phase(Phase.GENERATE).components
    # importance sampling against vLLM's sampler: the policy's own log-probabilities first
    assert "reference_forward" in _phases(awake)
    asleep = _budget(case, vllm="colocate", vllm_enable_sleep_mode=True)
    assert Component.VLLM_ENGINE in asleep.phase(Phase.GENERATE).components
    training = [p for p in asleep.phases if p.phase is not Phase.GENERATE]
    assert all(Component.VLLM_ENGINE not in p.components for p in training)
    assert asleep.allocated_peak_bytes < awake.allocated_peak_bytes
    server = _budget(case, vllm="server")
    generate = server.phase(Phase.GENERATE).components
    assert Component.KV_CACHE not in generate and Component.VLLM_ENGINE not in generate
    with pytest.raises(SetupError, match="GPU"):
        estimate_grpo_budget(_spec(), _setup(case), replace(_grpo(case), vllm="colocate"))


def test_the_batch_counts_completions() -> None:
    with pytest.raises(SetupError, match="num_generations"):
        _budget(Case(generations=3, batch=4))
    with pytest.raises(SetupError, match="at least 2"):
        GrpoSetup(num_generations=1)
    # four micro-batches per generation: the generation batch, and its cache, is four times
    # as large; the policy's micro-batch is not
    one = _budget(Case(completion=64))
    four = _budget(Case(completion=64), steps_per_generation=4)
    kv = Component.KV_CACHE
    assert four.phase(Phase.GENERATE).components[kv].bytes == 4 * (
        one.phase(Phase.GENERATE).components[kv].bytes
    )
    assert four.phase(Phase.FORWARD).allocated_bytes == one.phase(Phase.FORWARD).allocated_bytes


def test_the_preference_entry_point_sizes_grpo() -> None:
    case = Case()
    pref = PreferenceSetup(objective=Objective.GRPO, grpo=_grpo(case))
    budget = estimate_preference_budget(_spec(), _setup(case), pref)
    assert (
        budget.allocated_peak_bytes
        == estimate_grpo_budget(_spec(), _setup(case), _grpo(case)).allocated_peak_bytes
    )
