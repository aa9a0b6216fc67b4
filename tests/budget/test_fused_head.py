"""TRL 1.x's fused LM head (trl 1.16.0 `add_fused_lm_head`, trl/kernels/chunked_logprob.py
`ChunkedLogProbFunction`) in the preference budget.

The expectations are worked out by hand from TRL's tile sizes (4096 tokens × 32768 vocabulary
columns per tile, the buffer allocated at the full width) and the step's shapes. TRL is not a
test dependency: the head's memory on the CPU is measured on a restatement of TRL's algorithm
written here (the projection tile by tile into one buffer, the fold in torch ops as TRL does on
a device without Triton, the backward recomputing each tile), under llmmem's StorageTracker.
bench/trl_trainers.py --trl 1.16.0 runs TRL's own DPOTrainer and KTOTrainer.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from llmmem.budget.fused_head import head_bytes, uses_fused_head
from llmmem.budget.preference import estimate_preference_budget
from llmmem.budget.preference_setup import Objective, PreferenceSetup
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import Method, Precision, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.tracker import StorageTracker

GiB = 2**30


def _spec(hidden: int, vocab: int, layers: int = 2) -> Any:
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }
    return spec_from_config(config, model_id=f"llama-{hidden}-{vocab}", source=ModelSource.CONFIG)


def _setup(method: str, rows: int, seq: int, precision: str = "fp32") -> TrainingSetup:
    from llmmem.budget.setup import LoraSetup

    return TrainingSetup(
        method=Method(method),
        batch=rows,
        seq=seq,
        precision=Precision(precision),
        optim="adamw_torch",
        lora=LoraSetup(r=8, alpha=16, targets=["q_proj", "v_proj"]) if method == "lora" else None,
    )


def _qwen_like() -> Any:
    """Qwen2.5-0.5B's head: hidden 896, a 151,936-token vocabulary."""
    config = {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }
    return spec_from_config(config, model_id="qwen2.5-0.5b-like", source=ModelSource.CONFIG)


# -- by hand from TRL's tile sizes ----------------------------------------------------------


def test_the_tile_buffer_is_allocated_at_the_full_vocabulary_chunk_width() -> None:
    """`mm_buf` is min(N, 4096) × 32768 whatever the vocabulary: a 1000-token vocabulary pays
    for 32768 columns. 2 pairs of 64 tokens: P = 4 × 63 = 252 positions, fp32."""
    spec = _spec(hidden=64, vocab=1000)
    head = head_bytes(spec, _setup("lora", 4, 64), 4)
    p = 4 * 63
    buffer = 4 * p * 32768  # 33,030,144 B
    copy = 4 * p * 64  # the positions' hidden states, saved
    small = (16 + 13) * p  # targets, log_z, entropy saved; the masked outputs kept
    grad_hidden = 4 * p * 64  # fp32, allocated whole before the first tile
    assert head.backward == copy + small + grad_hidden + buffer + 4 * p
    # forward: the last hidden state (4 rows × 64 tokens) beside the copy, the buffer and
    # seven fp32 statistics and the int64 targets per position
    assert head.forward == 4 * 4 * 64 * 64 + copy + buffer + 36 * p


def test_tiles_stop_growing_past_4096_positions() -> None:
    """Past 4096 positions the buffer stays 4096 rows: more tokens add only the per-position
    hidden states (the copy and its fp32 gradient), not vocabulary-wide bytes."""
    spec = _qwen_like()
    setup = _setup("lora", 4, 1025)  # 4 × 1024 = 4096 positions
    longer = _setup("lora", 4, 2049)  # 8192 positions
    at_4096 = head_bytes(spec, setup, 4).backward
    at_8192 = head_bytes(spec, longer, 4).backward
    more = 4096
    per_position = 4 * 896 + 4 * 896 + 29 + 4  # the copy, its gradient, P-sized tensors
    assert at_8192 - at_4096 == more * per_position
    # and the buffer is the 4096 × 32768 fp32 tile: half a GiB
    assert at_4096 > 4 * 4096 * 32768 == GiB // 2


def test_the_head_weight_gradient_is_accumulated_in_fp32_under_bf16() -> None:
    """Full fine-tuning in bf16: `grad_weight` is V × H in fp32 (8 B a weight with its bf16
    cast at the return), where LoRA's frozen head has none."""
    spec = _qwen_like()
    full = head_bytes(spec, _setup("full", 4, 512, "bf16-true"), 4).backward
    lora = head_bytes(spec, _setup("lora", 4, 512, "bf16-true"), 4).backward
    assert full - lora == 151936 * 896 * (4 + 2)


# -- the budget ------------------------------------------------------------------------------


def _peak(objective: Objective, release: str, method: str = "full") -> int:
    spec = _qwen_like()
    setup = _setup(method, 2, 1024, "bf16-true")
    pref = PreferenceSetup(objective=objective, trl_release=release)
    return estimate_preference_budget(spec, setup, pref).allocated_peak_bytes


