"""Live discovery through AMD's `amdsmi` library, passed in as a module so tests use a fake."""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.model import Device
from slurm_hetero.vendors._rocm import build_device, missing_facts
from slurm_hetero.vendors._rocm_facts import BDF, HEX_ID, Facts, clean

logger = logging.getLogger("slurm_hetero.vendors.amd")  # the vendor's channel, as before the split


def load_amdsmi() -> Any | None:
    """The amdsmi module, or None when it is not installed or its library does not load."""
    try:
        return importlib.import_module("amdsmi")
    except Exception as e:  # a broken vendor library must fall back to the tools, not stop discovery
        logger.debug("amdsmi unavailable (%s); using the amd-smi / rocm-smi tools", e)
        return None


def _library_call(module: Any, name: str, *args: Any) -> Any:
    try:
        return getattr(module, name)(*args)
    except Exception as e:  # AmdSmiException and friends: report them as one line
        raise HeteroError(
            f"amdsmi.{name}() failed: {e}; check the amdgpu driver with `amd-smi static`"
        ) from e


def _optional(module: Any, name: str, *args: Any) -> Any:
    """A library query whose failure (unsupported on this GPU or release) means "not reported"."""
    try:
        return getattr(module, name)(*args)
    except Exception as e:  # the field is simply unknown
        logger.debug("amdsmi.%s: %s", name, e)
        return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = clean(value)
    return int(text) if text is not None and re.fullmatch(r"-?\d+", text) else None


def _hex_id(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"0x{value:04x}"
    text = clean(value)
    return text.lower() if text and HEX_ID.match(text.lower()) else None


def amdsmi_facts(module: Any, handle: Any) -> Facts:
    """One GPU's facts from the amdsmi library (every query optional)."""

    def mapping(name: str) -> Mapping[str, Any]:
        value = _optional(module, name, handle)
        return value if isinstance(value, Mapping) else {}

    asic, vram = mapping("amdsmi_get_gpu_asic_info"), mapping("amdsmi_get_gpu_vram_info")
    numa, affinity = (
        _as_int(_optional(module, n, handle))
        for n in ("amdsmi_topo_get_numa_node_number", "amdsmi_get_gpu_topo_numa_affinity")
    )
    bdf = clean(_optional(module, "amdsmi_get_gpu_device_bdf", handle))
    memory = _as_int(vram.get("vram_size", vram.get("vram_size_mb")))
    return Facts(
        name=clean(asic.get("market_name")),
        device_id=_hex_id(asic.get("device_id")),
        memory_mib=memory if memory and memory > 0 else None,
        bdf=bdf.lower() if bdf and BDF.match(bdf.lower()) else None,
        numa_node=numa if numa is not None and numa >= 0 else None,
        numa_affinity=affinity if affinity is not None and affinity >= 0 else None,
        uuid=clean(_optional(module, "amdsmi_get_gpu_device_uuid", handle)),
        compute_partition=clean(_optional(module, "amdsmi_get_gpu_compute_partition", handle)),
        memory_partition=clean(_optional(module, "amdsmi_get_gpu_memory_partition", handle)),
        driver_version=clean(mapping("amdsmi_get_gpu_driver_info").get("driver_version")),
        render_minor=_as_int(mapping("amdsmi_get_gpu_enumeration_info").get("drm_render")),
    )


def xgmi_code(module: Any) -> int | None:
    """The library's numeric XGMI link type (renumbered between releases, so found by name)."""
    for enum_name, member in (("AmdSmiLinkType", "AMDSMI_LINK_TYPE_XGMI"), ("AmdSmiIoLinkType", "XGMI")):
        value = getattr(getattr(module, enum_name, None), member, None)
        if value is not None:
            return int(value)
    return None


def amdsmi_links(module: Any, handles: Sequence[Any]) -> dict[int, dict[int, str]]:
    """Direct (one-hop) XGMI links between every pair of GPUs."""
    code = xgmi_code(module)
    if code is None:
        logger.debug("amdsmi has no XGMI link type constant; links left out")
        return {}
    links: dict[int, dict[int, str]] = {}
    for i, src in enumerate(handles):
        for j, dst in enumerate(handles):
            info = _optional(module, "amdsmi_topo_get_link_type", src, dst) if i != j else None
            if not isinstance(info, Mapping) or _as_int(info.get("type")) != code:
                continue
            hops = _as_int(info.get("hops"))
            if hops is None or hops <= 1:
                links.setdefault(i, {})[j] = "xgmi"
    return links


def devices_from_amdsmi(module: Any) -> list[Device]:
    """Live discovery through the amdsmi library; `module` is amdsmi itself or a test fake."""
    _library_call(module, "amdsmi_init")
    try:
        handles = list(_library_call(module, "amdsmi_get_processor_handles"))
        facts = {i: amdsmi_facts(module, h) for i, h in enumerate(handles)}
        links = amdsmi_links(module, handles)
    finally:
        _optional(module, "amdsmi_shut_down")
    for index, gpu in facts.items():
        if missing := missing_facts(gpu):
            raise HeteroError(
                f"amdsmi reports no {' or '.join(missing)} for GPU {index}; compare `amd-smi static`"
            )
    return [build_device("amd", i, facts[i], links.get(i, {}), None, None) for i in sorted(facts)]
