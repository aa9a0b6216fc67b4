"""What the grid and the runner do with settings that are measured on a GPU only (TRL's own
offloading hooks, torch.compile), and the packed batch they build: checked on the CPU, so that
a GPU session's run does not find them broken."""

from __future__ import annotations

import pytest
import torch

from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.building import _batch
from llmmem.verify.compare import request_for
from llmmem.verify.grid import GridCase, config_for, main, setup_for
from llmmem.verify.runner import run_step


def _request(case: GridCase, device: str = "cpu"):  # type: ignore[no-untyped-def]
    config = config_for(case.family, "small")
    spec = spec_from_config(config, model_id="grid", source=ModelSource.LOCAL)
    return request_for(spec, setup_for(case), config, device)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_flat_packed_row_always_holds_several_samples(batch: int) -> None:
    """Flat packing puts the micro-batch's samples in one row, their positions restarting at
    each; a micro-batch of one sample is cut in two halves, or it would pack nothing (and
    transformers would build no mask)."""
    request = _request(GridCase("llama", "lora", False, batch, 64, "bf16", packing="flat"))
    made = _batch(torch, request, "cpu", 1000)
    positions = made["position_ids"][0]
    assert made["input_ids"].shape == (1, batch * 64)
    starts = int((positions == 0).sum())
    assert starts == max(batch, 2)


def test_torch_compile_is_refused_off_the_gpu_with_a_reason() -> None:
    request = _request(GridCase("llama", "lora", False, 1, 32, "bf16-true"))
    request.compile = True
    measured = run_step(request)
    assert measured.error is not None
    assert "--device cuda" in measured.error
    assert not measured.phases


def test_trl_s_own_offloading_hooks_are_refused_on_the_cpu() -> None:
    request = _request(GridCase("llama", "lora", False, 1, 32, "bf16-true", offload=True))
    request.activation_offload = "trl"
    measured = run_step(request)
    assert measured.error is not None
    assert "accelerator" in measured.error and "--device cuda" in measured.error


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--compile", "--model", "Qwen/Qwen2.5-0.5B"], "--compile needs --device cuda"),
        (["--packed", "flat"], "go with --model"),
        (["--offload", "trl", "--family", "llama"], "go with --model"),
    ],
)
def test_the_grid_says_what_its_gpu_settings_need(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