def test_dpo_of_a_small_model_with_a_large_vocabulary_is_gibibytes_lower_at_trl_1() -> None:
    """Qwen2.5-0.5B-sized DPO, 2 pairs × 1024 tokens, bf16 with accelerate's fp32 outputs:
    at TRL 0.29 the policy's fp32 logits alone are 4 × 1024 × 151936 × 4 B = 2.3 GiB, with
    their shifted copy and the reference's beside them; TRL 1.16's fused head holds tiles of
    at most 4096 × 32768."""
    at_029 = _peak(Objective.DPO, "0.29.1")
    at_116 = _peak(Objective.DPO, "1.16.0")
    logits = 4 * 1024 * 151936 * 4
    assert at_029 - at_116 > logits
    assert _peak(Objective.KTO, "1.16.0") < _peak(Objective.KTO, "0.29.1") - logits // 2


def test_only_the_trainers_with_the_fused_head_use_it() -> None:
    assert uses_fused_head(PreferenceSetup(objective=Objective.DPO, trl_release="1.16.0"))
    assert uses_fused_head(PreferenceSetup(objective=Objective.KTO, trl_release="1.15.0"))
    # 1.0 to 1.14 still hold the logits (no add_fused_lm_head in their trl/trainer/utils.py)
    for early in ("1.0.0", "1.3.0", "1.14.2"):
        assert not uses_fused_head(PreferenceSetup(objective=Objective.DPO, trl_release=early))
    assert not uses_fused_head(PreferenceSetup(objective=Objective.DPO, trl_release="0.29.1"))
    assert not uses_fused_head(PreferenceSetup(objective=Objective.DPO))
    # ORPO and CPO stay in trl.experimental with the full logits; a reward model has none
    for objective in (Objective.ORPO, Objective.CPO, Objective.REWARD):
        assert not uses_fused_head(PreferenceSetup(objective=objective, trl_release="1.16.0"))
    budget = estimate_preference_budget(
        _qwen_like(),
        _setup("lora", 2, 1024, "bf16-true"),
        PreferenceSetup(objective=Objective.DPO, trl_release="1.16.0"),
    )
    backward = next(p for p in budget.phases if p.phase is Phase.BACKWARD)
    forward = next(p for p in budget.phases if p.phase is Phase.FORWARD)
    assert "fused LM head" in forward.components[Component.LOGITS].formula
    assert "fused LM head" in backward.components[Component.LOGITS].formula


# -- measured on the CPU: TRL's algorithm restated ------------------------------------------

TOKENS, COLUMNS = 4096, 32768  # TRL's tile: tokens × vocabulary columns


class _RestatedHead(torch.autograd.Function):
    """Per-position log-probabilities of `hidden @ weight.T` one tile at a time, as TRL 1.16's
    `ChunkedLogProbFunction` computes them where there is no Triton: one buffer of
    min(N, 4096) × 32768, each tile scaled (logit scale, temperature: new tensors), folded into
    a running max and sum of exponentials, the entropy's and the mean's sums and the argmax
    test; the backward allocates the fp32 gradients whole, then recomputes each tile and turns
    it into the logits' gradient in place."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> Any:
        n, vocab = hidden.shape[0], weight.shape[0]
        stats = [torch.zeros(n) for _ in range(7)]
        top, total, weighted, _sq, mean, before_max, picked = stats
        top.fill_(-math.inf)
        before_max.fill_(-math.inf)
        buffer = torch.empty(min(n, TOKENS), COLUMNS)
        for t0 in range(0, n, TOKENS):
            rows = slice(t0, min(t0 + TOKENS, n))
            for v0 in range(0, vocab, COLUMNS):
                width = min(COLUMNS, vocab - v0)
                tile = buffer[: rows.stop - t0, :width]
                torch.mm(hidden[rows], weight[v0 : v0 + width].t(), out=tile)
                z = tile.float() * 1.0
                z = z * 1.0
                local = targets[rows] - v0
                mean[rows] += z.sum(-1)
                ahead = torch.arange(width) < local.unsqueeze(-1)
                before_max[rows] = torch.maximum(
                    before_max[rows], z.masked_fill(~ahead, -math.inf).amax(-1)
                )
                new_top = torch.maximum(top[rows], z.amax(-1))
                shrink = torch.exp(top[rows] - new_top)
                e = torch.exp(z - new_top.unsqueeze(-1))
                total[rows] = total[rows] * shrink + e.sum(-1)
                weighted[rows] = weighted[rows] * shrink + (e * z).sum(-1)
                top[rows] = new_top
                inside = (local >= 0) & (local < width)
                got = z.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
                picked[rows] = torch.where(inside, got, picked[rows])
                del z, ahead, e
        log_z = top + torch.log(total)
        entropy = log_z - weighted / total
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        return picked - log_z, entropy, mean / vocab, (picked >= top) & (picked > before_max)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: Any) -> Any:
        hidden, weight, targets, log_z, _entropy = ctx.saved_tensors
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_hidden = torch.zeros(hidden.shape)
        grad_weight = torch.zeros(weight.shape)
        buffer = torch.empty(min(n, TOKENS), COLUMNS)
        grad = grad.float().contiguous()
        for t0 in range(0, n, TOKENS):
            rows = slice(t0, min(t0 + TOKENS, n))
            for v0 in range(0, vocab, COLUMNS):
                width = min(COLUMNS, vocab - v0)
                tile = buffer[: rows.stop - t0, :width]
                torch.mm(hidden[rows], weight[v0 : v0 + width].t(), out=tile)
                _fold_backward(tile, targets[rows], log_z[rows], grad[rows], v0)
                grad_hidden[rows].addmm_(tile, weight[v0 : v0 + width])
                grad_weight[v0 : v0 + width].addmm_(tile.t(), hidden[rows])
        return grad_hidden, grad_weight, None


def _fold_backward(
    tile: torch.Tensor, targets: torch.Tensor, log_z: torch.Tensor, grad: torch.Tensor, v0: int
) -> None:
    y = tile.float() * 1.0
    z = y * 1.0
    log_p = z - log_z.unsqueeze(-1)
    p = torch.exp(log_p)
    out = torch.zeros_like(z)
    hit = torch.arange(v0, v0 + tile.shape[1]) == targets.unsqueeze(-1)
    out += grad.unsqueeze(-1) * (hit.float() - p)
    out = out * 1.0
    tile.copy_(out * 1.0)


def _patched_forward(last: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> Any:
    """`_fused_forward` after the backbone: every position scored (no Triton), the hidden
    states of the shifted positions copied into the Function's input."""
    hidden = last[:, :-1].reshape(-1, last.size(-1))
    shifted = labels[:, 1:]
    mask = shifted != -100
    out = _RestatedHead.apply(hidden, weight, shifted.clamp(min=0).reshape(-1))
    return [x.view(mask.shape).masked_fill(~mask, 0) for x in out]


