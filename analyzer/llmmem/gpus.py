"""The GPUs llmmem compares a training step against, and the ones on this machine.

`find_gpu(name)` turns what a user types after `--gpu` ("A100", "a100_80gb", "rtx-4090",
"NVIDIA A100-SXM4-80GB", "24GiB") into a `GpuSpec`; `all_gpus()` lists the catalog for pickers;
`detect_local_gpus()` asks NVML, then `nvidia-smi`, which GPUs this machine has.

Alias policy, for names that leave the memory size open:
- "A100" is the 80 GB card (A100-80GB), the common cloud default; "A100 40GB" picks the other one.
- "H100" is the 80 GB SXM card (H100-80GB); "H100 PCIe" and "H100 NVL" name the other two.
- "V100" is the 16 GB card (V100-16GB); "V100 32GB" or "V100S" picks the other one.
- "4060 Ti" is the 16 GB card; the 8 GB card is not in the catalog.
Form factors (SXM4, PCIe, HBM3) never change the capacity of an A100 or a V100, so they are
accepted and ignored after the exact aliases have been tried.

Capacities are what the driver reports as total memory: `nvidia-smi --query-gpu=memory.total`
in MiB (the same number NVML gives), times 2**20; for AMD, the VRAM total of `rocm-smi`. They are
a few hundred MiB above what a process can allocate, because the driver keeps some for itself.

Nothing here imports torch, and `pynvml`, `subprocess` and `difflib` are imported only when they
are needed, so importing this module stays cheap on the CLI path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from llmmem.units import GIB, MIB

if TYPE_CHECKING:
    import subprocess

TIB = 2**40

NVIDIA_SMI_TIMEOUT_S = 2.0
NVIDIA_SMI_QUERY = "--query-gpu=index,name,memory.total,memory.free"
NVIDIA_SMI_FORMAT = "--format=csv,noheader,nounits"

# A detected GPU is matched to a catalog entry only when the reported total is this close to the
# catalog capacity: an 8 GB "RTX 4060 Ti" or a 12 GB "RTX 3080" shares its NVML name with the
# catalog card but not its memory.
DETECTED_CAPACITY_TOLERANCE = 0.05

Vendor = Literal["nvidia", "amd", "unknown"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One GPU model as llmmem sees it: how much memory a single device reports, and which dtypes
    it computes in natively."""

    name: str  # canonical: "A100-80GB", "H100-80GB", "RTX-4090", "MI300X"
    vendor: Vendor
    architecture: str | None = None  # "Ampere", "Hopper", "CDNA3"
    marketed_gib: float  # the size on the spec sheet, which vendors write as "GB"
    capacity_bytes: int  # total memory one device reports (nvidia-smi / NVML / rocm-smi)
    bf16: bool  # native bfloat16 math (Ampere and later, CDNA2 and later)
    fp8: bool  # FP8 tensor cores (Ada, Hopper, Blackwell, CDNA3)
    compute_capability: str | None = None  # CUDA compute capability, "8.0"; None for AMD
    gfx_target: str | None = None  # ROCm target, "gfx942"; None for NVIDIA
    aliases: list[str] = field(default_factory=list)
    # what NVML, nvidia-smi or torch.cuda.get_device_name print
    nvml_names: list[str] = field(default_factory=list)
    generic: bool = False  # True for a GPU made up from a capacity ("24GiB"); bf16 is assumed
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "marketed_gib", float(self.marketed_gib))

    @property
    def capacity_gib(self) -> float:
        return self.capacity_bytes / GIB


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectedGpu:
    """One GPU found on this machine."""

    index: int
    nvml_name: str  # as NVML or nvidia-smi print it: "NVIDIA A100-SXM4-80GB"
    total_bytes: int
    free_bytes: int | None = None  # None where the driver did not say
    spec: GpuSpec | None = None  # the catalog entry, when the name and the total both fit one
    source: Literal["nvml", "nvidia-smi"]

    def as_gpu_spec(self) -> GpuSpec:
        """The catalog entry, or a generic GPU of the reported total named after the device."""
        if self.spec is not None:
            return self.spec
        return generic_gpu(self.total_bytes, name=self.nvml_name)


