"""The GPU catalog, the `--gpu` name resolution, and local GPU detection."""

from __future__ import annotations

import os
import stat
import sys
import time
import types
from pathlib import Path

import pytest

from llmmem import gpus
from llmmem.gpus import (
    DetectedGpu,
    GpuSpec,
    UnknownGpuError,
    all_gpus,
    detect_local_gpus,
    find_gpu,
    generic_gpu,
    parse_nvidia_smi_csv,
)

MIB = 2**20
GIB = 2**30


# --- the catalog -------------------------------------------------------------------------------

REQUIRED_CANONICAL_NAMES = [
    "H200", "H100-80GB", "H100-PCIe-80GB", "H100-NVL-94GB", "H20", "B200", "GB200",
    "A100-40GB", "A100-80GB", "A10", "A10G", "A30", "A40", "RTX-A6000", "RTX-6000-Ada",
    "L4", "L40", "L40S", "T4", "V100-16GB", "V100-32GB", "P100",
    "RTX-3060-12GB", "RTX-3080-10GB", "RTX-3090", "RTX-3090-Ti", "RTX-4060-Ti-16GB",
    "RTX-4070-Ti", "RTX-4080", "RTX-4090", "RTX-5090", "MI250X", "MI300X", "MI325X",
]  # fmt: skip


def test_catalog_covers_the_gpus_people_fine_tune_on() -> None:
    names = [spec.name for spec in all_gpus()]
    assert set(REQUIRED_CANONICAL_NAMES) <= set(names)
    assert len(names) == len(set(names))


def test_all_gpus_returns_a_fresh_list() -> None:
    listed = all_gpus()
    listed.clear()
    assert all_gpus()


def test_every_entry_is_well_formed() -> None:
    for spec in all_gpus():
        assert isinstance(spec, GpuSpec)
        assert spec.vendor in ("nvidia", "amd")
        assert not spec.generic
        assert spec.capacity_bytes % MIB == 0
        # The reported total sits within a few percent of the label (MI250X is labelled per
        # package of two devices; B200's 192 GB label covers memory not exposed to CUDA).
        per_device_gib = spec.marketed_gib / 2 if spec.name == "MI250X" else spec.marketed_gib
        assert 0.90 * per_device_gib < spec.capacity_gib < 1.1 * per_device_gib, spec.name
        if spec.vendor == "nvidia":
            assert spec.compute_capability is not None and spec.gfx_target is None
        else:
            assert spec.gfx_target is not None and spec.compute_capability is None
        assert spec.nvml_names, spec.name


def test_every_spelling_in_the_catalog_resolves_to_its_own_entry() -> None:
    for spec in all_gpus():
        for spelling in (spec.name, *spec.aliases, *spec.nvml_names):
            assert find_gpu(spelling).name == spec.name, spelling


@pytest.mark.parametrize(
    ("name", "reported_mib"),
    [
        ("A100-80GB", 81_920),
        ("A100-40GB", 40_960),
        ("H100-80GB", 81_559),
        ("H200", 143_771),
        ("L4", 23_034),
        ("T4", 15_360),
        ("V100-16GB", 16_384),
        ("RTX-4090", 24_564),
        ("A10G", 23_028),
        ("L40S", 46_068),
    ],
)
def test_capacity_is_the_nvidia_smi_total(name: str, reported_mib: int) -> None:
    assert find_gpu(name).capacity_bytes == reported_mib * MIB


def test_a100_80gb_capacity_in_bytes() -> None:
    assert find_gpu("A100-80GB").capacity_bytes == 85_899_345_920


@pytest.mark.parametrize("name", ["V100", "V100-32GB", "T4", "P100"])
def test_no_bf16_before_ampere(name: str) -> None:
    assert find_gpu(name).bf16 is False


@pytest.mark.parametrize(
    "name", ["A100", "A100-40GB", "H100", "H200", "L4", "4090", "3090", "A10G", "MI250X", "MI300X"]
)
def test_bf16_on_ampere_and_later(name: str) -> None:
    assert find_gpu(name).bf16 is True


