"""Measure what autograd saves inside one transformer block of a real (tiny) HF model on the CPU.

A tiny model is built from a config dict in the dtype of the training mode; one forward runs with
`saved_tensors_hooks` recording every tensor packed while the middle block runs. Each storage is
counted once, by its data pointer, and put in one of these kinds:

- ``activation``: computed from the block input inside the block (the block input included when
  a block op saves it) — what llmmem's per-block tally predicts;
- ``parameter``: a parameter's own storage (a frozen Linear keeps its weight, not an activation);
- ``weight_copy``: created inside the block from parameters and constants only (autocast's
  low-precision weight casts, Gemma's ``1 + weight``): weight-sized, not token-dependent;
- ``shared``: created before the block and not the block input (rotary cos/sin, masks), the
  same tensors for every block.

Whether a storage depends on the block input is tracked by a dispatch mode that marks every
output of an op that reads a marked storage. Only tensors still held by the autograd graph at the
end of the forward count (a node dropped with its output frees what it saved). The op that saved
each tensor is read back from the graph by walking the nodes created while the block ran.

What the CPU shows that a GPU may not: CPU autocast runs softmax, pow and layer_norm in bf16
where CUDA autocast runs them in fp32, so AMP cases only stand for GPUs where those ops do not
occur on bf16 inputs (BERT's eager softmax under AMP is left out of the grid for that reason).

`measure_case(case)` returns a `BlockMeasurement`; `predict_case(case)` llmmem's tally for the
same block, with the dims it is evaluated on.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BATCH = 2
SEQ = 128

# Tiny configs, structurally faithful to each family; every dropout 0 (CPU SDPA with dropout
# keeps the full b·a·s² matrix, which the CUDA kernels do not).
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "head_dim": 48,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "head_dim": 48,
    },
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
    },
    "gemma": {
        "model_type": "gemma",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 48,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh",
        "attention_dropout": 0.0,
        "pad_token_id": 0,
    },
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "query_pre_attn_scalar": 48,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "sliding_window": 4096,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh",
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
    },
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "original_max_position_embeddings": 512,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "phi": {
        "model_type": "phi",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "partial_rotary_factor": 0.5,
        "hidden_act": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 128,
        "n_layer": 3,
        "n_head": 4,
        "n_positions": 512,
        "vocab_size": 128,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "n_inner": 320,
    },
    "gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "rotary_pct": 0.25,
        "use_parallel_residual": True,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "gptj": {
        "model_type": "gptj",
        "n_embd": 128,
        "n_layer": 3,
        "n_head": 4,
        "vocab_size": 128,
        "rotary_dim": 16,
        "n_positions": 512,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "falcon": {
        "model_type": "falcon",
        "hidden_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "vocab_size": 128,
        "multi_query": True,
        "new_decoder_architecture": False,
        "parallel_attn": True,
        "bias": False,
        "alibi": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "max_position_embeddings": 512,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "opt": {
        "model_type": "opt",
        "hidden_size": 128,
        "ffn_dim": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "word_embed_proj_dim": 128,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "activation_function": "relu",
        "do_layer_norm_before": True,
        "enable_bias": True,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "layerdrop": 0.0,
        "pad_token_id": 1,
        "bos_token_id": 2,
        "eos_token_id": 2,
    },
    "bert": {
        "model_type": "bert",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "pad_token_id": 0,
    },
    "mixtral": {
        "model_type": "mixtral",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "router_jitter_noise": 0.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "head_dim": 48,
    },
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "hidden_size": 128,
        "intermediate_size": 288,
        "moe_intermediate_size": 96,
        "shared_expert_intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 512,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": False,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "head_dim": 48,
    },
}

# LoRA targets per family: q_proj and v_proj, or the projection that computes q, k and v together
# (PEFT's defaults, except Phi, whose PEFT default also adapts fc1 and fc2).
LORA_TARGETS: dict[str, list[str]] = {
    "phi3": ["qkv_proj"],
    "phi": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "gpt_neox": ["query_key_value"],
    "gptj": ["q_proj", "v_proj"],
    "falcon": ["query_key_value"],
    "bert": ["query", "value"],
}
LORA_RANK = 8

# mode -> (llmmem precision, llmmem method, weight dtype, autocast)
MODES: dict[str, tuple[str, str, torch.dtype, bool]] = {
    "fp32": ("fp32", "full", torch.float32, False),
    "bf16-true": ("bf16-true", "full", torch.bfloat16, False),
    "amp-bf16": ("bf16", "full", torch.float32, True),
    "lora-fp32": ("fp32", "lora", torch.float32, False),
    "lora-bf16": ("bf16-true", "lora", torch.bfloat16, False),
}

# Families whose HF class trains with eager attention whatever is asked.
EAGER_ONLY = {"gemma2"}


@dataclass(frozen=True)
class Case:
    family: str
    mode: str
    attn: str = "sdpa"

    @property
    def id(self) -> str:
        return f"{self.family}-{self.mode}-{self.attn}"


def _grid() -> list[Case]:
    cases = [Case("llama", m) for m in ("fp32", "bf16-true", "amp-bf16", "lora-fp32", "lora-bf16")]
    cases += [Case("llama", "fp32", "eager"), Case("llama", "bf16-true", "eager")]
    for family in FAMILY_CONFIGS:
        if family == "llama":
            continue
        attn = "eager" if family in EAGER_ONLY else "sdpa"
        modes = ("fp32", "bf16-true", "amp-bf16", "lora-bf16")
        if family in ("mixtral", "qwen2_moe"):
            # the grouped-matmul expert kernel takes bf16 inputs only: bf16 weights
            modes = ("bf16-true", "lora-bf16")
        cases += [Case(family, m, attn) for m in modes]
    cases += [
        Case("qwen3", "bf16-true", "eager"),
        Case("gpt2", "fp32", "eager"),
        Case("gpt2", "bf16-true", "eager"),
        Case("gpt2", "amp-bf16", "eager"),
        Case("bert", "fp32", "eager"),
        Case("bert", "bf16-true", "eager"),
        Case("phi", "bf16-true", "eager"),
        Case("opt", "bf16-true", "eager"),
        Case("gptj", "bf16-true", "eager"),
        Case("falcon", "bf16-true", "eager"),
    ]
    return cases


CASES: list[Case] = _grid()


# --- the model ---------------------------------------------------------------------------------


def build_model(case: Case) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    values = dict(FAMILY_CONFIGS[case.family])
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    _, method, dtype, _ = MODES[case.mode]
    torch.manual_seed(0)
    auto = AutoModelForMaskedLM if model_type == "bert" else AutoModelForCausalLM
    model = auto.from_config(config, attn_implementation=case.attn, dtype=dtype)
    model.train()
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        targets = LORA_TARGETS.get(case.family, ["q_proj", "v_proj"])
        lora = LoraConfig(r=LORA_RANK, lora_alpha=16, target_modules=targets, lora_dropout=0.0)
        model = get_peft_model(model, lora)
        model.train()
    return model


def find_blocks(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            if all(isinstance(m, torch.nn.Module) for m in module):
                return module
    raise LookupError("no ModuleList of the transformer blocks")


# --- the measurement ---------------------------------------------------------------------------


@dataclass
class SavedStorage:
    kind: str  # activation, parameter, weight_copy, shared
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    ops: list[str] = field(default_factory=list)  # "MulBackward0.other", ...

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        ops = ", ".join(sorted(set(self.ops))) or "?"
        return f"{self.nbytes:>9} B  {dtype:<8} {list(self.shape)!s:<20} {ops}"


@dataclass
class BlockMeasurement:
    storages: list[SavedStorage]

    def bytes_of(self, kind: str) -> int:
        return sum(s.nbytes for s in self.storages if s.kind == kind)

    @property
    def activation_bytes(self) -> int:
        return self.bytes_of("activation")

    def of_kind(self, kind: str) -> list[SavedStorage]:
        return [s for s in self.storages if s.kind == kind]


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _InputTracker(TorchDispatchMode):
    """Marks each storage an op creates as input-dependent when the op reads a marked storage."""

    def __init__(self, marked: set[int]) -> None:
        super().__init__()
        self.depends: dict[int, bool] = {key: True for key in marked}
        self.created: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        out = func(*args, **kwargs)
        depends = any(self.depends.get(_storage_key(t), False) for t in inputs if _has_storage(t))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _has_storage(t):
                key = _storage_key(t)
                if any(key == _storage_key(i) for i in inputs if _has_storage(i)):
                    # in place or a view: keeps what it was, plus the other inputs
                    self.depends[key] = self.depends.get(key, False) or depends
                else:
                    self.depends[key] = depends
                    self.created.add(key)
        return out


def _has_storage(t: torch.Tensor) -> bool:
    try:
        t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return False
    return True


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _next_sequence_nr() -> int:
    probe = torch.zeros(1, requires_grad=True).clone()
    return probe.grad_fn._sequence_nr()  # type: ignore[union-attr]


def _saved_by_node(root: Any, first: int, last: int) -> dict[int, list[str]]:
    """storage key -> names of the graph nodes created in [first, last] that saved it."""
    names: dict[int, list[str]] = defaultdict(list)
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(n for n, _ in node.next_functions)
        if not first <= node._sequence_nr() <= last:
            continue
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # noqa: BLE001 - some saved values are not readable
                continue
            values = value if isinstance(value, (list, tuple)) else [value]
            for v in values:
                if isinstance(v, torch.Tensor) and _has_storage(v):
                    names[_storage_key(v)].append(f"{node.name()}.{attr[len('_saved_') :]}")
    return names


def measure_block(
    model: torch.nn.Module,
    block: torch.nn.Module,
    input_ids: torch.Tensor,
    autocast: bool = False,
    forward_kwargs: dict[str, Any] | None = None,
) -> BlockMeasurement:
    """Run one forward and classify what `block` leaves saved for backward."""
    held: list[weakref.ref[_Held]] = []
    recording = [False]
    tracker_box: list[_InputTracker] = []
    seq_range = [0, 0]
    pre_existing: set[int] = set()
    params = {_storage_key(p) for p in model.parameters()}

    def pack(t: torch.Tensor) -> Any:
        if not recording[0]:
            return t
        h = _Held(t)
        held.append(weakref.ref(h))
        return h

    def unpack(h: Any) -> torch.Tensor:
        return h.tensor if isinstance(h, _Held) else h

    original_forward = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else kwargs.get("hidden_states")
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and _has_storage(t):
                pre_existing.add(_storage_key(t))
        tracker = _InputTracker({_storage_key(hidden)})
        tracker_box.append(tracker)
        seq_range[0] = _next_sequence_nr()
        recording[0] = True
        try:
            with tracker:
                return original_forward(*args, **kwargs)
        finally:
            recording[0] = False
            seq_range[1] = _next_sequence_nr()

    block.forward = forward  # type: ignore[method-assign]
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    try:
        with ExitStack() as stack:
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
            stack.enter_context(amp)
            out = model(input_ids=input_ids, use_cache=False, **(forward_kwargs or {}))
            logits = out.logits
    finally:
        del block.forward
    tracker = tracker_box[0]
    ops = _saved_by_node(logits.grad_fn, seq_range[0], seq_range[1])
    by_key: dict[int, SavedStorage] = {}
    for ref in held:
        h = ref()
        if h is None:
            continue  # its node was freed with an output nobody kept
        t = h.tensor
        key = _storage_key(t)
        if key in by_key:
            continue
        if key in params:
            kind = "parameter"
        elif tracker.depends.get(key, False):
            kind = "activation"
        elif key in tracker.created:
            kind = "weight_copy"
        elif key in pre_existing:
            kind = "shared"
        else:
            kind = "weight_copy"
        by_key[key] = SavedStorage(
            kind=kind,
            nbytes=t.untyped_storage().nbytes(),
            shape=tuple(t.shape),
            dtype=t.dtype,
            ops=ops.get(key, []),
        )
    del logits, out
    return BlockMeasurement(list(by_key.values()))


def measure_case(case: Case) -> BlockMeasurement:
    model = build_model(case)
    config = FAMILY_CONFIGS[case.family]
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    blocks = find_blocks(model, layers)
    torch.manual_seed(1)
    vocab = config["vocab_size"]
    input_ids = torch.randint(3, vocab, (BATCH, SEQ))
    _, _, _, autocast = MODES[case.mode]
    return measure_block(model, blocks[1], input_ids, autocast=autocast)


# --- llmmem's prediction -----------------------------------------------------------------------


@dataclass
class Prediction:
    bytes: int
    formula: str
    dims: dict[str, float]


def setup_for(case: Case) -> Any:
    from llmmem.budget import TrainingSetup
    from llmmem.budget.setup import LoraSetup

    precision, method, _, _ = MODES[case.mode]
    lora = None
    if method == "lora":
        lora = LoraSetup(r=LORA_RANK, targets=LORA_TARGETS.get(case.family, ["q_proj", "v_proj"]))
    return TrainingSetup(
        method=method,
        precision=precision,
        attn=case.attn,
        batch=BATCH,
        seq=SEQ,
        lora=lora,
    )


def predict_case(case: Case) -> Prediction:
    from llmmem.budget.activations import estimate_activations
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource

    spec = spec_from_config(
        dict(FAMILY_CONFIGS[case.family]), model_id=f"tiny-{case.family}", source=ModelSource.CONFIG
    )
    estimate = estimate_activations(spec, setup_for(case))
    group, tally = estimate.per_block[0]
    return Prediction(tally.evaluate(estimate.dims), tally.formula(), estimate.dims)


def tolerance(measured: int) -> float:
    return max(0.03 * measured, 512)
