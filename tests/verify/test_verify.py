"""`llmmem verify`: real CPU steps, simulated steps, the comparison with the core, and bad input.

Expected numbers are derived by hand from the config (parameter counts × bytes), or come from a
second, independent way of running the same step (a real CPU step for the simulated one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Component
from llmmem.budget.setup import (
    DistributedSetup,
    FsdpShard,
    LoraSetup,
    Method,
    Precision,
    TrainingSetup,
)
from llmmem.models.architectures import spec_from_config
from llmmem.models.spec import ModelSource
from llmmem.verify.compare import request_for, summary
from llmmem.verify.grid import SMALL_CONFIGS, SMALL_SHAPES, cases, config_for, run_case
from llmmem.verify.request import StepMeasurement, StepRequest
from llmmem.verify.runner import run_step

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
TINY = dict(SMALL_CONFIGS["llama"])


def tiny_request(device: str, **changes: object) -> StepRequest:
    fields: dict[str, object] = {
        "model_id": "tiny-llama",
        "architecture": "LlamaForCausalLM",
        "config": TINY,
        "batch": 2,
        "seq": 64,
        "precision": "bf16-true",
        "optim": "adamw_torch",
        "device": device,
    }
    fields.update(changes)
    return StepRequest(**fields)  # type: ignore[arg-type]


def params_of(config: dict[str, object]) -> int:
    """Llama parameter count by hand: embeddings, head, per layer q k v o + MLP + 2 norms."""
    h, i, layers, v = (
        int(config[k])
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )  # type: ignore[call-overload]
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])  # type: ignore[call-overload]
    head_dim = h // heads
    attention = h * h * 2 + 2 * h * kv_heads * head_dim
    per_layer = attention + 3 * h * i + 2 * h
    return 2 * v * h + layers * per_layer + h


def persistent_of(config: dict[str, object], threshold: int) -> int:
    """The Llama parameters of at most `threshold` elements, by hand (ZeRO-3 keeps them whole)."""
    h, i, layers, v = (
        int(config[k])
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
    )  # type: ignore[call-overload]
    kvd = int(config["num_key_value_heads"]) * h // int(config["num_attention_heads"])  # type: ignore[call-overload]
    per_layer = [h * h, h * kvd, h * kvd, h * h, h * i, h * i, h * i, h, h]
    small = sum(n for n in per_layer if n <= threshold) * layers
    return small + sum(n for n in (v * h, v * h, h) if n <= threshold)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"precision": "bf16", "grad_ckpt": True},
        {"lora": {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}, "precision": "bf16"},
    ],
    ids=["bf16-true", "amp-ckpt", "lora-amp"],
)
def test_a_simulated_step_measures_what_a_real_cpu_step_does(changes: dict[str, object]) -> None:
    simulated = run_step(tiny_request("fake", **changes))
    real = run_step(tiny_request("cpu", **changes))
    assert simulated.error is None and real.error is None, (simulated.error, real.error)
    assert simulated.device_name.startswith("simulated") and real.device_name == "cpu"
    for phase in ("forward", "backward", "optimizer_step"):
        fake_phase, cpu_phase = simulated.phase(phase), real.phase(phase)
        assert fake_phase is not None and cpu_phase is not None
        assert abs(fake_phase.peak_bytes - cpu_phase.peak_bytes) <= 1024, phase
    assert simulated.weights_bytes == real.weights_bytes


def test_measured_model_states_are_the_hand_counts() -> None:
    measured = run_step(tiny_request("fake"))
    params = params_of(TINY)
    assert measured.weights_bytes == 2 * params  # bf16 weights
    assert measured.gradients_bytes == 2 * params  # bf16 gradients
    # AdamW: exp_avg and exp_avg_sq in the parameter dtype, plus a 4-byte `step` per tensor
    layers = int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    tensors = 3 + layers * (4 + 3 + 2)  # embed, head, final norm; q k v o, mlp, 2 norms
    assert measured.optimizer_state_bytes == 2 * 2 * params + 4 * tensors


def test_lora_trains_only_the_adapters() -> None:
    lora = {"r": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}
    measured = run_step(tiny_request("fake", lora=lora, precision="bf16-true"))
    h = int(TINY["hidden_size"])  # type: ignore[call-overload]
    kv = int(TINY["num_key_value_heads"]) * h // int(TINY["num_attention_heads"])  # type: ignore[call-overload]
    layers = int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    adapters = layers * 8 * ((h + h) + (h + kv))  # A: r×in, B: out×r for q and v
    assert measured.gradients_bytes == 4 * adapters  # PEFT keeps adapters in fp32


@pytest.mark.parametrize(
    "case", cases(list(SMALL_CONFIGS), SMALL_SHAPES), ids=lambda case: case.name
)
def test_the_core_agrees_with_the_simulator(case) -> None:  # type: ignore[no-untyped-def]
    """The allocated peak of the step, formula against simulation, within 5% (issue grid)."""
    result = run_case(case, config_for(case.family, "small"), case.family)
    assert result.error is None, result.error
    assert abs(result.peak_error) <= 0.05, (result.predicted, result.simulated)


@pytest.mark.parametrize(
    "case", cases(list(SMALL_CONFIGS), SMALL_SHAPES, fsdp_ranks=4), ids=lambda case: case.name
)
def test_the_core_agrees_with_a_simulated_fsdp_rank(case) -> None:  # type: ignore[no-untyped-def]
    """FSDP full_shard over 4 ranks, rank 0 simulated alone: every phase within 5%, also at
    1×128 tokens, where the gathered blocks, the root unit and their whole gradients outweigh
    the activations and the moment of backward that peaks is a different one."""
    result = run_case(case, config_for(case.family, "small"), case.family)
    assert result.error is None, result.error
    assert result.worst <= 0.05, (result.predicted, result.simulated)


@pytest.mark.parametrize(
    "case", cases(["mixtral"], SMALL_SHAPES, fsdp_ranks=8), ids=lambda case: case.name
)
def test_experts_fewer_than_the_ranks_are_padded(case) -> None:  # type: ignore[no-untyped-def]
    """4 experts over 8 ranks: FSDP2 gives every rank one expert of each (4, out, in) tensor
    (padding), a quarter where an even split would give an eighth: every phase within 5%."""
    result = run_case(case, config_for(case.family, "small"), case.family)
    assert result.error is None, result.error
    assert result.worst <= 0.05, (result.predicted, result.simulated)


def test_a_padded_rank_holds_the_hand_count() -> None:
    config = config_for("mixtral", "small")
    h, i, v, layers = 256, 512, 4096, 2  # SMALL_CONFIGS["mixtral"]
    assert (config["hidden_size"], config["intermediate_size"]) == (h, i)
    assert (config["vocab_size"], config["num_hidden_layers"]) == (v, layers)
    assert (config["num_local_experts"], config["num_key_value_heads"]) == (4, 2)
    # each parameter split along its first dimension into ceil(rows / 8) rows per rank
    kvd = 2 * h // 4
    attention = 2 * (h // 8) * h + 2 * (kvd // 8) * h  # q, o; k, v
    router = 1 * h  # (4, h): one row per rank
    experts = 1 * (2 * i) * h + 1 * h * i  # gate_up (4, 2I, h), down (4, h, I): one expert
    norms = 2 * (h // 8)
    per_rank = 2 * (v // 8) * h + h // 8 + layers * (attention + router + experts + norms)
    spec = spec_from_config(config, model_id="tiny-mixtral", source=ModelSource.LOCAL)
    setup = TrainingSetup(
        batch=1,
        seq=128,
        precision=Precision.BF16_TRUE,
        optim="adamw_torch",
        distributed=DistributedSetup(world_size=8, fsdp=FsdpShard.FULL_SHARD),
    )
    measured = run_step(request_for(spec, setup, config, "fake"))
    assert measured.error is None, measured.error
    assert measured.weights_bytes == 2 * per_rank
    predicted = estimate_budget(spec, setup, None).phases[0].components[Component.WEIGHTS]
    assert predicted.bytes == 2 * per_rank
    assert "padding" in predicted.formula


DEEPER = [
    case
    for family in ("llama", "mixtral")
    for case in cases([family], SMALL_SHAPES[1:], fsdp_ranks=4)
    if case.method == "full" and case.precision == "bf16-true"
]


@pytest.mark.parametrize("case", DEEPER, ids=lambda case: case.name)
def test_a_deeper_fsdp_model_agrees_with_a_simulated_rank(case) -> None:  # type: ignore[no-untyped-def]
    """Four blocks instead of two: blocks that run with one gathered before and one prefetched
    after them, and a backward that goes through middle blocks: every phase within 5%."""
    config = {**config_for(case.family, "small"), "num_hidden_layers": 4}
    result = run_case(case, config, case.family)
    assert result.error is None, result.error
    assert result.worst <= 0.05, (result.predicted, result.simulated)


PADDED_DEEPER = [
    case for case in cases(["mixtral"], SMALL_SHAPES, fsdp_ranks=8) if case.method == "full"
]


@pytest.mark.parametrize("case", PADDED_DEEPER, ids=lambda case: case.name)
def test_a_deeper_padded_moe_agrees_with_a_simulated_rank(case) -> None:  # type: ignore[no-untyped-def]
    """Six blocks of padded experts over 8 ranks: going down the stack every block leaves a
    large gradient shard, so backward peaks at the second block, with the block before
    prefetched and the reduce-scatter input of the block after held: every phase within 5%."""
    config = {**config_for(case.family, "small"), "num_hidden_layers": 6}
    result = run_case(case, config, case.family)
    assert result.error is None, result.error
    assert result.worst <= 0.05, (result.predicted, result.simulated)


def test_an_oom_is_reported_as_a_result() -> None:
    spec = spec_from_config(TINY, model_id="tiny", source=ModelSource.LOCAL)
    budget = estimate_budget(spec, TrainingSetup(batch=2, seq=64), None)
    measured = StepMeasurement(
        device="cuda",
        device_name="NVIDIA A100-SXM4-80GB",
        oom={
            "phase": "backward",
            "allocated_bytes": int(79.1 * 2**30),
            "message": "CUDA out of memory",
        },
    )
    text = summary(budget, measured)
    assert text.startswith("OOM in backward at 79.1 GiB; predicted ")


def test_request_carries_the_setup_the_core_saw() -> None:
    spec = spec_from_config(SMALL_CONFIGS["gemma2"], model_id="g", source=ModelSource.LOCAL)
    setup = TrainingSetup(
        method=Method.LORA,
        lora=LoraSetup(r=4, targets=["q_proj"], dora=True),
        precision=Precision.BF16,
        grad_ckpt=True,
        batch=3,
        seq=100,
    )
    request = request_for(spec, setup, SMALL_CONFIGS["gemma2"], "fake")
    assert request.attn == "eager"  # gemma-2 trains eager: transformers refuses SDPA for it
    assert request.lora == {
        "r": 4,
        "alpha": 32.0,
        "targets": ["q_proj"],
        "modules_to_save": [],
        "dora": True,
        "dropout": 0.0,
        "adapter_bytes": 4,  # PEFT's fp32 adapters
    }
    assert (request.batch, request.seq, request.precision, request.grad_ckpt) == (
        3,
        100,
        "bf16",
        True,
    )


# -- the command ----------------------------------------------------------------------------

SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=2,
    gradient_checkpointing=True,
    bf16=True,
    optim="adamw_torch",
)
# llmmem: seq=256
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**TINY, "torch_dtype": "bfloat16"}))
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def verify(
    project: Path,
    *args: str,
    timeout: int = 300,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", "verify", "train.py", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
        stdin=subprocess.DEVNULL,
        preexec_fn=preexec_fn,
    )


@pytest.mark.parametrize("where", [["--device", "cpu"], ["--simulate"]])
def test_verify_command_measures_and_compares(project: Path, where: list[str]) -> None:
    proc = verify(project, *where, "--format", "json", "--output", "report.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert json.loads((project / "report.json").read_text()) == report
    rows = {row["what"]: row for row in report["comparison"]}
    assert set(rows) >= {"forward peak", "backward peak", "optimizer step peak", "weights"}
    assert rows["weights"]["measured_bytes"] == 2 * params_of(TINY)
    measured = report["measurement"]
    assert measured["stage"] == "done"
    assert rows["allocated peak"]["measured_bytes"] == measured["allocated_peak_bytes"]
    assert abs(rows["allocated peak"]["error"]) < 0.05
    # without a GPU: the context stays an estimate; the allocator's reserved peak is the step's
    # own allocations replayed through the caching allocator's rules
    not_seen = {row["what"] for row in report["not_seen"]}
    assert "cuda context" in not_seen and "allocator slack" not in not_seen
    assert rows["reserved peak"]["measured_bytes"] >= measured["allocated_peak_bytes"]
    assert "allocated at its peak" in report["summary"]


def test_verify_text_report(project: Path) -> None:
    proc = verify(project, "--simulate")
    assert proc.returncode == 0, proc.stderr
    assert "predicted vs measured" in proc.stdout
    assert "simulated:" in proc.stdout
    assert "not seen without a GPU" in proc.stdout


def test_no_cuda_offers_the_simulation(project: Path) -> None:
    proc = verify(project)
    if proc.returncode == 0:
        pytest.skip("this machine has a CUDA device")
    assert proc.returncode == 3
    assert "no CUDA device here: run `llmmem verify FILE --simulate`" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_qlora_plan_cannot_be_simulated_and_says_why(project: Path) -> None:
    script = SCRIPT.replace(
        "dtype=torch.bfloat16)",
        "dtype=torch.bfloat16, load_in_4bit=True)\nfrom peft import LoraConfig\nLoraConfig(r=8)",
    )
    (project / "train.py").write_text(script)
    proc = verify(project, "--simulate")
    assert proc.returncode == 3
    said = " ".join(proc.stdout.split())  # the report wraps to the terminal's width
    assert "bitsandbytes kernels (k-bit layers) do not run on fake tensors" in said
    assert "verify it with --device cpu (a small model) or on a GPU" in said


def test_a_step_that_runs_out_of_memory_reports_where_and_how_much(project: Path) -> None:
    """A real CPU step under a 2 GiB data limit: the model (~0.2 GiB) is built, the forward's
    bf16 logits (2 × 4096 × 128000 × 2 B = 1.95 GiB) do not fit beside it."""
    import resource

    config = {**TINY, "vocab_size": 128_000, "torch_dtype": "bfloat16"}
    (project / "tiny" / "config.json").write_text(json.dumps(config))
    (project / "train.py").write_text(SCRIPT.replace("seq=256", "seq=4096"))
    limit = 2 * 2**30

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    proc = verify(project, "--device", "cpu", "--format", "json", preexec_fn=limited)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1: the step ran out of memory
    report = json.loads(proc.stdout)
    oom = report["measurement"]["oom"]
    assert oom["phase"] == "forward"
    assert "can't allocate memory" in oom["message"]
    # what was allocated when it failed: at least the weights, at most the limit
    assert 2 * params_of(config) <= oom["allocated_bytes"] < limit
    assert report["summary"].startswith("OOM in forward at ")
    assert "Traceback" not in proc.stderr


def test_remote_code_needs_the_flag(project: Path) -> None:
    config = {**TINY, "auto_map": {"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}}
    (project / "tiny" / "config.json").write_text(json.dumps(config))
    proc = verify(project, "--simulate")
    assert proc.returncode == 2
    assert "ships its own model code" in proc.stderr and "--trust-remote-code" in proc.stderr


def test_a_step_that_takes_too_long_is_stopped(project: Path) -> None:
    proc = verify(project, "--simulate", "--timeout", "0.5", "--format", "json")
    assert proc.returncode == 3
    report = json.loads(proc.stdout)
    assert "took longer than 0.5 s" in report["summary"]


def test_nothing_to_verify_is_a_clear_error(project: Path) -> None:
    (project / "train.py").write_text("print('hello')\n")
    proc = verify(project, "--simulate")
    assert proc.returncode == 2
    assert "nothing to verify: no model found" in proc.stderr


# -- plans over several GPUs: one process per rank under torchrun (gloo on the CPU) ---------

MULTI_RANK = SCRIPT.replace("# llmmem: seq=256", "# llmmem: seq=128 world_size=2").replace(
    "    gradient_checkpointing=True,\n", ""
)


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_a_two_rank_plan_runs_each_rank_and_reports_its_peak(project: Path, sharding: str) -> None:
    script = MULTI_RANK
    if sharding == "fsdp":
        script = script.replace("    bf16=True,\n", '    bf16=True,\n    fsdp="full_shard",\n')
    (project / "train.py").write_text(script)
    proc = verify(project, "--device", "cpu", "--format", "json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    ranks = report["measurement"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    params = params_of(TINY)
    # DDP keeps a whole bf16 copy on each rank; FSDP full shard half of it
    expected_weights = 2 * params if sharding == "ddp" else params
    assert {r["weights_bytes"] for r in ranks} == {expected_weights}
    rows = {row["what"]: row for row in report["comparison"]}
    assert abs(rows["allocated peak"]["error"]) < 0.05, rows["allocated peak"]


def test_a_simulated_fsdp_rank_measures_what_a_real_rank_does(project: Path) -> None:
    # rank 0 alone in a fake process group against two real ranks over gloo
    (project / "train.py").write_text(
        MULTI_RANK.replace("    bf16=True,\n", '    bf16=True,\n    fsdp="full_shard",\n')
    )
    simulated = verify(project, "--simulate", "--format", "json")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    real = verify(project, "--device", "cpu", "--format", "json", timeout=600)
    assert real.returncode == 0, real.stdout + real.stderr
    fake_rank = json.loads(simulated.stdout)["measurement"]
    real_rank = json.loads(real.stdout)["measurement"]
    assert fake_rank["device_name"].endswith("rank 0 of 2")
    assert fake_rank["weights_bytes"] == real_rank["weights_bytes"] == params_of(TINY)
    for fake_phase, real_phase in zip(fake_rank["phases"], real_rank["phases"], strict=True):
        assert abs(fake_phase["peak_bytes"] - real_phase["peak_bytes"]) <= 1024, fake_phase


def test_plans_that_cannot_be_run_over_ranks_here_say_why(project: Path) -> None:
    (project / "train.py").write_text(MULTI_RANK)
    simulated = verify(project, "--simulate")
    assert simulated.returncode == 2
    assert "2-rank DDP plan cannot be simulated" in simulated.stderr
    (project / "train.py").write_text(
        MULTI_RANK.replace("    bf16=True,\n", '    bf16=True,\n    deepspeed="ds.json",\n')
    )
    (project / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    zero = verify(project, "--simulate")
    assert zero.returncode == 2
    assert "DeepSpeed ZeRO-3 plan cannot be simulated" in zero.stderr
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    (project / "ds.json").write_text(json.dumps(offload))
    on_cpu = verify(project, "--device", "cpu", "--format", "json")
    assert on_cpu.returncode == 3
    assert "on the CPU both are the same memory" in json.loads(on_cpu.stdout)["summary"]


# -- DeepSpeed ZeRO: deepspeed.initialize on each rank, DeepSpeed's CPU accelerator over gloo --

ZERO_RANKS = MULTI_RANK.replace(
    "    bf16=True,\n", '    bf16=True,\n    deepspeed="ds.json",\n'
).replace("dtype=torch.bfloat16)", "dtype=torch.float32)")

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)


@needs_deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_a_zero_plan_runs_under_deepspeed_on_each_rank(project: Path, stage: int) -> None:
    # HF's "auto" bucket: hidden_size² elements; bf16 "auto" follows TrainingArguments(bf16)
    zero = {"stage": stage, "reduce_bucket_size": "auto"}
    (project / "ds.json").write_text(
        json.dumps({"zero_optimization": zero, "bf16": {"enabled": "auto"}})
    )
    (project / "train.py").write_text(ZERO_RANKS)
    proc = verify(project, "--device", "cpu", "--format", "json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    measured = report["measurement"]
    assert [r["rank"] for r in measured["ranks"]] == [0, 1]
    params = params_of(TINY)
    # DeepSpeed casts the fp32 model to bf16: ZeRO-2 keeps the whole bf16 copy on each rank,
    # ZeRO-3 half of it, and whole the parameters of at most 1e5 elements
    # (stage3_param_persistence_threshold): here q, k, v, o and the norms; the optimizer steps
    # fp32 master weights (4 B) with AdamW's two fp32 moments (8 B), each rank its half
    expected = 2 * params if stage == 2 else params + 2 * persistent_of(TINY, 100_000)
    assert {r["weights_bytes"] for r in measured["ranks"]} == {expected}
    assert abs(measured["optimizer_state_bytes"] - 12 * params // 2) < 1024
    rows = {row["what"]: row for row in report["comparison"]}
    for what in ("forward peak", "backward peak", "optimizer step peak", "allocated peak"):
        assert abs(rows[what]["error"]) < 0.05, rows[what]


@needs_deepspeed
def test_a_zero3_lora_plan_holds_what_deepspeed_holds(project: Path) -> None:
    """ZeRO-3 under LoRA, with no reuse distance: what the core learnt from these runs — small
    parameters kept whole on every rank, the prefetch bucket gathering ahead, every Linear's
    input kept by ZeRO-3's own linear, the frozen embedding released after forward, the
    persistent parameters gathered again after the step — every phase within 2%."""
    zero = {"stage": 3, "reduce_bucket_size": "auto", "stage3_max_reuse_distance": 0}
    (project / "ds.json").write_text(
        json.dumps({"zero_optimization": zero, "bf16": {"enabled": "auto"}})
    )
    script = ZERO_RANKS.replace(
        "args = TrainingArguments(",
        "from peft import LoraConfig, get_peft_model\n"
        'model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))\n'
        "args = TrainingArguments(",
    )
    (project / "train.py").write_text(script)
    proc = verify(project, "--device", "cpu", "--format", "json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    rows = {row["what"]: row for row in report["comparison"]}
    for what in ("forward peak", "backward peak", "optimizer step peak", "weights"):
        assert abs(rows[what]["error"]) < 0.02, rows[what]
    # half of every bf16 parameter, and whole the ones of at most 1e5 elements
    params = params_of(TINY)
    h, layers = int(TINY["hidden_size"]), int(TINY["num_hidden_layers"])  # type: ignore[call-overload]
    kvd = h * int(TINY["num_key_value_heads"]) // int(TINY["num_attention_heads"])  # type: ignore[call-overload]
    adapters = layers * 8 * (2 * h + h + kvd)  # q: A 8×h, B h×8; v: A 8×h, B kvd×8
    expected = (params + adapters) + 2 * (persistent_of(TINY, 100_000) + adapters)
    assert {r["weights_bytes"] for r in report["measurement"]["ranks"]} == {expected}


@needs_deepspeed
def test_deepspeeds_default_bucket_is_in_the_backward_peak(project: Path) -> None:
    # no reduce_bucket_size: DeepSpeed's default, 5e8 elements of bf16 gradients (953.7 MiB)
    (project / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    (project / "train.py").write_text(ZERO_RANKS)
    proc = verify(project, "--device", "cpu", "--format", "json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    backward = {p["phase"]: p for p in report["measurement"]["phases"]}["backward"]
    assert backward["peak_bytes"] > 500_000_000 * 2
    rows = {row["what"]: row for row in report["comparison"]}
    assert abs(rows["backward peak"]["error"]) < 0.05, rows["backward peak"]


# -- missing packages ---------------------------------------------------------------------

LORA_SCRIPT = SCRIPT.replace(
    "args = TrainingArguments(",
    "from peft import LoraConfig, get_peft_model\n"
    'model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))\n'
    "args = TrainingArguments(",
)


@pytest.mark.parametrize(
    ("missing", "script", "where", "expected"),
    [
        (
            "transformers",
            SCRIPT,
            "--simulate",
            "(transformers is missing): pip install 'llmmem[verify]'",
        ),
        ("peft", LORA_SCRIPT, "--simulate", "LoRA plans need peft: pip install 'llmmem[verify]'"),
        (
            "deepspeed",
            ZERO_RANKS,
            "--device=cpu",
            "a DeepSpeed ZeRO plan needs deepspeed: pip install deepspeed",
        ),
    ],
    ids=["transformers", "peft", "deepspeed"],
)
def test_a_missing_package_is_named_with_what_to_install(
    project: Path,
    tmp_path_factory: pytest.TempPathFactory,
    missing: str,
    script: str,
    where: str,
    expected: str,
) -> None:
    # a package of that name that is not there, ahead of the installed one on the path
    shadow = tmp_path_factory.mktemp("without")
    (shadow / missing).mkdir()
    error = f"No module named {missing!r}"
    (shadow / missing / "__init__.py").write_text(
        f"raise ModuleNotFoundError({error!r}, name={missing!r})\n"
    )
    (project / "train.py").write_text(script)
    (project / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), ENV.get("PYTHONPATH")]))}
    proc = verify(project, where, "--format", "json", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert expected in report["summary"]
    assert "Traceback" not in proc.stderr
