"""Inventories read YAML strictly (issue 9): plain scalars that YAML 1.1 (PyYAML) and YAML 1.2 read
differently are refused with the key, the line and both readings; nothing is read as octal,
base 60 or a `yes` boolean behind the admin's back."""

from __future__ import annotations

import dataclasses
import re
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_hetero.cli import cli
from slurm_hetero.core.errors import InventoryError
from slurm_hetero.inventory import document as inventory
from tests.conftest import REPO

EXAMPLE = REPO / "gres_conf" / "examples" / "mixed.yaml"
BASE = EXAMPLE.read_text()
CPUS_LINE = BASE[: BASE.index("cpus: 8")].count("\n") + 1

AMBIGUOUS_CPUS = {  # value: (YAML 1.1 reading, YAML 1.2 reading, advice)
    "010": ("8", "10", "write 8 or 10"),
    "0o10": ("the text '0o10'", "8", "write 8, or '0o10' for text"),
    "0b11": ("3", "the text '0b11'", "write 3, or '0b11' for text"),
    "1_000": ("1000", "the text '1_000'", "write 1000, or '1_000' for text"),
    "1e3": ("the text '1e3'", "1000.0", "write 1000, or '1e3' for text"),
    "1:30": ("90", "the text '1:30'", "write 90, or '1:30' for text"),
    "09": ("the text '09'", "9", "write 9, or '09' for text"),
    "yes": ("true", "the text 'yes'", "write true, or 'yes' for text"),
    "off": ("false", "the text 'off'", "write false, or 'off' for text"),
    # adv40 M19: "write inf" for an overflow, and no field takes inf
    "1e400": ("the text '1e400'", "inf", "write a number a float holds, or '1e400' for text"),
    "1e-400": ("the text '1e-400'", "0.0", "write a number a float holds, or '1e-400' for text"),  # adv41 49
}


@pytest.mark.parametrize("value", AMBIGUOUS_CPUS)
def test_ambiguous_integers_and_booleans_are_refused_naming_key_and_line(value: str) -> None:
    yaml11, yaml12, advice = AMBIGUOUS_CPUS[value]
    with pytest.raises(InventoryError) as e:
        inventory.loads(BASE.replace("cpus: 8", f"cpus: {value}", 1), "inv.yaml")
    message = f"cpus: {value} is ambiguous ({yaml11} in YAML 1.1, {yaml12} in YAML 1.2); {advice}"
    assert str(e.value) == f"inv.yaml: line {CPUS_LINE}: {message}"


def test_hex_reads_alike_but_is_not_taken() -> None:
    with pytest.raises(InventoryError) as e:
        inventory.loads(BASE.replace("cpus: 8", "cpus: 0x10", 1), "inv.yaml")
    assert str(e.value).endswith(
        "cpus: 0x10 is 16 written in a form slurm-hetero does not read; write 16, or '0x10' for text"
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("features: [ib]", "features: [ib, on]", "features[1]: on is ambiguous (true in YAML 1.1"),
        ("name: l40sn1", "name: no", "name: no is ambiguous (false in YAML 1.1"),
        ("memory_mib: 46068", "memory_mib: 046068", "memory_mib: 046068 is ambiguous"),
        ("index: 1\n", "index: 01\n", "index: 01 is 1 written in a form slurm-hetero does not read; write 1"),
        (
            "driver_version: 535.54.03",
            "driver_version: 2024-01-01",
            "driver_version: 2024-01-01 is ambiguous",
        ),
    ],
)
def test_every_key_reads_strictly(old: str, new: str, expected: str) -> None:
    assert old in BASE
    with pytest.raises(InventoryError, match="^inv.yaml: line [0-9]+: " + re.escape(expected)):
        inventory.loads(BASE.replace(old, new, 1), "inv.yaml")


def test_forms_both_versions_read_alike_still_load() -> None:
    text = BASE.replace("cpus: 8", "cpus: +8", 1).replace(
        "features: [ib]", "features: [ib, 'yes', \"010\"]", 1
    )
    node = inventory.loads(text, "inv.yaml").nodes[0]
    assert node.cpus == 8 and node.features == ("ib", "yes", "010")
    assert inventory.loads(BASE, "inv.yaml") == inventory.load(EXAMPLE)


