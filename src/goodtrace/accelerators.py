"""Peak dense bf16 FLOP/s of common accelerators, for program goodput (MFU).

Figures are the vendors' published dense (no sparsity) bf16 peaks per device. Look a name up
with ``peak_flops("h100")`` (unknown names raise ``KeyError`` listing the known ones), or a
device name as the framework reports it with ``peak_flops_for_device("NVIDIA H100 80GB HBM3")``
(None when unknown). A user's own peak always wins over this table.
"""

from __future__ import annotations

from typing import Final

# name -> (peak dense bf16 FLOP/s per device, description)
ACCELERATORS: Final[dict[str, tuple[float, str]]] = {
    "a100": (312e12, "NVIDIA A100 (SXM/PCIe), bf16 dense"),
    "h100": (989e12, "NVIDIA H100 SXM, bf16 dense"),
    "h100-pcie": (756e12, "NVIDIA H100 PCIe, bf16 dense"),
    "h200": (989e12, "NVIDIA H200 SXM, bf16 dense"),
    "gh200": (989e12, "NVIDIA GH200 (H100 GPU), bf16 dense"),
    "b200": (2250e12, "NVIDIA B200, bf16 dense"),
    "v100": (125e12, "NVIDIA V100, fp16 tensor cores"),
    "a10g": (70e12, "NVIDIA A10G, bf16 dense"),
    "l4": (121e12, "NVIDIA L4, bf16 dense"),
    "l40s": (362e12, "NVIDIA L40S, bf16 dense"),
    "mi300x": (1307e12, "AMD Instinct MI300X, bf16 dense"),
    "tpu-v4": (275e12, "Google TPU v4 chip, bf16"),
    "tpu-v5e": (197e12, "Google TPU v5e chip, bf16"),
    "tpu-v5p": (459e12, "Google TPU v5p chip, bf16"),
    "tpu-v6e": (918e12, "Google TPU v6e (Trillium) chip, bf16"),
}

_ALIASES: Final[dict[str, str]] = {
    "v4": "tpu-v4", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "v6e": "tpu-v6e", "trillium": "tpu-v6e",
    "h100-sxm": "h100", "h200-sxm": "h200", "a100-sxm": "a100", "a100-pcie": "a100",
}


def normalise(name: str) -> str:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key.startswith("tpuv"):
        key = "tpu-v" + key[4:]
    return _ALIASES.get(key, key)


def peak_flops(name: str) -> float:
    """Peak dense bf16 FLOP/s of one device of the named accelerator."""
    key = normalise(name)
    if key not in ACCELERATORS:
        raise KeyError(f"unknown accelerator {name!r}; known: {', '.join(sorted(ACCELERATORS))}")
    return ACCELERATORS[key][0]


# Substrings of device names as frameworks report them (torch.cuda.get_device_name), most
# specific first, and the table entry each one means.
_DEVICE_NAMES: Final[tuple[tuple[str, str], ...]] = (
    ("h100 pcie", "h100-pcie"),
    ("gh200", "gh200"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("b200", "b200"),
    ("a100", "a100"),
    ("a10g", "a10g"),
    ("l40s", "l40s"),
    ("l4", "l4"),
    ("v100", "v100"),
    ("mi300x", "mi300x"),
)


def peak_flops_for_device(device_name: str) -> float | None:
    """The peak of a device by the name its framework reports, or None when not in the table."""
    lowered = device_name.lower()
    for needle, key in _DEVICE_NAMES:
        if needle in lowered:
            return ACCELERATORS[key][0]
    return None
