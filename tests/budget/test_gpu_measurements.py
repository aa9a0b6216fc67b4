"""The core against real CUDA steps: the runs under bench/gpu/ (H100 80GB HBM3, driver 580.159,
torch 2.11.0+cu130, transformers 5.24.0, peft 0.21.2, bitsandbytes 0.50.2; made by
`bench/gpu_run.sh`). Each case is predicted again with today's core from the case's setup."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from llmmem.verify.grid import measured_cases, predict_case

RUNS = Path(__file__).resolve().parents[2] / "bench" / "gpu"
MIB = 2**20


def _all_cases(expandable_segments: bool = False) -> list[dict[str, Any]]:
    """The cases run with the default allocator settings, or those with expandable segments."""
    paths = [
        path
        for path in sorted(RUNS.glob("*/grid-*.json"))
        if ("expandable" in path.stem) == expandable_segments
    ]
    out = []
    for _, case, config, measurement in measured_cases(paths):
        out.append(
            {
                "case": case,
                "config": config,
                "measured": measurement,
                "predicted": predict_case(case, config, case.model or case.family),
            }
        )
    return out


def _one_sample(case: Any) -> bool:
    """A flat packed row of one sample: the runner of 2026-11-26 gave such a row positions
    that do not restart (fixed since), so it trained unpacked, with no mask."""
    return case.packing == "flat" and case.batch == 1


def _cases(expandable_segments: bool = False) -> list[dict[str, Any]]:
    """The steps whose estimate is the step itself: not offloading or torch.compile (whose
    estimate is the top of a band), nor a packed row of one sample."""
    return [c for c in _all_cases(expandable_segments) if c["case"].measures_the_estimate]


ALL = _all_cases()
CASES = _cases()


def _allocated(item: dict[str, Any], key: str = "allocated_peak_bytes") -> int:
    """A predicted allocated figure as a GPU's max_memory_allocated shows it: with the cuBLAS
    workspaces."""
    totals = item["predicted"]["totals"]
    workspaces = totals["overheads"]["cublas_workspaces"]["bytes"]
    figure = totals["floor"]["allocated_peak_bytes"] if key == "floor" else totals[key]
    return int(figure) + workspaces


def test_the_runs_cover_lora_qlora_and_full_fine_tuning() -> None:
    methods = {c["case"].method for c in CASES}
    assert methods == {"full", "lora", "qlora"}
    assert len(CASES) >= 50
    assert all(c["measured"]["device_name"].startswith("NVIDIA H100") for c in CASES)


@pytest.mark.parametrize("item", CASES, ids=lambda c: c["case"].name)
def test_every_phase_allocated_on_the_gpu_is_predicted_within_2_percent(
    item: dict[str, Any],
) -> None:
    """max_memory_allocated per phase, which on a GPU holds the cuBLAS workspaces as well."""
    predicted = item["predicted"]
    workspaces = predicted["totals"]["overheads"]["cublas_workspaces"]["bytes"]
    for phase in item["measured"]["phases"]:
        want = predicted["phases"][phase["phase"]] + workspaces
        assert abs(want - phase["peak_bytes"]) / phase["peak_bytes"] < 0.02, phase["phase"]


def test_the_cublas_workspaces_are_what_a_gpu_step_allocates_beyond_its_tensors() -> None:
    """The optimizer step of a LoRA run (no large temporaries there) reads 64–72 MiB above the
    core's tensors in most cases: two 32 MiB workspaces (forward's thread, autograd's backward
    thread). Never less; Qwen2.5-7B reads 108 MiB and Qwen2.5-3B 163–174 MiB, which the
    workspaces do not explain (kept visible in the README)."""
    beyond = [
        (
            next(p for p in c["measured"]["phases"] if p["phase"] == "optimizer_step")["peak_bytes"]
            - c["predicted"]["phases"]["optimizer_step"]
        )
        / MIB
        for c in CASES
        if c["case"].method == "lora"
    ]
    assert all(60 < b < 180 for b in beyond), beyond
    assert 62 < statistics.median(beyond) < 74
    assert sum(b < 75 for b in beyond) >= 0.75 * len(beyond)


def test_the_context_is_what_nvml_shows_beyond_the_reserved_memory() -> None:
    context = [
        (c["measured"]["device_used_peak_bytes"] - c["measured"]["reserved_peak_bytes"]) / MIB
        for c in CASES
    ]
    predicted = CASES[0]["predicted"]["totals"]["overheads"]["cuda_context"]["bytes"] / MIB
    assert all(abs(got - predicted) < 30 for got in context), (predicted, context)


def test_a_16_bit_head_leaves_its_logits_block_reserved_at_the_start_of_backward() -> None:
    """At 4,096 tokens the 16-bit logits (e·N·V: 1.16 GiB for Qwen2.5's 152k vocabulary, 0.98
    GiB for Llama-3.2's 128k) are freed when the fp32 copy is made; the fp32 tensors that follow
    do not fit in their block, so the reserved peak is at least that much above the allocated."""
    large = [
        c
        for c in CASES
        if c["case"].batch * c["case"].seq == 4096
        and c["case"].method in ("lora", "qlora")
        and c["case"].attn == "sdpa"
    ]
    assert len(large) >= 12
    for c in large:
        logits_16 = 2 * 4096 * c["config"]["vocab_size"]
        measured = c["measured"]
        slack = measured["reserved_peak_bytes"] - measured["allocated_peak_bytes"]
        assert slack >= 0.9 * logits_16, c["case"].name


def test_reserved_and_device_totals_agree_with_the_gpu() -> None:
    """The allocator's reserved peak and NVML's figure, over every case with the default
    allocator: the median within 3%, four in five within 5%."""
    for key, predicted_key in (
        ("reserved_peak_bytes", "reserved_peak_bytes"),
        ("device_used_peak_bytes", "device_total_bytes"),
    ):
        errors = [
            abs(c["predicted"]["totals"][predicted_key] - c["measured"][key]) / c["measured"][key]
            for c in CASES
        ]
        assert statistics.median(errors) < 0.03, key
        assert sum(e <= 0.05 for e in errors) >= 0.75 * len(errors), key


def test_expandable_segments_shrink_what_the_allocator_holds_beyond_the_allocated() -> None:
    """The same full fine-tuning cases with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True:
    the slack the core adds is an upper bound there (the advice its note gives)."""
    default = {c["case"].name: c["measured"] for c in CASES if c["case"].method == "full"}
    expandable = {c["case"].name: c["measured"] for c in _cases(expandable_segments=True)}
    shrunk = [
        name
        for name, m in default.items()
        if name in expandable
        and expandable[name]["reserved_peak_bytes"] <= m["reserved_peak_bytes"]
    ]
    assert len(shrunk) >= 6


def test_packed_samples_on_a_gpu_keep_their_mask_and_repeated_heads() -> None:
    """Packed rows under SDPA (Qwen2.5-0.5B and Llama-3.2-1B LoRA, 2 × 2048 tokens, flat and two
    samples per row): transformers gives SDPA a block-diagonal mask, which SDPA keeps per
    layer, and repeats K and V to every query head (no `enable_gqa` with a mask), whose copies
    SDPA keeps too. Without the repeated heads the core read 2.4–3.1% low; with them, each
    phase is within 0.5%."""
    packed = [c for c in CASES if c["case"].packing]
    assert len(packed) == 8
    for c in packed:
        for phase in c["measured"]["phases"]:
            want = (
                c["predicted"]["phases"][phase["phase"]]
                + (c["predicted"]["totals"]["overheads"]["cublas_workspaces"]["bytes"])
            )
            assert abs(want - phase["peak_bytes"]) / phase["peak_bytes"] < 0.01, (
                c["case"].name,
                phase["phase"],
            )


def test_a_flat_row_of_one_sample_trained_unpacked() -> None:
    """The held-out packed cases at 1 × 4096 were one sample per row: nothing to mask. The
    core reads them within 0.5% as unpacked steps, and 7–8% high as packed ones."""
    from dataclasses import replace

    from llmmem.verify.grid import predict_case

    single = [c for c in ALL if _one_sample(c["case"])]
    assert len(single) == 4
    for c in single:
        unpacked = predict_case(replace(c["case"], packing=None), c["config"], c["case"].model)
        workspaces = unpacked["totals"]["overheads"]["cublas_workspaces"]["bytes"]
        want = unpacked["totals"]["allocated_peak_bytes"] + workspaces
        got = c["measured"]["allocated_peak_bytes"]
        assert abs(want - got) / got < 0.005, c["case"].name
        if not c["case"].grad_ckpt:
            assert _allocated(c) > 1.05 * got


def _offloaded(mode: str) -> list[dict[str, Any]]:
    return [c for c in ALL if c["case"].offload and c["case"].offload_mode == mode]


def test_the_offloading_floor_is_a_step_with_every_saved_tensor_on_the_host() -> None:
    """Steps whose hooks move every tensor TRL's rules let go (LoRA, Qwen2.5-0.5B/1.5B and
    Llama-3.2-1B, with and without checkpointing) allocate what the band's floor says, within
    1%."""
    every = _offloaded("all")
    assert len(every) == 6
    for c in every:
        floor = _allocated(c, "floor")
        got = c["measured"]["allocated_peak_bytes"]
        assert abs(floor - got) / got < 0.01, c["case"].name


def test_trl_s_own_offloading_lands_inside_the_band() -> None:
    """TRL 0.29.1's OffloadActivations keeps more on the GPU than its rules alone would (its
    deduplication keys on data pointers, which the caching allocator hands out again): between
    the floor and the estimate, at 0.39–0.42 of the way up without checkpointing."""
    trl = _offloaded("trl")
    assert len(trl) == 6
    for c in trl:
        floor, top = _allocated(c, "floor"), _allocated(c)
        got = c["measured"]["allocated_peak_bytes"]
        assert floor <= got <= top, c["case"].name
        if not c["case"].grad_ckpt:
            assert 0.3 < (got - floor) / (top - floor) < 0.5, c["case"].name


def test_a_compiled_step_fuses_its_loss_and_lands_inside_the_band() -> None:
    """torch.compile of the whole LoRA model (torch 2.11, default mode): the loss is fused, so
    the checkpointed compiled step is the estimate within 1.5%; without checkpointing the
    blocks save less than in eager mode, and the step lands inside the band."""
    compiled = [c for c in ALL if c["case"].compile and c["case"].method == "lora"]
    assert len(compiled) == 5
    for c in compiled:
        got = c["measured"]["allocated_peak_bytes"]
        floor, top = _allocated(c, "floor"), _allocated(c)
        if c["case"].grad_ckpt:
            assert abs(top - got) / got < 0.015, c["case"].name
        else:
            assert floor <= got <= top, c["case"].name


def test_compiled_full_fine_tuning_is_read_within_2_percent_at_its_peak() -> None:
    """Full fine-tuning of Llama-3.2-1B compiled (1 × 2048): the AdamW step is the measured
    peak; the estimate's peak is within 2% of it (without checkpointing the estimate's peak is
    backward's, with the eager blocks). Not modelled: the compiled backward holds about 2 GiB
    beyond the gradients at its end, with and without checkpointing (8.8% above the estimate
    of that phase under checkpointing; still below the optimizer step)."""
    full = [c for c in ALL if c["case"].compile and c["case"].method == "full"]
    assert len(full) == 2
    for c in full:
        got = c["measured"]["allocated_peak_bytes"]
        peak = max(c["measured"]["phases"], key=lambda p: p["peak_bytes"])
        assert peak["phase"] == "optimizer_step"
        assert abs(_allocated(c) - got) / got < 0.02, c["case"].name