def test_the_cli_prints_one_line(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE.replace("cpus: 8", "cpus: 010", 1))
    result = CliRunner().invoke(cli, ["inventory", "check", str(path)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"slurm-hetero: {path}: line {CPUS_LINE}: cpus: 010 is ambiguous (8 in YAML 1.1, 10 in YAML 1.2); "
        "write 8 or 10"
    ]


def test_load_many_reads_strictly_too(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(BASE + "---\n" + BASE.replace("cpus: 8", "cpus: 1:30", 1).replace("a100n1", "x1"))
    with pytest.raises(InventoryError, match="line [0-9]+: cpus: 1:30 is ambiguous"):
        inventory.load_many(path)


EXAMPLE_INVENTORY = inventory.load(EXAMPLE)
TEXTS = st.text(alphabet=string.ascii_letters + string.digits + "._:-+", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_dumped_strings_load_back_as_the_same_text(value: str) -> None:
    """Whatever a string looks like (`1e3`, `0o10`, `010`, `yes`, `1:30`), `dumps` quotes it when
    it must, so its output always loads back to the same inventory."""
    inv = EXAMPLE_INVENTORY  # loaded once: the property is about dumps, not about 300 loads
    node = inv.nodes[0]
    word = inventory.shipped_schema()["definitions"]["device"]["properties"]["tool_id"]["pattern"]
    tool_id = value if re.fullmatch(word, value) else None
    device = dataclasses.replace(node.devices[0], uuid=value, tool_id=tool_id)
    changed = dataclasses.replace(
        inv, nodes=(dataclasses.replace(node, devices=(device, *node.devices[1:])),)
    )
    assert inventory.loads(inventory.dumps(changed), "dumped.yaml") == changed


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [  # adversarial re-pass of issue 9 (V60, W1-W10, C27): `CPUs=8.0`, `Cores=0.0-3.0` were rendered
        (
            "cpus: 8",
            "cpus: 8.0",
            "cpus: 8.0 is not a whole number, and inventory numbers are whole: write 8, or '8.0' for text",
        ),
        ("cpus: 8", "cpus: 8.", "cpus: 8. is not a whole number, and inventory numbers are whole: write 8"),
        (
            "memory_mib: 46068",
            "memory_mib: 46068.5",
            "memory_mib: 46068.5 is not a whole number, and inventory numbers are whole: "
            "write a whole number, or '46068.5' for text",
        ),
        (
            "real_memory_mib: 16000",
            "real_memory_mib: 16000.0",
            "real_memory_mib: 16000.0 is not a whole number",
        ),
        ("index: 1\n", "index: 1.0\n", "index: 1.0 is not a whole number"),
        ("cpus: 8", "cpus: .inf", "cpus: .inf is not a whole number"),
        ("features: [ib]", "features: [ib, 2.5]", "features[1]: 2.5 is not a whole number"),
    ],
)
def test_a_number_with_a_point_is_refused_naming_key_and_line(old: str, new: str, expected: str) -> None:
    assert old in BASE
    with pytest.raises(InventoryError, match="^inv.yaml: line [0-9]+: " + re.escape(expected)):
        inventory.loads(BASE.replace(old, new, 1), "inv.yaml")


@pytest.mark.parametrize("number", ["8.0", "8e0", "NaN", "Infinity", "-0.0"])
def test_a_json_inventory_with_a_fraction_is_refused(number: str) -> None:
    text = '{"version": 1, "nodes": [{"name": "n1", "cpus": NUMBER, "devices": []}]}'.replace(
        "NUMBER", number
    )
    with pytest.raises(InventoryError, match=re.escape(f"inv.json: {number} is not a whole number")):
        inventory.loads(text, "inv.json", as_json=True)


@pytest.mark.parametrize(
    "command", [["inventory", "check"], ["gres", "render", "--check"], ["job-submit", "render", "--check"]]
)
def test_every_command_refuses_a_fractional_cpu_count(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(BASE.replace("cpus: 8", "cpus: 8.0", 1))
    args = (
        [*command, str(path)]
        if command[0] == "inventory"
        else [*command, "--inventory", str(path), "--out", str(tmp_path / "out")]
    )
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    assert "cpus: 8.0 is not a whole number" in result.output


def test_a_written_inventory_cut_anywhere_is_refused_as_cut_short(tmp_path: Path) -> None:
    """adv33 E12: a copy of a written inventory cut after a whole node (or inside a device list)
    parsed as a smaller cluster. Written YAML now closes with a line every cut loses."""
    text = inventory.dumps(inventory.load(EXAMPLE))
    assert inventory.loads(text, "whole.yaml") == inventory.load(EXAMPLE)
    ends = [i + 1 for i, c in enumerate(text) if c == "\n"][:-1]  # after every line but the last
    for end in [*ends, len(text) - 5]:
        with pytest.raises(InventoryError, match=r"^cut.yaml: cut short or added to: it does not end with"):
            inventory.loads(text[:end], "cut.yaml")
    with pytest.raises(InventoryError, match="added to"):  # adv34 J13: a node line after the end
        inventory.loads(text + "  - name: extra\n", "added.yaml")
    hand_written = text.removeprefix(inventory.HEADER).removesuffix(inventory.FOOTER)
    assert inventory.loads(hand_written, "hand.yaml") == inventory.load(EXAMPLE)  # no header: no check