@pytest.mark.parametrize(
    ("name", "fp8"),
    [("H100", True), ("H200", True), ("L4", True), ("4090", True), ("B200", True),
     ("MI300X", True), ("A100", False), ("3090", False), ("T4", False), ("MI250X", False)],
)  # fmt: skip
def test_fp8_on_ada_hopper_blackwell_and_cdna3(name: str, fp8: bool) -> None:
    assert find_gpu(name).fp8 is fp8


@pytest.mark.parametrize(
    ("name", "compute_capability"),
    [("A100", "8.0"), ("A10G", "8.6"), ("L4", "8.9"), ("H100", "9.0"), ("T4", "7.5"),
     ("V100", "7.0"), ("B200", "10.0")],
)  # fmt: skip
def test_compute_capability(name: str, compute_capability: str) -> None:
    assert find_gpu(name).compute_capability == compute_capability


# --- name resolution ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("A100-80GB", "A100-80GB"),
        ("a100-80g", "A100-80GB"),
        ("a100_80gb", "A100-80GB"),
        ("A100 80GB", "A100-80GB"),
        ("A100 80 GB", "A100-80GB"),
        ("a100-80gib", "A100-80GB"),
        ("  A100-80GB  ", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("a100-80gb-sxm", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("a100-40g", "A100-40GB"),
        ("rtx-4090", "RTX-4090"),
        ("4090", "RTX-4090"),
        ("RTX4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("geforce 4090", "RTX-4090"),
        ("3090", "RTX-3090"),
        ("3090 Ti", "RTX-3090-Ti"),
        ("3090ti", "RTX-3090-Ti"),
        ("3060", "RTX-3060-12GB"),
        ("3080", "RTX-3080-10GB"),
        ("4060ti", "RTX-4060-Ti-16GB"),
        ("4070-ti", "RTX-4070-Ti"),
        ("4080", "RTX-4080"),
        ("5090", "RTX-5090"),
        ("l40s", "L40S"),
        ("L40", "L40"),
        ("l4", "L4"),
        ("NVIDIA L4", "L4"),
        ("mi300x", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("mi325x", "MI325X"),
        ("MI250X", "MI250X"),
        ("H100", "H100-80GB"),
        ("h100-sxm5-80gb", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("H100 PCIe", "H100-PCIe-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("h100-nvl", "H100-NVL-94GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("h200", "H200"),
        ("H20", "H20"),
        ("b200", "B200"),
        ("gb200", "GB200"),
        ("A10", "A10"),
        ("A10G", "A10G"),
        ("NVIDIA A10G", "A10G"),
        ("a30", "A30"),
        ("a40", "A40"),
        ("A6000", "RTX-A6000"),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("rtx-6000-ada", "RTX-6000-Ada"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("t4", "T4"),
        ("Tesla T4", "T4"),
        ("V100", "V100-16GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("v100-32gb", "V100-32GB"),
        ("Tesla V100-PCIE-32GB", "V100-32GB"),
        ("p100", "P100"),
        ("Tesla P100-PCIE-16GB", "P100"),
    ],
)
def test_spellings_resolve_to_the_canonical_gpu(typed: str, canonical: str) -> None:
    assert find_gpu(typed).name == canonical


def test_plain_names_pick_the_documented_default() -> None:
    assert find_gpu("A100") == find_gpu("A100-80GB")
    assert find_gpu("H100") == find_gpu("H100-80GB")
    assert find_gpu("V100") == find_gpu("V100-16GB")
    assert find_gpu("H100").name != find_gpu("H100 PCIe").name


def test_a_form_factor_word_does_not_override_an_exact_alias() -> None:
    # "PCIe" is dropped only as a last resort, so the H100 PCIe card keeps its own entry.
    assert find_gpu("h100-pcie-80gb").name == "H100-PCIe-80GB"
    assert find_gpu("H100 80GB PCIe").name == "H100-PCIe-80GB"


def test_a10_and_a10g_are_not_read_as_sizes() -> None:
    assert find_gpu("a10g").name == "A10G"
    assert find_gpu("a10").name == "A10"


@pytest.mark.parametrize("name", ["A100-90GB", "banana", "H800", "", "4090-48GB", "P100-12GB"])
def test_unknown_names_raise_a_value_error(name: str) -> None:
    with pytest.raises(UnknownGpuError) as raised:
        find_gpu(name)
    assert isinstance(raised.value, ValueError)
    message = str(raised.value)
    assert "\n" not in message
    assert "24GiB" in message and "80GB" in message
    assert repr(name) in message


def test_unknown_name_lists_close_matches() -> None:
    with pytest.raises(UnknownGpuError) as raised:
        find_gpu("A100-90GB")
    assert raised.value.suggestions[:2] == ["A100-80GB", "A100-40GB"]
    assert len(raised.value.suggestions) <= 5
    assert "A100-80GB" in str(raised.value) and "A100-40GB" in str(raised.value)


def test_misspelled_name_suggests_the_card() -> None:
    with pytest.raises(UnknownGpuError) as raised:
        find_gpu("L40X")
    assert "L40S" in raised.value.suggestions
    with pytest.raises(UnknownGpuError) as raised:
        find_gpu("rtx 4900")
    assert "RTX-4090" in raised.value.suggestions


def test_name_far_from_everything_has_no_suggestions() -> None:
    with pytest.raises(UnknownGpuError) as raised:
        find_gpu("banana")
    assert raised.value.suggestions == []
    assert "no close match" in str(raised.value)


# --- capacities --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "name", "capacity_bytes"),
    [
        ("24GiB", "24GiB", 24 * GIB),
        ("24gib", "24GiB", 24 * GIB),
        ("80GB", "80GiB", 80 * GIB),
        ("80 GB", "80GiB", 80 * GIB),
        ("16g", "16GiB", 16 * GIB),
        ("1.5GiB", "1.5GiB", 3 * GIB // 2),
        ("24576MiB", "24576MiB", 24 * GIB),
        ("1TiB", "1TiB", 2**40),
    ],
)
def test_capacity_strings_give_a_generic_gpu(typed: str, name: str, capacity_bytes: int) -> None:
    spec = find_gpu(typed)
    assert spec.name == name
    assert spec.capacity_bytes == capacity_bytes
    assert spec.generic is True
    assert spec.bf16 is True
    assert spec.vendor == "unknown"
    assert "generic" in spec.note


@pytest.mark.parametrize("typed", ["0GiB", "24", "24 apples", "GiB", "-8GB"])
def test_not_quite_capacities_are_unknown(typed: str) -> None:
    with pytest.raises(UnknownGpuError):
        find_gpu(typed)


def test_a_catalog_name_is_never_read_as_a_capacity() -> None:
    assert find_gpu("4090").generic is False
    assert find_gpu("3090").capacity_bytes == 24_576 * MIB


def test_generic_gpu_names_itself_after_its_capacity() -> None:
    assert generic_gpu(48 * GIB).name == "48GiB"
    assert generic_gpu(48 * GIB, name="Some Card").name == "Some Card"


# --- parsing nvidia-smi ------------------------------------------------------------------------

EIGHT_A100S = "\n".join(
    f"{index}, NVIDIA A100-SXM4-80GB, 81920, {81920 - 3 - index}" for index in range(8)
)


def test_parse_several_gpus() -> None:
    detected = parse_nvidia_smi_csv(EIGHT_A100S + "\n")
    assert [gpu.index for gpu in detected] == list(range(8))
    first = detected[0]
    assert first.nvml_name == "NVIDIA A100-SXM4-80GB"
    assert first.total_bytes == 85_899_345_920
    assert first.free_bytes == 81_917 * MIB
    assert first.spec is not None and first.spec.name == "A100-80GB"
    assert first.source == "nvidia-smi"


def test_parse_mixed_gpus_with_odd_spacing_and_missing_free() -> None:
    output = (
        "0,   NVIDIA GeForce RTX 4090 ,24564,   23989\r\n"
        "  1 , Tesla T4,15360 , [N/A]\n"
        "\n"
        "2, NVIDIA H100 80GB HBM3, 81559 MiB, 81008 MiB\n"
    )
    detected = parse_nvidia_smi_csv(output)
    assert [(gpu.index, gpu.nvml_name) for gpu in detected] == [
        (0, "NVIDIA GeForce RTX 4090"),
        (1, "Tesla T4"),
        (2, "NVIDIA H100 80GB HBM3"),
    ]
    assert detected[0].free_bytes == 23_989 * MIB
    assert detected[1].free_bytes is None
    assert detected[1].total_bytes == 15_360 * MIB
    assert detected[2].total_bytes == 81_559 * MIB
    assert [gpu.spec.name if gpu.spec else None for gpu in detected] == [
        "RTX-4090",
        "T4",
        "H100-80GB",
    ]


def test_parse_skips_rows_without_a_total() -> None:
    output = "0, NVIDIA A100-SXM4-40GB, [N/A], [N/A]\n1, NVIDIA A100-SXM4-40GB, 40960, 40000\n"
    detected = parse_nvidia_smi_csv(output)
    assert [gpu.index for gpu in detected] == [1]


def test_parse_garbage_gives_nothing() -> None:
    for output in [
        "",
        "No devices were found",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "index, name, memory.total [MiB], memory.free [MiB]",
        "a, b, c, d\n\x00\x01\x02",
        "0, , 81920, 100",
    ]:
        assert parse_nvidia_smi_csv(output) == []


def test_parse_keeps_an_unknown_gpu_without_a_catalog_entry() -> None:
    (detected,) = parse_nvidia_smi_csv("0, NVIDIA H800, 81559, 81000")
    assert detected.spec is None
    assert detected.as_gpu_spec().generic is True
    assert detected.as_gpu_spec().name == "NVIDIA H800"
    assert detected.as_gpu_spec().capacity_bytes == 81_559 * MIB


def test_parse_does_not_match_a_catalog_card_of_another_size() -> None:
    # The 8 GB RTX 4060 Ti and the 12 GB RTX 3080 share their names with the catalog cards.
    small, large = parse_nvidia_smi_csv(
        "0, NVIDIA GeForce RTX 4060 Ti, 8188, 8000\n1, NVIDIA GeForce RTX 3080, 12288, 12000"
    )
    assert small.spec is None and large.spec is None
    assert small.as_gpu_spec().capacity_bytes == 8188 * MIB


def test_a_matched_gpu_reports_its_catalog_entry() -> None:
    (detected,) = parse_nvidia_smi_csv("0, NVIDIA L4, 23034, 22700")
    assert detected.as_gpu_spec() == find_gpu("L4")
    assert isinstance(detected, DetectedGpu)


# --- detection ---------------------------------------------------------------------------------


@pytest.fixture
def without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import pynvml` fail, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


def _put_fake_nvidia_smi(
    directory: Path, monkeypatch: pytest.MonkeyPatch, script_body: str
) -> Path:
    executable = directory / "nvidia-smi"
    executable.write_text("#!/bin/sh\n" + script_body)
    executable.chmod(executable.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return executable


posix_only = pytest.mark.skipif(os.name != "posix", reason="fake nvidia-smi is a shell script")


@posix_only
@pytest.mark.usefixtures("without_pynvml")
def test_detect_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arguments_file = tmp_path / "arguments"
    _put_fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        f'echo "$@" > "{arguments_file}"\n'
        "echo '0, NVIDIA A100-SXM4-80GB, 81920, 81000'\n"
        "echo '1, NVIDIA A100-SXM4-80GB, 81920, [N/A]'\n",
    )
    detected = detect_local_gpus()
    assert [(gpu.index, gpu.free_bytes) for gpu in detected] == [(0, 81_000 * MIB), (1, None)]
    assert all(gpu.spec is not None and gpu.spec.name == "A100-80GB" for gpu in detected)
    assert arguments_file.read_text().split() == [
        "--query-gpu=index,name,memory.total,memory.free",
        "--format=csv,noheader,nounits",
    ]


@posix_only
@pytest.mark.usefixtures("without_pynvml")
def test_detect_gives_up_on_a_hanging_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _put_fake_nvidia_smi(tmp_path, monkeypatch, "echo '0, NVIDIA L4, 23034, 22000'\nsleep 30\n")
    started = time.monotonic()
    assert detect_local_gpus() == []
    elapsed = time.monotonic() - started
    assert gpus.NVIDIA_SMI_TIMEOUT_S <= elapsed < gpus.NVIDIA_SMI_TIMEOUT_S + 2.5
    assert capfd.readouterr() == ("", "")


@posix_only
@pytest.mark.usefixtures("without_pynvml")
def test_detect_honours_a_shorter_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _put_fake_nvidia_smi(tmp_path, monkeypatch, "exec sleep 30\n")
    started = time.monotonic()
    assert detect_local_gpus(nvidia_smi_timeout_s=0.2) == []
    assert time.monotonic() - started < 2.0


@posix_only
@pytest.mark.usefixtures("without_pynvml")
def test_detect_ignores_a_failing_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _put_fake_nvidia_smi(
        tmp_path,
        monkeypatch,
        "echo '0, NVIDIA A100-SXM4-80GB, 81920, 81000'\n"
        "echo 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
        "exit 9\n",
    )
    assert detect_local_gpus() == []
    assert capfd.readouterr() == ("", "")


@posix_only
@pytest.mark.usefixtures("without_pynvml")
def test_detect_ignores_garbage_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put_fake_nvidia_smi(tmp_path, monkeypatch, "printf 'Segmentation fault\\n\\377\\376\\n'\n")
    assert detect_local_gpus() == []


@posix_only
@pytest.mark.usefixtures("without_pynvml")
def test_detect_ignores_an_nvidia_smi_it_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable = tmp_path / "nvidia-smi"
    executable.write_text("#!/nonexistent/interpreter\n")
    executable.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_local_gpus() == []


@pytest.mark.usefixtures("without_pynvml")
def test_detect_without_nvidia_smi_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_local_gpus() == []
    assert capfd.readouterr() == ("", "")


def test_missing_pynvml_is_not_an_error(without_pynvml: None) -> None:
    assert gpus._detect_with_nvml() is None


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(*, init_fails: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    devices = [
        (b"NVIDIA H100 80GB HBM3", 81_559 * MIB, 80_000 * MIB),
        ("NVIDIA L4", 23_034 * MIB, 1),
    ]
    module.shutdown_calls = 0  # type: ignore[attr-defined]

    def nvml_init() -> None:
        if init_fails:
            raise _FakeNvmlError("NVML Shared Library Not Found")

    def nvml_shutdown() -> None:
        module.shutdown_calls += 1  # type: ignore[attr-defined]

    module.nvmlInit = nvml_init  # type: ignore[attr-defined]
    module.nvmlShutdown = nvml_shutdown  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda index: index  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = lambda handle: devices[handle][0]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=devices[handle][1], free=devices[handle][2], used=0
    )
    return module


def test_detect_prefers_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("PATH", str(tmp_path))
    detected = detect_local_gpus()
    assert [(gpu.nvml_name, gpu.source) for gpu in detected] == [
        ("NVIDIA H100 80GB HBM3", "nvml"),
        ("NVIDIA L4", "nvml"),
    ]
    assert detected[0].spec is not None and detected[0].spec.name == "H100-80GB"
    assert detected[0].free_bytes == 80_000 * MIB
    assert detected[1].spec is not None and detected[1].spec.name == "L4"
    assert fake.shutdown_calls == 1  # type: ignore[attr-defined]


@posix_only
def test_detect_falls_back_to_nvidia_smi_when_nvml_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_fails=True))
    _put_fake_nvidia_smi(tmp_path, monkeypatch, "echo '0, Tesla T4, 15360, 15000'\n")
    (detected,) = detect_local_gpus()
    assert detected.source == "nvidia-smi"
    assert detected.spec is not None and detected.spec.name == "T4"


def test_detect_survives_nvml_failing_midway(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = _fake_pynvml()

    def broken_memory_info(handle: int) -> None:
        raise _FakeNvmlError("Not Supported")

    fake.nvmlDeviceGetMemoryInfo = broken_memory_info  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert detect_local_gpus() == []
    assert fake.shutdown_calls == 1  # type: ignore[attr-defined]


def test_importing_the_module_does_not_import_torch_or_pynvml() -> None:
    import subprocess

    code = (
        "import sys, llmmem.gpus; "
        "print(any(m in sys.modules for m in ('torch', 'pynvml', 'difflib')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert result.stdout.strip() == "False"