class UnknownGpuError(ValueError):
    """A `--gpu` value that is neither a known GPU nor a capacity; the message is one line."""

    def __init__(self, requested: str, suggestions: list[str]) -> None:
        self.requested = requested
        self.suggestions = suggestions
        if suggestions:
            matches = f"close matches: {', '.join(suggestions)}"
        else:
            matches = "no close match in the catalog"
        super().__init__(
            f"unknown GPU {requested!r} ({matches}); "
            "--gpu also accepts a capacity such as 24GiB or 80GB"
        )


def _nvidia(
    name: str,
    *,
    architecture: str,
    marketed_gib: float,
    reported_mib: int,
    compute_capability: str,
    nvml_names: list[str],
    aliases: list[str] | None = None,
    note: str = "",
) -> GpuSpec:
    major = int(compute_capability.split(".")[0])
    minor = int(compute_capability.split(".")[1])
    return GpuSpec(
        name=name,
        vendor="nvidia",
        architecture=architecture,
        marketed_gib=marketed_gib,
        capacity_bytes=reported_mib * MIB,
        bf16=major >= 8,
        fp8=(major, minor) >= (8, 9),
        compute_capability=compute_capability,
        aliases=aliases or [],
        nvml_names=nvml_names,
        note=note,
    )


def _amd(
    name: str,
    *,
    architecture: str,
    marketed_gib: float,
    reported_mib: int,
    gfx_target: str,
    fp8: bool,
    nvml_names: list[str],
    aliases: list[str] | None = None,
    note: str = "",
) -> GpuSpec:
    return GpuSpec(
        name=name,
        vendor="amd",
        architecture=architecture,
        marketed_gib=marketed_gib,
        capacity_bytes=reported_mib * MIB,
        bf16=True,
        fp8=fp8,
        gfx_target=gfx_target,
        aliases=aliases or [],
        nvml_names=nvml_names,
        note=note,
    )


