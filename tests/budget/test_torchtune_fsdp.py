"""torchtune's distributed recipes (FSDP2 through `training.shard_model`): read from the config
and the `tune run` line, and sized as torchtune shards.

torchtune passes `reshard_after_forward` explicitly to the root's `fully_shard`, and torch from
2.8 honours it there: the embeddings, final norm and head are resharded as the model's forward
returns and gathered again as backward reaches the head. Measured on 2 CPU ranks over gloo
against torchtune 0.6.1's own recipes (`python bench/torchtune_steps.py --size medium`, the
`fsdp2 x2` cases: every phase within 1.8%); the sizes below are those of that bench's model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component, Phase
from llmmem.budget.setup import (
    DistributedSetup,
    Framework,
    FsdpShard,
    LoraSetup,
    LossImpl,
    Method,
    Precision,
    TrainingSetup,
)
from llmmem.extract.configs import extract_config_plan
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource

V, H, LAYERS = 16384, 1024, 4
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": V,
    "hidden_size": H,
    "intermediate_size": 3584,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
SPEC = spec_from_config(CONFIG, model_id="medium-llama3", source=ModelSource.CONFIG)
# the root unit: embeddings, head and final norm, whole, in bf16
ROOT = (2 * V * H + H) * 2
# one block gathered, in bf16: q and o (h × h), k and v (h × 256), the MLP's three, two norms
BLOCK = (2 * H * H + 2 * H * 256 + 3 * H * 3584 + 2 * H) * 2
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_over_two(framework: Framework = Framework.TORCHTUNE, torch: str = "2.13") -> TrainingSetup:
    return TrainingSetup(
        method=Method.LORA,
        lora=LoraSetup(r=8, alpha=16, targets=TARGETS),
        batch=2,
        seq=256,
        precision=Precision.BF16_TRUE,
        loss=LossImpl.CHUNKED,
        optim="adamw_torch_fused",
        framework=framework,
        torch_version=torch,
        distributed=DistributedSetup(world_size=2, fsdp=FsdpShard.FULL_SHARD),
    )


def test_the_root_is_gathered_again_in_backward_from_torch_2_8() -> None:
    budget = estimate_budget(SPEC, lora_over_two(), with_first_step=False)
    backward = budget.phase(Phase.BACKWARD)
    assert backward.moment == "head backward starts: the root unit gathered again"
    # its all-gather buffer and the parameters copied out of it, both alive
    assert backward.components[Component.TEMPORARIES].bytes == 2 * ROOT


def test_before_torch_2_8_the_root_stays_whole_through_the_loss() -> None:
    """At 2 × 1024 tokens forward peaks at the loss either way. Before 2.8 torch clamped the
    root's reshard_after_forward to False (pytorch#154704): the root is whole at the loss; in
    both the root's post-forward has freed the last block's all-gather buffer. Measured on
    2.13, the older one emulated by keeping the root whole (the bench's `root kept` cases)."""
    now = estimate_budget(SPEC, replace(lora_over_two(), seq=1024), with_first_step=False)
    old = replace(lora_over_two(torch="2.7"), seq=1024)
    before = estimate_budget(SPEC, old, with_first_step=False)
    for budget in (now, before):
        assert budget.phase(Phase.FORWARD).moment == "end of forward, loss computed"
    forward_now, forward_before = now.phase(Phase.FORWARD), before.phase(Phase.FORWARD)
    assert forward_before.allocated_bytes - forward_now.allocated_bytes == ROOT
    assert Component.TEMPORARIES not in forward_now.components  # nothing gathered
    kept = forward_before.components[Component.TEMPORARIES].bytes
    assert kept == ROOT  # the root alone
    assert "gathered again" in now.phase(Phase.BACKWARD).moment
    assert "gathered again" not in before.phase(Phase.BACKWARD).moment


def test_forward_starts_with_the_root_and_the_first_block_gathered() -> None:
    """Under checkpointing forward peaks as it starts: the root's all-gather buffer and the
    parameters copied out of it, and the first block's, all alive (the bench's `lora ckpt
    fsdp2 x2`: 267.87 MiB measured at the first layer's call, transformer.py:635)."""
    budget = estimate_budget(SPEC, replace(lora_over_two(), grad_ckpt=True), with_first_step=False)
    forward = budget.phase(Phase.FORWARD)
    assert forward.moment == "start of forward: the root unit and the first block gathered"
    # the blocks' frozen weights (the adapters, 0.3 MiB a block, are not counted gathered)
    assert forward.components[Component.TEMPORARIES].bytes == 2 * ROOT + 2 * BLOCK


def test_the_hf_trainers_fsdp_keeps_the_root_whole() -> None:
    """accelerate leaves the root's reshard_after_forward to torch, which keeps it whole."""
    hf = estimate_budget(SPEC, lora_over_two(Framework.HF), with_first_step=False)
    assert "gathered again" not in hf.phase(Phase.BACKWARD).moment


DISTRIBUTED = """\
model:
  _component_: torchtune.models.llama3_1.lora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj']
  lora_rank: 8
batch_size: 2
tokenizer:
  max_seq_len: 1024
dtype: bf16
"""


@pytest.mark.parametrize(
    ("keys", "sharding", "offload"),
    [
        ("fsdp_cpu_offload: False\n", "full_shard", False),
        ("fsdp_reshard_after_forward: False\n", "shard_grad_op", None),
        ("fsdp_cpu_offload: True\nfsdp_reshard_after_forward: True\n", "full_shard", True),
        ("custom_sharded_layers: ['tok_embeddings', 'output']\n", "full_shard", None),
        ("", None, None),
    ],
)
def test_a_distributed_recipes_keys_shard_with_fsdp2(
    tmp_path: Path, keys: str, sharding: str | None, offload: bool | None
) -> None:
    path = tmp_path / "8B_lora.yaml"
    path.write_text(DISTRIBUTED + keys)
    plan = extract_config_plan(path)
    assert plan.distributed.fsdp.value == sharding
    if offload is not None:
        assert plan.distributed.offload_params.value is offload
        assert plan.distributed.offload_optimizer.value is offload


def test_tune_run_of_a_distributed_recipe_is_sized_per_fsdp2_rank(tmp_path: Path) -> None:
    (tmp_path / "8B_lora.yaml").write_text(DISTRIBUTED)
    script = tmp_path / "train.sh"
    line = "tune run --nproc_per_node 4 lora_finetune_distributed --config 8B_lora.yaml"
    script.write_text(line + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(script)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    assert "FSDP full_shard over 4 of 4 devices" in done.stdout
    assert "the root unit gathered again" in done.stdout
    script.write_text(line + " fsdp_reshard_after_forward=False\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(script)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert "FSDP shard_grad_op over 4 of 4 devices" in done.stdout


def test_embeddings_and_head_as_units_of_their_own_leave_the_blocks_backward() -> None:
    """`custom_sharded_layers: ['tok_embeddings', 'output']` (torchtune's 8B_full.yaml): the
    head is gathered again for its own backward only and the embeddings at the very end, so the
    head's backward holds the root without the embeddings (measured: the `full fsdp2 x2 own
    units` case, +8.3% in backward while sized with the root unit, +2.2% now)."""
    full = replace(lora_over_two(), method=Method.FULL, lora=None)
    split = replace(
        full,
        distributed=replace(full.distributed, fsdp_own_units=("embeddings", "head")),
    )
    whole = estimate_budget(SPEC, full, with_first_step=False).phase(Phase.BACKWARD)
    apart = estimate_budget(SPEC, split, with_first_step=False).phase(Phase.BACKWARD)
    assert (
        whole.moment
        == apart.moment
        == ("head backward: logits gradient and the head's weight gradient")
    )
    embeddings = V * H * 2
    assert whole.allocated_bytes - apart.allocated_bytes == embeddings


def test_custom_sharded_layers_are_read_as_units_and_others_are_said(tmp_path: Path) -> None:
    import json

    path = tmp_path / "8B_full.yaml"
    path.write_text(
        "# llmmem: world_size=4\n"
        + DISTRIBUTED.replace("lora_llama3_1_8b", "llama3_1_8b")
        + "custom_sharded_layers: ['tok_embeddings', 'output']\n"
    )

    def explained() -> dict:  # type: ignore[type-arg]
        done = subprocess.run(
            [sys.executable, "-m", "llmmem", "explain", str(path), "--format", "json"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ},
        )
        return json.loads(done.stdout)["budget"]  # type: ignore[no-any-return]

    apart = explained()
    assert not any("custom_sharded_layers" in note for note in apart["notes"])
    path.write_text(path.read_text().replace("custom_sharded_layers", "fsdp_cpu_offload: False\n#"))
    whole = explained()
    assert whole["allocated_peak_bytes"] > apart["allocated_peak_bytes"]
    path.write_text(path.read_text() + "custom_sharded_layers: ['norm']\n")
    said = [n for n in explained()["notes"] if n.startswith("custom_sharded_layers")]
    assert said and "['norm']" in said[0]
