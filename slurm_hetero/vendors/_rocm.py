"""What AMD and Hygon share: `parse_captures` detects each capture's format, parses it (`PARSERS`)
and `merge`s one node's captures per GPU index into Device records; plus their sysfs reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from slurm_hetero.core.errors import ParseError
from slurm_hetero.core.model import Capture, Device, Link, VendorTraits
from slurm_hetero.vendors._amd_smi import (
    AMD_SMI_HINT,
    AMDSMI_BLOCK,
    AMDSMI_TOPO_TABLE,
    AMDSMI_VERSION,
    parse_amdsmi_blocks,
    parse_amdsmi_topology,
    parse_amdsmi_version,
)
from slurm_hetero.vendors._rocm_facts import Dialect, Facts, Parsed, set_fact
from slurm_hetero.vendors._rocm_smi import BANNER, parse_smi_json, parse_smi_text
from slurm_hetero.vendors._table import CPULIST
from slurm_hetero.vendors.base import Vendor

RENDER_MINOR_BASE = 128
PCI_ROOT = Path("/sys/bus/pci/devices")


def detect(capture: Capture, dialect: Dialect) -> str:
    """Which output a capture is: json, smi-text, amd-smi-blocks, amd-smi-topology, amd-smi-version."""
    lines = capture.text.splitlines()
    if not capture.text.strip():
        raise dialect.error(capture, "empty capture")
    if capture.text.lstrip().startswith("{"):
        return "json"
    checks = (
        ("smi-text", BANNER),
        ("amd-smi-blocks", AMDSMI_BLOCK),
        ("amd-smi-topology", AMDSMI_TOPO_TABLE),
        ("amd-smi-version", AMDSMI_VERSION),
    )
    for kind, pattern in checks:
        if any(pattern.match(line) for line in lines):
            return kind
    first = next(line for line in lines if line.strip())
    raise dialect.error(capture, f"not a {dialect.tool} or amd-smi capture this parser knows", 1, first)


PARSERS: dict[str, Callable[[Capture, Dialect], Parsed]] = {
    "json": parse_smi_json,
    "smi-text": parse_smi_text,
    "amd-smi-blocks": parse_amdsmi_blocks,
    "amd-smi-topology": parse_amdsmi_topology,
    "amd-smi-version": parse_amdsmi_version,
}


# merging ---------------------------------------------------------------------------------------
def merge(parsed: Sequence[Parsed], dialect: Dialect, model: str | None = None) -> list[Device]:
    """One node's captures as devices in index order; `model` (`--model`) names what they do not."""
    indexed = [p for p in parsed if p.gpus]
    hint = AMD_SMI_HINT if any(p.tool == "amd-smi" for p in parsed) else dialect.hint
    if not indexed:
        raise dialect.error(
            parsed[0].capture,
            f"{parsed[0].what} carries no per-GPU device data; {dialect.advice(hint)}",
            tool=parsed[0].tool,
        )
    _check_same_gpus(indexed, dialect)
    facts = {index: Facts() for index in indexed[0].gpus}
    for p in indexed:
        for index, gpu in p.gpus.items():
            fail = _conflict(p, index, dialect)
            for f in dataclasses.fields(Facts):
                set_fact(facts[index], f.name, getattr(gpu, f.name), fail)
    links = _collect_links(parsed, facts, dialect)
    if model is None:
        _require(facts, indexed[0], hint, dialect)
    else:
        _use_model(facts, indexed[0], model, dialect)
    driver = next((p.driver_version for p in parsed if p.driver_version), None)
    runtime = next((p.runtime_version for p in parsed if p.runtime_version), None)
    return [
        build_device(dialect.vendor, i, facts[i], links.get(i, {}), driver, runtime) for i in sorted(facts)
    ]


def _check_same_gpus(indexed: Sequence[Parsed], dialect: Dialect) -> None:
    first = indexed[0]
    for p in indexed[1:]:
        if set(p.gpus) != set(first.gpus):
            raise dialect.error(
                p.capture,
                f"{p.what} lists {dialect.unit}s {sorted(p.gpus)} but {first.capture.source} "
                f"lists {sorted(first.gpus)}; captures must come from one node",
                tool=p.tool,
            )


def _conflict(p: Parsed, index: int, dialect: Dialect) -> Callable[[str], ParseError]:
    """The error for facts of GPU `index` in capture `p` that contradict an earlier capture."""
    no, line = p.where(index)

    def fail(message: str) -> ParseError:
        text = f"{dialect.unit} {index}: {message} (captures from different nodes?)"
        return dialect.error(p.capture, text, no, line, tool=p.tool)

    return fail


def _collect_links(
    parsed: Sequence[Parsed], facts: Mapping[int, Facts], dialect: Dialect
) -> dict[int, dict[int, str]]:
    by_bdf = {f.bdf: i for i, f in facts.items() if f.bdf}
    links: dict[int, dict[int, str]] = {}
    for p in parsed:
        for (src, dst), kind in p.link_kind.items():
            a, b = (_bdf_index(p, key, by_bdf, dialect) for key in (src, dst)) if p.by_bdf else (src, dst)
            if a not in facts or b not in facts:
                raise dialect.error(
                    p.capture,
                    f"link between {dialect.unit}s {a} and {b} that the device captures do not list",
                    tool=p.tool,
                )
            if kind == "XGMI" and p.hops.get((src, dst), 1) <= 1 and a != b:
                links.setdefault(a, {})[b] = "xgmi"
    return links


def _bdf_index(p: Parsed, bdf: str, by_bdf: Mapping[str, int], dialect: Dialect) -> int:
    if bdf not in by_bdf:
        raise dialect.error(
            p.capture,
            f"{p.what} names GPU {bdf}, which no other capture maps to a GPU index; "
            f"also capture `{AMD_SMI_HINT}` on the same node",
            tool=p.tool,
        )
    return by_bdf[bdf]