# reported_mib is the total nvidia-smi prints in MiB (`memory.total`), to the best of our
# knowledge of each card; for AMD it is the VRAM total rocm-smi prints, in MiB.
_CATALOG: tuple[GpuSpec, ...] = (
    # Blackwell
    _nvidia(
        "B200",
        architecture="Blackwell",
        marketed_gib=192,
        reported_mib=183_359,
        compute_capability="10.0",
        nvml_names=["NVIDIA B200"],
        aliases=["B200 192GB", "B200 180GB", "HGX B200", "DGX B200"],
    ),
    _nvidia(
        "GB200",
        architecture="Blackwell",
        marketed_gib=192,
        reported_mib=189_471,
        compute_capability="10.0",
        nvml_names=["NVIDIA GB200"],
        aliases=["GB200 NVL72", "GB200 186GB"],
        note="one Blackwell GPU of a Grace Blackwell superchip",
    ),
    _nvidia(
        "RTX-5090",
        architecture="Blackwell",
        marketed_gib=32,
        reported_mib=32_607,
        compute_capability="12.0",
        nvml_names=["NVIDIA GeForce RTX 5090"],
        aliases=["RTX 5090", "5090", "GeForce RTX 5090", "5090 32GB"],
    ),
    # Hopper
    _nvidia(
        "H200",
        architecture="Hopper",
        marketed_gib=141,
        reported_mib=143_771,
        compute_capability="9.0",
        nvml_names=["NVIDIA H200", "NVIDIA H200 NVL"],
        aliases=["H200 141GB", "H200 SXM", "H200 SXM 141GB"],
    ),
    _nvidia(
        "H100-80GB",
        architecture="Hopper",
        marketed_gib=80,
        reported_mib=81_559,
        compute_capability="9.0",
        nvml_names=["NVIDIA H100 80GB HBM3"],
        aliases=["H100", "H100 SXM", "H100 SXM5", "H100 80GB", "H100 SXM 80GB", "H100 SXM5 80GB"],
        note="the SXM card; plain 'H100' means this one",
    ),
    _nvidia(
        "H100-PCIe-80GB",
        architecture="Hopper",
        marketed_gib=80,
        reported_mib=81_559,
        compute_capability="9.0",
        nvml_names=["NVIDIA H100 PCIe"],
        aliases=["H100 PCIe", "H100 PCIe 80GB", "H100 80GB PCIe"],
    ),
    _nvidia(
        "H100-NVL-94GB",
        architecture="Hopper",
        marketed_gib=94,
        reported_mib=95_830,
        compute_capability="9.0",
        nvml_names=["NVIDIA H100 NVL"],
        aliases=["H100 NVL", "H100 94GB", "H100 NVL 94GB"],
    ),
    _nvidia(
        "H20",
        architecture="Hopper",
        marketed_gib=96,
        reported_mib=97_871,
        compute_capability="9.0",
        nvml_names=["NVIDIA H20"],
        aliases=["H20 96GB"],
    ),
    # Ada Lovelace
    _nvidia(
        "L4",
        architecture="Ada Lovelace",
        marketed_gib=24,
        reported_mib=23_034,
        compute_capability="8.9",
        nvml_names=["NVIDIA L4"],
        aliases=["L4 24GB"],
    ),
    _nvidia(
        "L40",
        architecture="Ada Lovelace",
        marketed_gib=48,
        reported_mib=46_068,
        compute_capability="8.9",
        nvml_names=["NVIDIA L40"],
        aliases=["L40 48GB"],
    ),
    _nvidia(
        "L40S",
        architecture="Ada Lovelace",
        marketed_gib=48,
        reported_mib=46_068,
        compute_capability="8.9",
        nvml_names=["NVIDIA L40S"],
        aliases=["L40S 48GB"],
    ),
    _nvidia(
        "RTX-6000-Ada",
        architecture="Ada Lovelace",
        marketed_gib=48,
        reported_mib=49_140,
        compute_capability="8.9",
        nvml_names=["NVIDIA RTX 6000 Ada Generation"],
        aliases=["RTX 6000 Ada", "6000 Ada", "RTX 6000 Ada Generation", "RTX 6000 Ada 48GB"],
    ),
    _nvidia(
        "RTX-4090",
        architecture="Ada Lovelace",
        marketed_gib=24,
        reported_mib=24_564,
        compute_capability="8.9",
        nvml_names=["NVIDIA GeForce RTX 4090"],
        aliases=["RTX 4090", "4090", "GeForce RTX 4090", "4090 24GB"],
    ),
    _nvidia(
        "RTX-4080",
        architecture="Ada Lovelace",
        marketed_gib=16,
        reported_mib=16_376,
        compute_capability="8.9",
        nvml_names=["NVIDIA GeForce RTX 4080"],
        aliases=["RTX 4080", "4080", "4080 16GB"],
    ),
    _nvidia(
        "RTX-4070-Ti",
        architecture="Ada Lovelace",
        marketed_gib=12,
        reported_mib=12_282,
        compute_capability="8.9",
        nvml_names=["NVIDIA GeForce RTX 4070 Ti"],
        aliases=["RTX 4070 Ti", "4070 Ti", "4070 Ti 12GB"],
    ),
    _nvidia(
        "RTX-4060-Ti-16GB",
        architecture="Ada Lovelace",
        marketed_gib=16,
        reported_mib=16_380,
        compute_capability="8.9",
        nvml_names=["NVIDIA GeForce RTX 4060 Ti"],
        aliases=["RTX 4060 Ti", "4060 Ti", "4060 Ti 16GB", "RTX 4060 Ti 16GB"],
        note="the 16 GB card; plain '4060 Ti' means this one",
    ),
    # Ampere
    _nvidia(
        "A100-80GB",
        architecture="Ampere",
        marketed_gib=80,
        reported_mib=81_920,
        compute_capability="8.0",
        nvml_names=["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"],
        aliases=["A100", "A100 80GB", "A100 SXM4 80GB", "A100 PCIe 80GB", "A100 80GB PCIe"],
        note="SXM4 and PCIe cards; plain 'A100' means this one",
    ),
    _nvidia(
        "A100-40GB",
        architecture="Ampere",
        marketed_gib=40,
        reported_mib=40_960,
        compute_capability="8.0",
        nvml_names=["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"],
        aliases=["A100 40GB", "A100 SXM4 40GB", "A100 PCIe 40GB"],
        note="SXM4 and PCIe cards",
    ),
    _nvidia(
        "A30",
        architecture="Ampere",
        marketed_gib=24,
        reported_mib=24_576,
        compute_capability="8.0",
        nvml_names=["NVIDIA A30"],
        aliases=["A30 24GB"],
    ),
    _nvidia(
        "A40",
        architecture="Ampere",
        marketed_gib=48,
        reported_mib=46_068,
        compute_capability="8.6",
        nvml_names=["NVIDIA A40"],
        aliases=["A40 48GB"],
    ),
    _nvidia(
        "A10",
        architecture="Ampere",
        marketed_gib=24,
        reported_mib=23_028,
        compute_capability="8.6",
        nvml_names=["NVIDIA A10"],
        aliases=["A10 24GB"],
    ),
    _nvidia(
        "A10G",
        architecture="Ampere",
        marketed_gib=24,
        reported_mib=23_028,
        compute_capability="8.6",
        nvml_names=["NVIDIA A10G"],
        aliases=["A10G 24GB"],
        note="the AWS variant of the A10 (g5 instances)",
    ),
    _nvidia(
        "RTX-A6000",
        architecture="Ampere",
        marketed_gib=48,
        reported_mib=49_140,
        compute_capability="8.6",
        nvml_names=["NVIDIA RTX A6000"],
        aliases=["A6000", "RTX A6000", "A6000 48GB"],
    ),
    _nvidia(
        "RTX-3090-Ti",
        architecture="Ampere",
        marketed_gib=24,
        reported_mib=24_564,
        compute_capability="8.6",
        nvml_names=["NVIDIA GeForce RTX 3090 Ti"],
        aliases=["RTX 3090 Ti", "3090 Ti", "3090 Ti 24GB"],
    ),
    _nvidia(
        "RTX-3090",
        architecture="Ampere",
        marketed_gib=24,
        reported_mib=24_576,
        compute_capability="8.6",
        nvml_names=["NVIDIA GeForce RTX 3090"],
        aliases=["RTX 3090", "3090", "GeForce RTX 3090", "3090 24GB"],
    ),
    _nvidia(
        "RTX-3080-10GB",
        architecture="Ampere",
        marketed_gib=10,
        reported_mib=10_240,
        compute_capability="8.6",
        nvml_names=["NVIDIA GeForce RTX 3080"],
        aliases=["RTX 3080", "3080", "3080 10GB", "RTX 3080 10GB"],
        note="the 10 GB card; plain '3080' means this one",
    ),
    _nvidia(
        "RTX-3060-12GB",
        architecture="Ampere",
        marketed_gib=12,
        reported_mib=12_288,
        compute_capability="8.6",
        nvml_names=["NVIDIA GeForce RTX 3060"],
        aliases=["RTX 3060", "3060", "3060 12GB", "RTX 3060 12GB"],
        note="the 12 GB card; plain '3060' means this one",
    ),
    # Turing, Volta, Pascal: no bfloat16
    _nvidia(
        "T4",
        architecture="Turing",
        marketed_gib=16,
        reported_mib=15_360,
        compute_capability="7.5",
        nvml_names=["Tesla T4"],
        aliases=["T4 16GB"],
    ),
    _nvidia(
        "V100-16GB",
        architecture="Volta",
        marketed_gib=16,
        reported_mib=16_384,
        compute_capability="7.0",
        nvml_names=["Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"],
        aliases=["V100", "V100 16GB", "V100 SXM2 16GB", "V100 PCIe 16GB"],
        note="plain 'V100' means this one",
    ),
    _nvidia(
        "V100-32GB",
        architecture="Volta",
        marketed_gib=32,
        reported_mib=32_768,
        compute_capability="7.0",
        nvml_names=["Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB"],
        aliases=["V100 32GB", "V100S", "V100S 32GB", "V100 SXM2 32GB", "V100 PCIe 32GB"],
    ),
    _nvidia(
        "P100",
        architecture="Pascal",
        marketed_gib=16,
        reported_mib=16_384,
        compute_capability="6.0",
        nvml_names=["Tesla P100-PCIE-16GB", "Tesla P100-SXM2-16GB"],
        aliases=["P100 16GB"],
        note="the 16 GB card",
    ),
    # AMD Instinct
    _amd(
        "MI325X",
        architecture="CDNA3",
        marketed_gib=256,
        reported_mib=262_128,
        gfx_target="gfx942",
        fp8=True,
        nvml_names=["AMD Instinct MI325X"],
        aliases=["MI325X 256GB"],
    ),
    _amd(
        "MI300X",
        architecture="CDNA3",
        marketed_gib=192,
        reported_mib=196_592,
        gfx_target="gfx942",
        fp8=True,
        nvml_names=["AMD Instinct MI300X"],
        aliases=["MI300X 192GB"],
    ),
    _amd(
        "MI250X",
        architecture="CDNA2",
        marketed_gib=128,
        reported_mib=65_520,
        gfx_target="gfx90a",
        fp8=False,
        nvml_names=["AMD Instinct MI250X", "AMD Instinct MI250X/MI250"],
        aliases=["MI250X 128GB"],
        note="one MI250X is two devices (GCDs) of 64 GB each; the capacity is per device",
    ),
)

