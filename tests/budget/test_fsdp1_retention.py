"""FSDP1 keeps finished blocks' checkpoint inputs and their gradients until backward ends.

The budget's rule (`phases._fsdp1_retained_inputs`) rests on a mechanism in torch's FSDP1: a
block that is an FSDP unit of frozen parameters only registers a multi-grad hook on its input
in pre-forward (torch >= 2.1 `_register_post_backward_reshard_only_hook`). Under reentrant
checkpointing around the unit (transformers 4.x `gradient_checkpointing_enable` over a PEFT
model the HF Trainer wraps with peft's `fsdp_auto_wrap_policy`) the recompute runs that
pre-forward on a detached input, and the hook keeps it, with the gradient the checkpoint gives
it, until FSDP finalizes at the end of backward. Here it runs for real: FSDP1 on the CPU over
gloo (one rank), torch 2.13.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.setup import DistributedSetup, FsdpShard, LoraSetup, Method, TrainingSetup
from llmmem.models.architectures import spec_from_config
from llmmem.models.catalog import catalog_entry
from llmmem.models.spec import ModelSource, ModelSpec

BLOCKS = 5

PROBE = textwrap.dedent(
    """
    import functools, json, os, sys, weakref
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.utils.checkpoint import checkpoint

    wrap, reentrant = sys.argv[1] == "fsdp", sys.argv[2] == "reentrant"
    dist.init_process_group("gloo", rank=0, world_size=1)
    width, blocks = 32, int(sys.argv[3])
    inputs = []

    class Adapter(nn.Module):  # trainable: its own unit, as peft's policy makes it
        def __init__(self):
            super().__init__()
            self.down = nn.Linear(width, 2, bias=False)
            self.up = nn.Linear(2, width, bias=False)

        def forward(self, x):
            return self.up(self.down(x))

    class Block(nn.Module):  # the frozen layer around it
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(width, width).requires_grad_(False)
            self.adapter = Adapter()

        def forward(self, x):
            if torch.is_grad_enabled():
                inputs.append(weakref.ref(x))
            return x + torch.tanh(self.proj(x) + self.adapter(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(width, width).requires_grad_(False)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x):
            h = self.embed(x).requires_grad_(True)  # enable_input_require_grads
            outs = []
            for block in self.blocks:  # the checkpoint wraps the unit, as transformers 4.x
                h = checkpoint(block.__call__, h, use_reentrant=reentrant)
                outs.append(h)
            return h.square().mean(), outs[0]

    model = Model()
    if wrap:
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block, Adapter}),
                     device_id=torch.device("cpu"))
    seen = {}
    for step in range(2):
        inputs.clear()
        loss, first = model(torch.randn(4, width))

        def probe(grad):  # the first block's backward starts: every other block is done
            alive = [ref() for ref in inputs if ref() is not None]
            seen["alive"] = sum(t.grad is not None for t in alive)

        first.register_hook(probe)
        loss.backward()
        seen["after"] = sum(ref() is not None for ref in inputs)
    print(json.dumps(seen))
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _probe(wrap: str, reentrant: str) -> dict[str, int]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, wrap, reentrant, str(BLOCKS)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fsdp1_keeps_finished_blocks_inputs_with_their_gradients() -> None:
    seen = _probe("fsdp", "reentrant")
    # at the first block's backward, the other blocks' inputs and gradients are all alive
    assert seen["alive"] == BLOCKS - 1
    assert seen["after"] == 0  # released when FSDP finalizes


@pytest.mark.parametrize(("wrap", "reentrant"), [("plain", "reentrant"), ("fsdp", "non")])
def test_without_fsdp1_or_with_non_reentrant_checkpointing_nothing_waits(
    wrap: str, reentrant: str
) -> None:
    assert _probe(wrap, reentrant)["alive"] == 0


def _setup(**overrides: object) -> TrainingSetup:
    base: dict[str, object] = {
        "method": Method.LORA,
        "lora": LoraSetup(r=16, alpha=16, targets=["q_proj", "v_proj"]),
        "batch": 2,
        "seq": 4096,
        "grad_ckpt": True,
        "precision": "bf16-true",
        "distributed": DistributedSetup(world_size=2, fsdp=FsdpShard.FULL_SHARD),
        "transformers_version": "4.48",
    }
    base.update(overrides)
    return TrainingSetup(**base)  # type: ignore[arg-type]


def _mistral() -> ModelSpec:
    entry = catalog_entry("mistralai/Mistral-7B-v0.1")
    assert entry is not None
    return spec_from_config(entry.config, model_id=entry.model_id, source=ModelSource.CATALOG)


def _backward(setup: TrainingSetup) -> tuple[int, str]:
    """The backward peak and what its temporaries hold, as the report shows them."""
    budget = estimate_budget(_mistral(), setup, with_first_step=False)
    phase = next(p for p in budget.phases if p.phase.value == "backward")
    temporaries = next((t for c, t in phase.components.items() if c.value == "temporaries"), None)
    return phase.allocated_bytes, temporaries.formula if temporaries is not None else ""


def test_the_budget_adds_the_kept_gradients_where_the_mechanism_holds() -> None:
    spec = _mistral()
    blocks = spec.num_layers
    kept_text = f"{blocks - 1} finished blocks' input gradients kept by FSDP1's hooks"
    peak, text = _backward(_setup())
    assert kept_text in text
    for other in (
        _setup(transformers_version="5.24"),  # non-reentrant by default, FSDP2
        _setup(framework="plain"),  # a loop of the script's own
        _setup(reentrant_checkpointing=False),  # use_reentrant=False written
        _setup(grad_ckpt=False),
    ):
        other_peak, other_text = _backward(other)
        assert kept_text not in other_text
        if other.grad_ckpt:
            assert other_peak < peak
    # the amount: one bf16 hidden-state gradient per finished block
    kept = (blocks - 1) * 2 * 2 * 4096 * spec.hidden_size
    without, _ = _backward(_setup(reentrant_checkpointing=False))
    assert peak - without <= kept
    assert peak - without >= 0.5 * kept


def test_trl_asks_for_non_reentrant_checkpointing_from_0_28() -> None:
    from llmmem.budget.trl_rules import sft_trainer_checkpointing

    old, note = sft_trainer_checkpointing(_setup(), "0.27.0")
    assert old.checkpoints_reentrant and note is None
    new, note = sft_trainer_checkpointing(_setup(), "0.28.0")
    assert not new.checkpoints_reentrant and note is not None
    # a script's own use_reentrant wins
    mine, _ = sft_trainer_checkpointing(_setup(reentrant_checkpointing=True), "0.29.1")
    assert mine.checkpoints_reentrant


def test_a_script_that_writes_use_reentrant_is_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from llmmem.extract import extract_plan
    from llmmem.scenario import setup_from_plan

    script = tmp_path / "train.py"
    script.write_text(
        "from trl import SFTConfig, SFTTrainer\n"
        "args = SFTConfig(output_dir='o', max_length=1024, gradient_checkpointing=True,\n"
        "                 gradient_checkpointing_kwargs={'use_reentrant': True})\n"
        "SFTTrainer(model='mistralai/Mistral-7B-v0.1', args=args, train_dataset=None)\n",
        encoding="utf-8",
    )
    setup = setup_from_plan(extract_plan(script), _mistral())
    assert setup.reentrant_checkpointing is True
