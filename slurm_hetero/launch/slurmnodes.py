"""Node records from what Slurm already knows (`scontrol show node`), for clusters without an
installed inventory. Pure. Each `Gres=gpu:TYPE:N` becomes N devices with the catalog facts of TYPE;
a type the catalog lacks is an error when a model is laid out, else a device with no vendor traits
(the rank then sees only Slurm's own visible-device variables, as under torchrun).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.errors import SlurmNodesError
from slurm_hetero.core.model import Device, NodeInventory, SlurmDevice, SlurmNode, VendorTraits
from slurm_hetero.inventory.document import DEFAULT_INVENTORY
from slurm_hetero.slurm.scontrol import NodeGres
from slurm_hetero.vendors import vendor_traits

UNKNOWN_VENDOR = VendorTraits(name="unknown")


def gres_records(
    gres: Mapping[str, NodeGres], names: Sequence[str], catalog: Catalog, need_facts: bool
) -> dict[str, SlurmNode]:
    """Node records of `names` from Slurm's GPU types and counts (the module docstring)."""
    traits = vendor_traits()
    if missing := [n for n in names if n not in gres]:
        raise SlurmNodesError(f"scontrol show node does not list {', '.join(missing)}")
    out = {}
    for name in names:
        devices: list[SlurmDevice] = []
        for gres_type, count in gres[name].gpus:
            spec = catalog.by_type(gres_type)
            if spec is None and need_facts:
                raise SlurmNodesError(
                    f"{name}: Slurm's GPU type {gres_type or '(none)'!r} is not in the catalog and no "
                    f"inventory is installed; install one at {DEFAULT_INVENTORY} "
                    "(slurm-hetero discover, inventory merge), pass --inventory, or add the model "
                    "to /etc/slurm-hetero/models.d/"
                )
            if spec is None:  # a device seen only through Slurm's own variables
                spec = DeviceSpec(
                    gres_type, "unknown", gres_type, (), 0.0, "scontrol show node (not in the catalog)"
                )
            vendor = traits.get(spec.vendor, UNKNOWN_VENDOR)
            for _ in range(count):
                device = Device(spec.vendor, spec.name, len(devices), "", None, gres_type)
                devices.append(SlurmDevice(device, vendor, spec))
        record = NodeInventory(name, tuple(d.device for d in devices))
        out[name] = SlurmNode(record, tuple(devices), (), (), 1)
    return out