# Words that name a vendor or a product line rather than a GPU; dropped from both sides.
_VENDOR_WORDS = frozenset(
    {"nvidia", "amd", "tesla", "geforce", "quadro", "instinct", "radeon", "hgx", "dgx"}
)
# Words that name a form factor or memory technology; dropped from the request only when the
# name did not match with them, so "H100 PCIe" stays apart from "H100" while "A100 SXM4" and
# "V100-PCIE-16GB" still find their card.
_FORM_FACTOR_WORDS = frozenset(
    {"sxm", "sxm2", "sxm3", "sxm4", "sxm5", "sxm6", "pcie", "pci", "nvl", "oam",
     "hbm2", "hbm2e", "hbm3", "hbm3e"}
)  # fmt: skip
_MEMORY_SIZE_WORD = re.compile(r"^(\d+)(?:gib|gb|g)$")
_MEMORY_UNIT_WORDS = frozenset({"gib", "gb", "g"})

_CAPACITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g|tib|tb|mib|mb)\s*$", re.IGNORECASE)
_CAPACITY_UNIT_BYTES = {"mib": MIB, "mb": MIB, "gib": GIB, "gb": GIB, "g": GIB, "tib": TIB,
                        "tb": TIB}  # fmt: skip
_CAPACITY_UNIT_LABEL = {MIB: "MiB", GIB: "GiB", TIB: "TiB"}
MAX_CAPACITY_BYTES = 2**50  # a capacity past 1 PiB is a typo, not a GPU


