"""GPU models Lockstep knows: normalised names, aliases and datasheet figures.

A leaf module (no imports from the project) so that models, providers, policies
and the perf model all agree on one spelling per GPU. Figures are vendor
datasheet numbers: dense (no sparsity) bf16 tensor TFLOP/s (fp16 for GPUs
without bf16), memory in GB, memory bandwidth in GB/s, and the GPU-to-GPU
interconnect inside a node with its bandwidth per GPU (GB/s, both directions).
Vendors quote "with sparsity" figures first; the dense figure is half of it.
Each row names its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache


class Vendor(StrEnum):
    nvidia = "nvidia"
    amd = "amd"


class Runtime(StrEnum):
    """The GPU software stack a container image is built for."""

    cuda = "cuda"
    rocm = "rocm"
    any = "any"  # no GPU-vendor dependency (or an image built for both)


RUNTIME_OF: dict[Vendor, Runtime] = {Vendor.nvidia: Runtime.cuda, Vendor.amd: Runtime.rocm}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    family: str
    tflops_bf16: float
    memory_gb: float
    mem_bw_gbps: float
    datacenter: bool = True
    vendor: Vendor = Vendor.nvidia
    interconnect: str = "PCIe"  # inside a node: NVLink generation, xGMI (Infinity Fabric) or PCIe
    interconnect_gbps: float = 64.0  # per GPU, GB/s, both directions (PCIe 4.0 x16 by default)

    @property
    def runtime(self) -> Runtime:
        return RUNTIME_OF[self.vendor]


_NV, _AMD = Vendor.nvidia, Vendor.amd

_SPECS: tuple[GpuSpec, ...] = (
    # --- NVIDIA Blackwell
    # NVIDIA HGX B300 datasheet (2025): 8 GPUs 36 PF FP16/BF16 sparse, 2.3 TB HBM3e; 8 TB/s; NVLink 5 1.8 TB/s
    GpuSpec("B300", "B300", 2250.0, 288.0, 8000.0, interconnect="NVLink 5", interconnect_gbps=1800.0),
    # NVIDIA GB300 NVL72 datasheet (2025): 72 GPUs 360 PF FP16/BF16 sparse, 288 GB HBM3e and 8 TB/s per GPU
    GpuSpec("GB300", "GB300", 2500.0, 288.0, 8000.0, interconnect="NVLink 5", interconnect_gbps=1800.0),
    # NVIDIA HGX B200 datasheet (2024): 8 GPUs 36 PF FP16/BF16 sparse, 1.44 TB HBM3e, 64 TB/s; NVLink 5
    GpuSpec("B200", "B200", 2250.0, 180.0, 8000.0, interconnect="NVLink 5", interconnect_gbps=1800.0),
    # NVIDIA GB200 NVL72 datasheet (2024): 72 GPUs 360 PF FP16/BF16 sparse, 13.4 TB HBM3e (186 GB per GPU)
    GpuSpec("GB200", "GB200", 2500.0, 186.0, 8000.0, interconnect="NVLink 5", interconnect_gbps=1800.0),
    # NVIDIA RTX PRO 6000 Blackwell (Server/Workstation) datasheet (2025): 96 GB GDDR7, 1.79 TB/s;
    # FP16/BF16 tensor with FP32 accumulate ~504 TFLOPS dense
    GpuSpec("RTX-PRO-6000", "RTX-PRO-6000", 504.0, 96.0, 1792.0, datacenter=False,
            interconnect="PCIe 5.0", interconnect_gbps=128.0),
    # NVIDIA GeForce RTX 5090 (Blackwell GB202 whitepaper): 209.5 TFLOPS FP16/FP32-acc dense, 32 GB GDDR7
    GpuSpec("RTX-5090", "RTX-5090", 209.0, 32.0, 1792.0, datacenter=False,
            interconnect="PCIe 5.0", interconnect_gbps=128.0),
    # --- NVIDIA Hopper
    # NVIDIA H200 datasheet (2024): SXM 1,979 TFLOPS BF16 sparse, 141 GB HBM3e, 4.8 TB/s, NVLink 4 900 GB/s
    GpuSpec("H200", "H200", 989.0, 141.0, 4800.0, interconnect="NVLink 4", interconnect_gbps=900.0),
    # NVIDIA GH200 Grace Hopper datasheet (2024): H100-class GPU, 96 GB HBM3 at 4 TB/s, NVLink-C2C 900 GB/s
    GpuSpec("GH200", "GH200", 989.0, 96.0, 4000.0, interconnect="NVLink-C2C", interconnect_gbps=900.0),
    # NVIDIA H100 datasheet (2023): SXM 1,979 / NVL 1,671 / PCIe 1,513 TFLOPS BF16 sparse
    GpuSpec("H100-SXM", "H100", 989.0, 80.0, 3350.0, interconnect="NVLink 4", interconnect_gbps=900.0),
    GpuSpec("H100-NVL", "H100", 835.0, 94.0, 3900.0, interconnect="NVLink bridge", interconnect_gbps=600.0),
    GpuSpec("H100-PCIe", "H100", 756.0, 80.0, 2000.0, interconnect="PCIe 5.0", interconnect_gbps=128.0),
    # NVIDIA H20 (China-market Hopper, 2024 spec sheet): 148 TFLOPS BF16 dense, 96 GB HBM3, 4.0 TB/s, NVLink 900
    GpuSpec("H20", "H20", 148.0, 96.0, 4000.0, interconnect="NVLink 4", interconnect_gbps=900.0),
    # NVIDIA H800 (China-market H100 SXM): BF16 as H100 SXM, 80 GB HBM3, NVLink cut to 400 GB/s
    GpuSpec("H800", "H800", 989.0, 80.0, 3350.0, interconnect="NVLink 4", interconnect_gbps=400.0),
    # --- NVIDIA Ampere
    # NVIDIA A100 datasheet (2021): 312 TFLOPS BF16 dense; 40 GB 1,555 GB/s, 80 GB 2,039 (SXM) / 1,935 (PCIe)
    GpuSpec("A100-SXM-80GB", "A100", 312.0, 80.0, 2039.0, interconnect="NVLink 3", interconnect_gbps=600.0),
    GpuSpec("A100-SXM-40GB", "A100", 312.0, 40.0, 1555.0, interconnect="NVLink 3", interconnect_gbps=600.0),
    GpuSpec("A100-PCIe-80GB", "A100", 312.0, 80.0, 1935.0),
    GpuSpec("A100-PCIe-40GB", "A100", 312.0, 40.0, 1555.0),
    # NVIDIA A40 datasheet: 149.7 TFLOPS BF16 dense, 48 GB GDDR6, 696 GB/s
    GpuSpec("A40", "A40", 150.0, 48.0, 696.0),
    # AWS G5 (A10G): ~70 TFLOPS FP16 tensor dense, 24 GB; NVIDIA A10 datasheet: 125 TFLOPS BF16 dense
    GpuSpec("A10G", "A10", 70.0, 24.0, 600.0),
    GpuSpec("A10", "A10", 125.0, 24.0, 600.0),
    # NVIDIA RTX A6000 datasheet: 154.8 TFLOPS FP16 tensor dense (FP16 accumulate), 48 GB GDDR6
    GpuSpec("RTX-A6000", "RTX-A6000", 155.0, 48.0, 768.0, datacenter=False),
    # NVIDIA GeForce RTX 3090 (GA102 whitepaper): 71 TFLOPS FP16/FP32-acc dense, 24 GB GDDR6X
    GpuSpec("RTX-3090", "RTX-3090", 71.0, 24.0, 936.0, datacenter=False),
    # --- NVIDIA Ada Lovelace
    # NVIDIA L40S datasheet (2023): 733 TFLOPS BF16 sparse, 48 GB GDDR6, 864 GB/s
    GpuSpec("L40S", "L40S", 362.0, 48.0, 864.0),
    # NVIDIA L40 datasheet: 362 TFLOPS BF16 sparse
    GpuSpec("L40", "L40", 181.0, 48.0, 864.0),
    # NVIDIA L20 (China-market Ada, 2024 spec sheet): 239 TFLOPS FP16 sparse, 48 GB GDDR6, 864 GB/s
    GpuSpec("L20", "L20", 119.5, 48.0, 864.0),
    # NVIDIA L4 datasheet (2023): 242 TFLOPS BF16 sparse, 24 GB GDDR6, 300 GB/s
    GpuSpec("L4", "L4", 121.0, 24.0, 300.0, interconnect="PCIe 4.0 x16"),
    # NVIDIA RTX 6000 Ada datasheet: 728.5 TFLOPS FP8 sparse → 364 BF16 dense (FP32 accumulate), 48 GB
    GpuSpec("RTX-6000-Ada", "RTX-6000-Ada", 364.0, 48.0, 960.0, datacenter=False),
    # NVIDIA GeForce RTX 4090 (Ada whitepaper): 165 TFLOPS FP16/FP32-acc dense, 24 GB GDDR6X
    GpuSpec("RTX-4090", "RTX-4090", 165.0, 24.0, 1008.0, datacenter=False),
    # --- NVIDIA older
    # NVIDIA V100 datasheet: 125 TFLOPS FP16 tensor (SXM2), 16/32 GB HBM2 at 900 GB/s, NVLink 2 300 GB/s
    GpuSpec("V100-32GB", "V100", 125.0, 32.0, 900.0, interconnect="NVLink 2", interconnect_gbps=300.0),
    GpuSpec("V100-16GB", "V100", 125.0, 16.0, 900.0, interconnect="NVLink 2", interconnect_gbps=300.0),
    # NVIDIA T4 datasheet: 65 TFLOPS FP16 tensor, 16 GB GDDR6, 320 GB/s
    GpuSpec("T4", "T4", 65.0, 16.0, 320.0, interconnect="PCIe 3.0", interconnect_gbps=32.0),
    # NVIDIA K80 datasheet: 8.7 TFLOPS FP32 (no tensor cores), 2 × 12 GB
    GpuSpec("K80", "K80", 8.7, 12.0, 240.0, interconnect="PCIe 3.0", interconnect_gbps=32.0),
    # --- AMD Instinct (CDNA)
    # AMD Instinct MI355X datasheet (2025): 5.0 PF FP16/BF16 sparse (2.5 PF dense), 288 GB HBM3E, 8 TB/s;
    # Infinity Fabric (xGMI) 7 links, 1,075 GB/s
    GpuSpec("MI355X", "MI355X", 2516.6, 288.0, 8000.0, vendor=_AMD, interconnect="xGMI",
            interconnect_gbps=1075.0),
    # AMD Instinct MI350X datasheet (2025): 4.6 PF FP16/BF16 sparse, 288 GB HBM3E, 8 TB/s
    GpuSpec("MI350X", "MI350X", 2307.0, 288.0, 8000.0, vendor=_AMD, interconnect="xGMI",
            interconnect_gbps=1075.0),
    # AMD Instinct MI325X datasheet (2024): 1,307.4 TFLOPS BF16 dense, 256 GB HBM3E, 6 TB/s, xGMI 896 GB/s
    GpuSpec("MI325X", "MI325X", 1307.4, 256.0, 6000.0, vendor=_AMD, interconnect="xGMI", interconnect_gbps=896.0),
    # AMD Instinct MI300X datasheet (2023): 1,307.4 TFLOPS BF16 dense, 192 GB HBM3, 5.3 TB/s, xGMI 896 GB/s
    GpuSpec("MI300X", "MI300X", 1307.4, 192.0, 5300.0, vendor=_AMD, interconnect="xGMI", interconnect_gbps=896.0),
    # AMD Instinct MI300A datasheet (2023): APU, 980.6 TFLOPS BF16 dense, 128 GB unified HBM3, 5.3 TB/s
    GpuSpec("MI300A", "MI300A", 980.6, 128.0, 5300.0, vendor=_AMD, interconnect="xGMI", interconnect_gbps=768.0),
    # AMD Instinct MI250X / MI250 datasheets (2021): 383 / 362.1 TFLOPS BF16, 128 GB HBM2e, 3.2 TB/s
    GpuSpec("MI250X", "MI250", 383.0, 128.0, 3277.0, vendor=_AMD, interconnect="xGMI", interconnect_gbps=800.0),
    GpuSpec("MI250", "MI250", 362.1, 128.0, 3277.0, vendor=_AMD, interconnect="xGMI", interconnect_gbps=800.0),
    # AMD Instinct MI210 datasheet (2022): 181 TFLOPS BF16, 64 GB HBM2e, 1.6 TB/s
    GpuSpec("MI210", "MI210", 181.0, 64.0, 1638.0, vendor=_AMD, interconnect="xGMI bridge",
            interconnect_gbps=300.0),
    # --- AMD Radeon PRO (RDNA 3 workstation)
    # AMD Radeon PRO W7900 datasheet (2023): 122.6 TFLOPS FP16 peak, 48 GB GDDR6, 864 GB/s
    GpuSpec("W7900", "W7900", 122.6, 48.0, 864.0, datacenter=False, vendor=_AMD),
)

GPU_SPECS: dict[str, GpuSpec] = {s.name: s for s in _SPECS}
FAMILIES: dict[str, tuple[str, ...]] = {}
for _s in _SPECS:
    FAMILIES.setdefault(_s.family, ())
    FAMILIES[_s.family] = (*FAMILIES[_s.family], _s.name)

# Spellings seen in the wild (AWS GpuInfo, Vast gpu_name, Slurm GRES types,
# SkyPilot catalogs), folded to lower case without separators or vendor words.
_ALIASES: dict[str, str] = {
    "h100": "H100-SXM",
    "h100sxm": "H100-SXM",
    "h100sxm5": "H100-SXM",
    "h10080gbhbm3": "H100-SXM",
    "h100pcie": "H100-PCIe",
    "h100nvl": "H100-NVL",
    "h200": "H200",
    "h200sxm": "H200",
    "h200nvl": "H200",
    "gh200": "GH200",
    "gh20096gb": "GH200",
    "gracehopper": "GH200",
    "h20": "H20",
    "h800": "H800",
    "b200": "B200",
    "hgxb200": "B200",
    "b300": "B300",
    "hgxb300": "B300",
    "gb200": "GB200",
    "gb200nvl72": "GB200",
    "gb300": "GB300",
    "gb300nvl72": "GB300",
    "rtxpro6000": "RTX-PRO-6000",
    "rtxpro6000blackwell": "RTX-PRO-6000",
    "rtxpro6000blackwellserveredition": "RTX-PRO-6000",
    "rtxpro6000blackwellworkstationedition": "RTX-PRO-6000",
    "rtxpro6000s": "RTX-PRO-6000",
    "rtxpro6000wk": "RTX-PRO-6000",
    "a100": "A100-SXM-40GB",
    "a100sxm4": "A100-SXM-40GB",
    "a100sxm440gb": "A100-SXM-40GB",
    "a100sxm": "A100-SXM-40GB",
    "a10040gb": "A100-SXM-40GB",
    "a10080gb": "A100-SXM-80GB",
    "a100sxm80gb": "A100-SXM-80GB",
    "a100sxm480gb": "A100-SXM-80GB",
    "a100x": "A100-PCIe-80GB",
    "a100pcie": "A100-PCIe-40GB",
    "a100pcie40gb": "A100-PCIe-40GB",
    "a100pcie80gb": "A100-PCIe-80GB",
    "a100sxm240gb": "A100-SXM-40GB",
    "l40s": "L40S",
    "l40": "L40",
    "l20": "L20",
    "l4": "L4",
    "a40": "A40",
    "a10g": "A10G",
    "a10": "A10",
    "rtx6000ada": "RTX-6000-Ada",
    "rtx6000adageneration": "RTX-6000-Ada",
    "rtxa6000": "RTX-A6000",
    "a6000": "RTX-A6000",
    "rtx5090": "RTX-5090",
    "geforcertx5090": "RTX-5090",
    "rtx4090": "RTX-4090",
    "geforcertx4090": "RTX-4090",
    "rtx3090": "RTX-3090",
    "geforcertx3090": "RTX-3090",
    "v100": "V100-16GB",
    "v10016gb": "V100-16GB",
    "v10032gb": "V100-32GB",
    "teslav100": "V100-16GB",
    "t4": "T4",
    "teslat4": "T4",
    "k80": "K80",
    "teslak80": "K80",
    "mi355x": "MI355X",
    "mi350x": "MI350X",
    "mi325x": "MI325X",
    "mi300x": "MI300X",
    "mi300x192gb": "MI300X",
    "mi300a": "MI300A",
    "mi250x": "MI250X",
    "mi250": "MI250",
    "mi210": "MI210",
    "w7900": "W7900",
    "radeonprow7900": "W7900",
}

_VENDOR_WORDS = re.compile(r"nvidia|amd|instinct")


@lru_cache(maxsize=4096)  # pure; specs and offers fold the same few names over and over
def _fold(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", _VENDOR_WORDS.sub("", name.lower()))


_FOLDED_NAMES = {_fold(n): n for n in GPU_SPECS}
_FOLDED_FAMILIES = {_fold(f): members for f, members in FAMILIES.items() if len(members) > 1}

# What a GPU model name looks like, known or not: letters and digits (at least one digit), in
# words joined by space, '.', '_' or '-', e.g. "B300", "MI400X", "RTX PRO 6000", "Gaudi 3".
_GPU_NAME = re.compile(r"^(?=[^0-9]*[0-9])[A-Za-z0-9]+(?:[ ._-][A-Za-z0-9]+){0,5}$")
MAX_GPU_NAME = 40


@lru_cache(maxsize=4096)
def normalise_gpu(name: str, memory_gb: float | None = None) -> str | None:
    """The canonical model for a vendor spelling, or None when unknown.

    ``memory_gb`` disambiguates variants sold under one name (A100 40/80 GB,
    V100 16/32 GB), as AWS and Vast report the name and the memory separately.
    """
    key = _fold(name)
    canon = _FOLDED_NAMES.get(key) or _ALIASES.get(key)
    if canon is None:
        return None
    if memory_gb is not None:
        spec = GPU_SPECS[canon]
        if spec.family in ("A100", "V100") and abs(spec.memory_gb - memory_gb) > 8:
            for other in FAMILIES[spec.family]:
                o = GPU_SPECS[other]
                same_form = ("PCIe" in other) == ("PCIe" in canon)
                if same_form and abs(o.memory_gb - memory_gb) <= 8:
                    return other
    return canon


@lru_cache(maxsize=4096)
def accepted_models(name: str) -> tuple[str, ...] | None:
    """What a job's ``gpu: NAME`` accepts: a family ("A100") or one model; None when unknown."""
    key = _fold(name)
    members = _FOLDED_FAMILIES.get(key)
    if members is not None:
        return members
    canon = normalise_gpu(name)
    return (canon,) if canon else None


def looks_like_gpu(name: str) -> bool:
    """True for a name shaped like a GPU model ("B300", "MI400X"), known or not; False for garbage."""
    return len(name) <= MAX_GPU_NAME and _GPU_NAME.match(name) is not None


@lru_cache(maxsize=4096)  # a ValueError is not cached: garbage costs its fold each time
def resolve_request(name: str) -> tuple[str, ...]:
    """The models a requested name stands for.

    A known model or family expands to canonical names; an unknown name that looks
    like a GPU model stands for itself (no market may offer it: that is an answer,
    not an error); anything else is a ValueError.
    """
    models = accepted_models(name)
    if models is not None:
        return models
    if looks_like_gpu(name):
        return (name,)
    raise ValueError(f"{name!r} is not a GPU model name (e.g. H100, A100-SXM-80GB, MI300X, L40S)")


def fold(name: str) -> str:
    """The folded key names are compared by: lower case, no separators, no vendor words."""
    return _fold(name)


def spec_of(model: str) -> GpuSpec:
    return GPU_SPECS[model]