@pytest.mark.parametrize("vocab", [1000, 40000])
def test_the_restated_head_measures_as_the_budget_sizes_it(vocab: int) -> None:
    """Full fine-tuning, fp32, 4 rows × 64 tokens: the forward's and the backward's peaks
    of the head alone (the weights made before counting) read as `head_bytes` with the fold
    in torch, within 0.5% (a 1000-token vocabulary: one tile of 1000 columns in a 32768-wide
    buffer; 40000: two tiles, 32768 and 7232 wide)."""
    rows, seq, hidden_size = 4, 64, 64
    spec = _spec(hidden_size, vocab)
    setup = _setup("full", rows, seq)
    budget = head_bytes(spec, setup, rows, Objective.DPO, triton=False)
    torch.manual_seed(0)
    weight = torch.randn(vocab, hidden_size, requires_grad=True)
    base = torch.randn(rows, seq, hidden_size, requires_grad=True)
    labels = torch.randint(0, vocab, (rows, seq))
    labels[:, : seq // 2] = -100  # the prompt
    tracker = StorageTracker()
    with tracker:
        # the weights (and the backbone's input) were there before: counted, then set aside
        tracker.track(weight)
        tracker.track(base)
        there = tracker.current
        last = base * 1.0  # the backbone's last hidden state
        log_probs, *_ = _patched_forward(last, weight, labels)
        del last
        forward = tracker.peak - there
        loss = -log_probs.sum()
        tracker.reset_peak("temporaries")
        before = tracker.current - there
        loss.backward()
        backward = tracker.peak - there
    assert forward == pytest.approx(budget.forward, rel=0.005)
    # the budget's backward counts what the forward left (its saved tensors) from zero
    assert backward == pytest.approx(budget.backward + (before - budget.saved), rel=0.005)


def test_grpo_scores_only_the_completion_through_the_head_on_a_gpu() -> None:
    """GRPOTrainer labels the completion's tokens only: on a GPU 4 rows × 256 completion
    tokens = 1024 positions go through the head, whose saved tensors are their bf16 copy
    (2 B × 1024 × 896) and 24 B a position (the int64 target, fp32 log_z and entropy saved,
    the fp32 log-probabilities and entropies returned). Without Triton every one of the
    4 × 767 positions is scored."""
    spec = _qwen_like()
    setup = _setup("full", 4, 768, "bf16-true")
    gpu = head_bytes(spec, setup, 4, Objective.GRPO, scored=256)
    assert gpu.saved == 2 * 1024 * 896 + 24 * 1024
    cpu = head_bytes(spec, setup, 4, Objective.GRPO, triton=False, scored=256)
    assert cpu.saved == 2 * 4 * 767 * 896 + 24 * 4 * 767