def _name_words(text: str) -> list[str]:
    """Lowercase words of a GPU name with separators gone and sizes spelled one way ("80gb")."""
    words = [word for word in re.split(r"[^a-z0-9]+", text.lower()) if word]
    merged: list[str] = []
    for word in words:
        if word in _MEMORY_UNIT_WORDS and merged and merged[-1].isdigit():
            merged[-1] += "gb"
            continue
        size = _MEMORY_SIZE_WORD.match(word)
        merged.append(f"{size.group(1)}gb" if size else word)
    return merged


def _key(words: list[str]) -> str:
    return "".join(words)


def _without(words: list[str], dropped: frozenset[str]) -> list[str]:
    return [word for word in words if word not in dropped]


@lru_cache(maxsize=1)
def _alias_index() -> dict[str, GpuSpec]:
    """Every spelling of every catalog GPU, reduced to a key, mapped to its entry."""
    index: dict[str, GpuSpec] = {}
    for spec in _CATALOG:
        for spelling in (spec.name, *spec.aliases, *spec.nvml_names):
            words = _name_words(spelling)
            for key in (_key(words), _key(_without(words, _VENDOR_WORDS))):
                claimed = index.setdefault(key, spec)
                if claimed.name != spec.name:
                    raise AssertionError(
                        f"GPU alias {spelling!r} is claimed by both {claimed.name} and {spec.name}"
                    )
    return index


