"""Vendor registry: every module in this package registers itself; plugins come by entry point."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from slurm_hetero.core.errors import HeteroError
from slurm_hetero.core.model import VendorTraits
from slurm_hetero.vendors.base import Vendor

logger = logging.getLogger(__name__)

_REGISTRY: dict[str, Vendor] = {}
_loaded = False


def register_vendor(name: str) -> Callable[[type[Vendor]], type[Vendor]]:
    """Class decorator: register one instance of the vendor class under `name`."""

    def wrap(cls: type[Vendor]) -> type[Vendor]:
        cls.name = name
        cls.traits = dataclasses.replace(cls.traits, name=name)
        _REGISTRY[name] = cls()
        return cls

    return wrap


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        try:
            importlib.import_module(f"{__name__}.{info.name}")
        except Exception as e:  # a broken vendor module must not take discovery or the TaskProlog down
            logger.error("vendor module %s failed to import, skipped: %s", info.name, e)
    for ep in _plugin_entry_points():
        try:
            ep.load()
        except Exception as e:  # one broken plugin never stops the others
            logger.warning("vendor plugin %s skipped: %s", ep.name, e)


def _plugin_entry_points() -> list[Any]:
    """Entry points of group `slurm_hetero.vendors` (Python 3.9's entry_points() takes no group)."""
    found = entry_points()
    if hasattr(found, "select"):
        return list(found.select(group="slurm_hetero.vendors"))
    return list(found.get("slurm_hetero.vendors", []))  # type: ignore[attr-defined]


def all_vendors() -> list[Vendor]:
    """Every registered vendor, sorted by name."""
    _load_all()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def get_vendor(name: str) -> Vendor:
    """The vendor registered as `name`; an error listing valid names otherwise."""
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise HeteroError(f"unknown vendor {name!r}; known vendors: {', '.join(sorted(_REGISTRY))}") from None


def vendor_traits() -> dict[str, VendorTraits]:
    """Every registered vendor's traits by name: what engine, launcher, render and TaskProlog use."""
    return {v.name: v.traits for v in all_vendors()}


__all__ = ["Vendor", "register_vendor", "all_vendors", "get_vendor", "vendor_traits"]
