"""GPU models Lockstep knows: normalised names, aliases and datasheet figures.

A leaf module (no imports from the project) so that models, providers, policies
and the perf model all agree on one spelling per GPU. Figures are vendor
datasheet numbers: dense (no sparsity) bf16 tensor TFLOP/s (fp16 for GPUs
without bf16), memory in GB, memory bandwidth in GB/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    family: str
    tflops_bf16: float
    memory_gb: float
    mem_bw_gbps: float
    datacenter: bool = True


_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("B200", "B200", 2250.0, 180.0, 8000.0),
    GpuSpec("H200", "H200", 989.0, 141.0, 4800.0),
    GpuSpec("H100-SXM", "H100", 989.0, 80.0, 3350.0),
    GpuSpec("H100-NVL", "H100", 835.0, 94.0, 3900.0),
    GpuSpec("H100-PCIe", "H100", 756.0, 80.0, 2000.0),
    GpuSpec("A100-SXM-80GB", "A100", 312.0, 80.0, 2039.0),
    GpuSpec("A100-SXM-40GB", "A100", 312.0, 40.0, 1555.0),
    GpuSpec("A100-PCIe-80GB", "A100", 312.0, 80.0, 1935.0),
    GpuSpec("A100-PCIe-40GB", "A100", 312.0, 40.0, 1555.0),
    GpuSpec("L40S", "L40S", 362.0, 48.0, 864.0),
    GpuSpec("L40", "L40", 181.0, 48.0, 864.0),
    GpuSpec("L4", "L4", 121.0, 24.0, 300.0),
    GpuSpec("A40", "A40", 150.0, 48.0, 696.0),
    GpuSpec("A10G", "A10", 70.0, 24.0, 600.0),
    GpuSpec("A10", "A10", 125.0, 24.0, 600.0),
    GpuSpec("RTX-6000-Ada", "RTX-6000-Ada", 364.0, 48.0, 960.0, datacenter=False),
    GpuSpec("RTX-A6000", "RTX-A6000", 155.0, 48.0, 768.0, datacenter=False),
    GpuSpec("RTX-5090", "RTX-5090", 209.0, 32.0, 1792.0, datacenter=False),
    GpuSpec("RTX-4090", "RTX-4090", 165.0, 24.0, 1008.0, datacenter=False),
    GpuSpec("RTX-3090", "RTX-3090", 71.0, 24.0, 936.0, datacenter=False),
    GpuSpec("V100-32GB", "V100", 125.0, 32.0, 900.0),
    GpuSpec("V100-16GB", "V100", 125.0, 16.0, 900.0),
    GpuSpec("T4", "T4", 65.0, 16.0, 320.0),
    GpuSpec("K80", "K80", 8.7, 12.0, 240.0),
)

GPU_SPECS: dict[str, GpuSpec] = {s.name: s for s in _SPECS}
FAMILIES: dict[str, tuple[str, ...]] = {}
for _s in _SPECS:
    FAMILIES.setdefault(_s.family, ())
    FAMILIES[_s.family] = (*FAMILIES[_s.family], _s.name)

# Spellings seen in the wild (AWS GpuInfo, Vast gpu_name, Slurm GRES types,
# SkyPilot catalogs), folded to lower case without separators.
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
    "b200": "B200",
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
}


def _fold(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))


_FOLDED_NAMES = {_fold(n): n for n in GPU_SPECS}


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


def accepted_models(name: str) -> tuple[str, ...] | None:
    """What a job's ``gpu: NAME`` accepts: a family ("A100") or one model."""
    key = _fold(name)
    for family, members in FAMILIES.items():
        if _fold(family) == key and len(members) > 1:
            return members
    canon = normalise_gpu(name)
    return (canon,) if canon else None


def spec_of(model: str) -> GpuSpec:
    return GPU_SPECS[model]