def _lookup(name: str) -> GpuSpec | None:
    """The catalog entry a name means, or None; never reads the name as a capacity."""
    index = _alias_index()
    words = _name_words(name)
    without_vendor = _without(words, _VENDOR_WORDS)
    candidates = (words, without_vendor, _without(without_vendor, _FORM_FACTOR_WORDS))
    for candidate in candidates:
        if candidate and (spec := index.get(_key(candidate))) is not None:
            return spec
    return None


def _close_matches(name: str, limit: int = 5) -> list[str]:
    import difflib

    index = _alias_index()
    key = _key(_without(_name_words(name), _VENDOR_WORDS))
    suggestions: list[str] = []
    for match in difflib.get_close_matches(key, list(index), n=40, cutoff=0.6):
        canonical = index[match].name
        if canonical not in suggestions:
            suggestions.append(canonical)
        if len(suggestions) == limit:
            break
    return suggestions


def _parse_capacity(text: str) -> tuple[int, str] | None:
    """Bytes and a display name for "24GiB", "80GB", "16 g", "1.5TiB"; None for anything else.

    GB means GiB here: GPU memory is sold in binary gigabytes under the GB label (an "80GB"
    A100 reports exactly 80 GiB), so "80GB" and "80GiB" are the same GPU.
    """
    match = _CAPACITY.match(text)
    if match is None:
        return None
    unit_bytes = _CAPACITY_UNIT_BYTES[match.group(2).lower()]
    amount = float(match.group(1))
    if not amount * unit_bytes <= MAX_CAPACITY_BYTES:  # inf too: no GPU holds a PiB
        return None
    capacity_bytes = int(amount * unit_bytes)
    if capacity_bytes <= 0:
        return None
    return capacity_bytes, f"{amount:g}{_CAPACITY_UNIT_LABEL[unit_bytes]}"


def generic_gpu(capacity_bytes: int, name: str | None = None) -> GpuSpec:
    """A GPU known only by its memory: bf16 assumed, no fp8, no compute capability."""
    return GpuSpec(
        name=name or f"{capacity_bytes / GIB:g}GiB",
        vendor="unknown",
        marketed_gib=capacity_bytes / GIB,
        capacity_bytes=capacity_bytes,
        bf16=True,
        fp8=False,
        generic=True,
        note="generic GPU of the given capacity; bf16 support assumed",
    )


def find_gpu(name: str) -> GpuSpec:
    """The GPU a `--gpu` value names: a catalog GPU under any of its spellings, or a capacity.

    Raises UnknownGpuError (a ValueError) with up to five close matches otherwise.
    """
    spec = _lookup(name)
    if spec is not None:
        return spec
    capacity = _parse_capacity(name)
    if capacity is not None:
        capacity_bytes, display_name = capacity
        return generic_gpu(capacity_bytes, name=display_name)
    raise UnknownGpuError(name, _close_matches(name))


def gpu_from_flag(name: str, *, where: str = "--gpu") -> GpuSpec:
    """`find_gpu` for a name the user typed as an option or a setting: an unknown one is a
    usage error (exit 2) whose one line names the close matches."""
    from llmmem.errors import UsageError

    if not name.strip():  # `--gpu "$GPU"` with the variable unset: not "no GPU, no fit check"
        raise UsageError(
            f"{where} is empty: name a GPU (A100-80GB, RTX-4090) or a capacity (24GiB)"
        )
    try:
        return find_gpu(name)
    except UnknownGpuError as err:
        raise UsageError(f"{where}: {err}" if where != "--gpu" else str(err)) from None


