"""The one exception hierarchy. The CLI maps these to one-line messages and exit codes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slurm_hetero.core.model import Capture


class HeteroError(Exception):
    """Base of every error slurm-hetero reports to a user. `exit_code` is what the CLI returns."""

    exit_code = 1


class ConfigError(HeteroError):
    """A config or data file is wrong, at `path` and `key_path`."""

    def __init__(self, message: str, path: str | None = None, key_path: str | None = None) -> None:
        where = ":".join(p for p in (path, key_path) if p)
        super().__init__(f"{where}: {message}" if where else message)


class InventoryError(HeteroError):
    """An inventory is malformed, inconsistent or cannot be merged."""


class ParseError(HeteroError):
    """Captured tool output could not be parsed."""

    def __init__(
        self,
        vendor: str,
        tool: str,
        message: str,
        source: str | Capture = "<text>",
        line_no: int | None = None,
        fragment: str | None = None,
    ) -> None:
        source = source.source if isinstance(source, Capture) else source
        where = f"{source}:{line_no}" if line_no is not None else source
        text = f"cannot parse {tool} output ({vendor}) at {where}: {message}"
        if fragment is not None:
            text += f" [{fragment.strip()[:60]!r}]"
        super().__init__(text)


class ToolError(HeteroError):
    """A vendor tool, library or Slurm command failed or could not be run; `status` says how when
    neither the exit code nor `not found` does."""

    exit_code = 3

    def __init__(
        self, argv: Sequence[str], rc: int | None, stderr_tail: str = "", status: str | None = None
    ) -> None:
        cmd = " ".join(argv)
        status = status or ("not found" if rc is None else f"exit code {rc}")
        tail = f": {stderr_tail.strip().splitlines()[-1]}" if stderr_tail.strip() else ""
        super().__init__(f"`{cmd}` failed ({status}){tail}")
        self.rc, self.stderr_tail = rc, stderr_tail


class RequestError(HeteroError):
    """A resource request (gpumem, gpucore, counts) is malformed."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"{text}: {reason}")
        self.text, self.reason = text, reason


class OutputError(HeteroError):
    """An output file or directory cannot be written. Nothing on disk was changed."""


class JobEnvError(HeteroError):
    """The task environment is not a Slurm step we can lay out."""


class ScontrolError(HeteroError):
    """`scontrol show node` said something we cannot read."""


class SbatchArgsError(HeteroError):
    """sbatch itself would refuse these options or this script header."""


class GresConfError(HeteroError):
    """gres.conf text that Slurm would refuse."""


class LayoutError(HeteroError):
    """No layout for this process, or a layout document that is not version 1 of the contract."""


class CalibrationError(HeteroError):
    """The device cannot be measured (torch missing, unknown device, failed run)."""


class SlurmNodesError(HeteroError):
    """Slurm's view of the nodes cannot stand in for the inventory."""


class LaunchError(HeteroError):
    """The launcher cannot start the command."""


class LaunchPlanError(HeteroError):
    """The step cannot be laid out: names the node, device or model at fault."""


class NodeLaunchError(LaunchPlanError):
    """What only this node's ranks can see (how Slurm bound its devices): it ends the whole step."""


class SbatchPlanError(HeteroError):
    """The job cannot run on this cluster as asked; `decisions`: up to the refused one (`--json`)."""

    def __init__(self, message: str, decisions: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.decisions = list(decisions)  # sbatchplan.Decision records