def missing_facts(facts: Facts) -> list[str]:
    """What a device record cannot do without: a model name (or device id) and the memory size."""
    missing = [] if (facts.name or facts.short_name or facts.device_id) else ["model"]
    return missing + ([] if facts.memory_mib else ["memory size"])


def _require(facts: Mapping[int, Facts], first: Parsed, hint: str, dialect: Dialect) -> None:
    for index in sorted(facts):
        if missing := missing_facts(facts[index]):
            no, line = first.where(index)
            message = f"no {' or '.join(missing)} for {dialect.unit} {index} in {first.what}; "
            advice = dialect.advice(hint) + dialect.model_note
            raise dialect.error(first.capture, message + advice, no, line, tool=first.tool)


def _use_model(facts: Mapping[int, Facts], first: Parsed, model: str, dialect: Dialect) -> None:
    """Give every device the admin's model; a capture that names another model is an error."""
    for index in sorted(facts):
        named = facts[index].name or facts[index].short_name
        if named and named.strip().lower() != model.strip().lower():
            no, line = first.where(index)
            message = f"{dialect.unit} {index} is {named} in the captures, not --model {model}"
            raise dialect.error(first.capture, message, no, line, tool=first.tool)
        facts[index].name = named or model


def build_device(
    vendor: str, index: int, facts: Facts, links: Mapping[int, str], driver: str | None, runtime: str | None
) -> Device:
    """The Device record of one merged GPU (see the module docstring for each field's source)."""
    minor = facts.render_minor if facts.render_minor is not None else RENDER_MINOR_BASE + index
    partition = "/".join(p for p in (facts.compute_partition, facts.memory_partition) if p) or None
    numa = facts.numa_affinity if facts.numa_affinity is not None else facts.numa_node
    return Device(
        vendor=vendor,
        model=facts.name or facts.short_name or facts.device_id or "",
        index=index,
        file=f"/dev/dri/renderD{minor}",
        memory_mib=facts.memory_mib,
        numa_node=numa,
        cores=facts.cores,
        uuid=facts.uuid,
        pci_bus_id=facts.bdf,
        links=tuple(Link(peer=peer, kind=kind) for peer, kind in sorted(links.items())),
        driver_version=facts.driver_version or driver,
        runtime_version=runtime,
        partition_mode=partition,
    )


def parse_captures(
    captures: Sequence[Capture], dialect: Dialect, formats: Sequence[str], model: str | None = None
) -> list[Device]:
    """Detect, parse and merge (`model`: see `merge`); a format outside `formats` is refused."""
    if not captures:
        raise ParseError(dialect.vendor, dialect.tool, "no captures given", "<none>")
    parsed = []
    for capture in captures:
        kind = detect(capture, dialect)
        if kind not in formats:  # Hygon's tools are forks of rocm-smi, never of amd-smi
            raise dialect.error(
                capture, "this is amd-smi output, which is AMD's; use --vendor amd", 1, tool="amd-smi"
            )
        parsed.append(PARSERS[kind](capture, dialect))
    return merge(parsed, dialect, model)


def accelerator_pci_vendors(root: Path = PCI_ROOT) -> set[str] | None:
    """PCI vendor ids of display/accelerator devices (class 0x03, 0x12); None if sysfs is unreadable."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return None
    vendors = set()
    for entry in entries:
        try:
            pci_class = (entry / "class").read_text().strip().lower()
            vendor = (entry / "vendor").read_text().strip().lower()
        except OSError:
            continue
        if pci_class.startswith(("0x03", "0x12")):
            vendors.add(vendor)
    return vendors


def with_local_cpus(devices: Sequence[Device], root: Path = PCI_ROOT) -> list[Device]:
    """Fill `cores` from /sys/bus/pci/devices/<bdf>/local_cpulist where the kernel reports it."""
    out = []
    for device in devices:
        cpus = None
        if device.pci_bus_id and device.cores is None:
            try:
                cpus = (root / device.pci_bus_id / "local_cpulist").read_text().strip()
            except OSError:
                cpus = None
        out.append(dataclasses.replace(device, cores=cpus) if cpus and CPULIST.match(cpus) else device)
    return out


class RocmVendor(Vendor):
    """What AMD and Hygon (a fork of ROCm) share: device isolation, collectives, parsing, sysfs."""

    # ROCm isolates at two levels: ROCR_VISIBLE_DEVICES picks devices by index, then HIP (and
    # CUDA_VISIBLE_DEVICES, which HIP also reads, and GPU_DEVICE_ORDINAL, read by HIP and OpenCL)
    # index inside that set (ROCm's GPU isolation docs; Slurm's gres.conf Flags=amd_gpu_env).
    traits = VendorTraits(
        visible_devices_env="ROCR_VISIBLE_DEVICES",
        slurm_gpu_env="amd_gpu_env",  # ROCR only: Slurm's CUDA_ would index inside it
        relative_visible_envs=("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"),
        torch_backend="nccl",  # RCCL (and the DTK's fork of it) presents as NCCL in torch
        ccl_env_prefix="NCCL",  # RCCL reads NCCL_* variables
    )
    dialect: ClassVar[Dialect]
    formats: ClassVar[tuple[str, ...]]  # the `PARSERS` kinds this vendor owns
    pci_root: ClassVar[Path] = PCI_ROOT

    def parse(self, captures: Sequence[Capture]) -> list[Device]:
        return parse_captures(captures, self.dialect, self.formats)

    def probe(self) -> list[Device]:
        return with_local_cpus(super().probe(), self.pci_root)