def all_gpus() -> list[GpuSpec]:
    """The catalog, newest architectures first within each vendor (NVIDIA, then AMD)."""
    return list(_CATALOG)


def _catalog_match(nvml_name: str, total_bytes: int) -> GpuSpec | None:
    spec = _lookup(nvml_name)
    if spec is None:
        return None
    if abs(spec.capacity_bytes - total_bytes) > DETECTED_CAPACITY_TOLERANCE * spec.capacity_bytes:
        return None
    return spec


def _mib_field(field: str) -> int | None:
    """Bytes from an nvidia-smi MiB field ("81920", "81920 MiB"); None for "[N/A]" and the like."""
    number = field.strip().removesuffix("MiB").strip()
    try:
        mib = float(number)
    except ValueError:
        return None
    if mib < 0 or mib != mib:  # negative or NaN
        return None
    return int(mib * MIB)


def parse_nvidia_smi_csv(output: str) -> list[DetectedGpu]:
    """The GPUs in the output of
    `nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv,noheader,nounits`.

    Lines that do not parse (a missing total, an error message) are skipped; a free of "[N/A]"
    becomes None.
    """
    detected: list[DetectedGpu] = []
    for line in output.splitlines():
        fields = line.split(",")
        if len(fields) < 4:
            continue
        index_text, total_text, free_text = fields[0].strip(), fields[-2], fields[-1]
        nvml_name = ",".join(fields[1:-2]).strip()
        total_bytes = _mib_field(total_text)
        if not index_text.isdigit() or not nvml_name or not total_bytes:
            continue
        detected.append(
            DetectedGpu(
                index=int(index_text),
                nvml_name=nvml_name,
                total_bytes=total_bytes,
                free_bytes=_mib_field(free_text),
                spec=_catalog_match(nvml_name, total_bytes),
                source="nvidia-smi",
            )
        )
    return detected


def _detect_with_nvml() -> list[DetectedGpu] | None:
    """The GPUs NVML lists, or None when pynvml or the driver is missing or fails."""
    import contextlib
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        detected: list[DetectedGpu] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            raw_name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(raw_name, bytes):
                raw_name = raw_name.decode(errors="replace")
            nvml_name = str(raw_name).strip()
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            total_bytes = int(memory.total)
            detected.append(
                DetectedGpu(
                    index=index,
                    nvml_name=nvml_name,
                    total_bytes=total_bytes,
                    free_bytes=int(memory.free),
                    spec=_catalog_match(nvml_name, total_bytes),
                    source="nvml",
                )
            )
        return detected
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _stop(process: subprocess.Popen[str]) -> None:
    """Kill a started nvidia-smi (and anything it started) without waiting long for it."""
    import contextlib
    import os
    import signal
    import subprocess

    with contextlib.suppress(OSError):
        if hasattr(os, "killpg"):
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=0.5)
    if process.stdout is not None:
        with contextlib.suppress(OSError):
            process.stdout.close()


def _detect_with_nvidia_smi(timeout_s: float) -> list[DetectedGpu]:
    """The GPUs nvidia-smi lists; [] when it is missing, fails, hangs or prints garbage."""
    import shutil
    import subprocess

    executable = shutil.which("nvidia-smi")
    if executable is None:
        return []
    try:
        process = subprocess.Popen(
            [executable, NVIDIA_SMI_QUERY, NVIDIA_SMI_FORMAT],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except (OSError, ValueError):
        return []
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        return []
    except OSError:
        _stop(process)
        return []
    if process.returncode != 0:
        return []
    return parse_nvidia_smi_csv(output)


def detect_local_gpus(nvidia_smi_timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[DetectedGpu]:
    """The GPUs of this machine, from NVML when pynvml is installed, else from nvidia-smi.

    Returns [] quietly when there is no GPU, no driver, no nvidia-smi, or an answer that cannot
    be read; it never raises and never prints.
    """
    from_nvml = _detect_with_nvml()
    if from_nvml:
        return from_nvml
    try:
        return _detect_with_nvidia_smi(nvidia_smi_timeout_s)
    except Exception:
        return []
