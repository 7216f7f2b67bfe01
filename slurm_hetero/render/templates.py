"""The one jinja2 Environment (StrictUndefined), and what each Slurm release needs of the output.

Slurm 24.11 marks a node INVALID when a gres.conf `Cores=` list splits a socket, 22.05 takes it;
so after 22.05 `Cores=` is widened to whole sockets (valid on every release), with a note.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from slurm_hetero import __version__
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.slurm.syntax import comment, cpu_ids, ranges

GRES_TEMPLATE = "gres.conf.j2"
NODES_TEMPLATE = "slurm_nodes.conf.j2"
DEFAULT_SLURM_RELEASE = "22.05"  # Debian 12's, when neither --slurm-release nor scontrol says
_RELEASE = re.compile(r"(\d{2})\.(\d{2})(?:\.\d+)?")


def release_key(release: str) -> tuple[int, int]:
    """`24.11` (or `24.11.5`) -> (24, 11)."""
    m = _RELEASE.fullmatch(release.strip())
    if not m:
        raise ConfigError(f"Slurm release {release!r} is not YY.MM, e.g. 24.11", "--slurm-release")
    return int(m.group(1)), int(m.group(2))


def _whole_sockets(cores: str, cores_per_socket: int) -> str:
    """`0-1,9` with 4 cores per socket -> `0-3,8-11`."""
    sockets = sorted({i // cores_per_socket for i in cpu_ids(cores)})
    return ranges([i for s in sockets for i in range(s * cores_per_socket, (s + 1) * cores_per_socket)])


def for_release(context: Mapping[str, Any], release: str) -> dict[str, Any]:
    """The render context adjusted to what `release` accepts."""
    out = {**context, "slurm_release": release}
    if release_key(release) <= (22, 5):
        return out
    groups, notes = [], list(context["notes"])
    for group, node in zip(context["gres_groups"], context["nodes"]):
        per_socket = node.get("cores_per_socket") if node.get("sockets") else None
        lines = []
        for line in group["lines"]:
            if per_socket and line.cores:
                widened = _whole_sockets(line.cores, per_socket)
                if widened != line.cores:
                    notes.append(
                        f"{group['nodes']}: gpu {line.type} {line.file}: Cores={line.cores} widened to whole "
                        f"sockets, Cores={widened} (Slurm 24.11 refuses Cores= that split a socket)"
                    )
                    line = dataclasses.replace(line, cores=widened)
            lines.append(line)
        groups.append({**group, "lines": lines})
    return {**out, "gres_groups": groups, "notes": notes}


def environment(template_dir: Path | None = None) -> jinja2.Environment:
    """Templates from `template_dir` first, then the package's."""
    loaders: list[jinja2.BaseLoader] = []
    if template_dir is not None:
        if not template_dir.is_dir():
            raise ConfigError("template directory does not exist", str(template_dir))
        loaders.append(jinja2.FileSystemLoader(str(template_dir)))
    loaders.append(jinja2.PackageLoader("slurm_hetero.render", "templates"))
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(env: jinja2.Environment, name: str, context: Mapping[str, Any]) -> str:
    """Render one template; its errors as ConfigError naming the template and line."""
    try:
        return env.get_template(name).render(version=__version__, **context)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(
            f"template syntax error: {e.message}", e.filename or name, f"line {e.lineno}"
        ) from e
    except jinja2.UndefinedError as e:
        raise ConfigError(f"template uses an undefined value: {e.message}", name) from e


def render_configs(
    context: Mapping[str, Any], template_dir: Path | None = None, slurm_release: str | None = None
) -> dict[str, str]:
    """gres.conf and slurm-nodes.conf text from a render context."""
    env = environment(template_dir)
    context = for_release(context, slurm_release or context.get("slurm_release") or DEFAULT_SLURM_RELEASE)
    context = {**context, "source": comment(context.get("source", ""))}
    return {
        "gres.conf": render(env, GRES_TEMPLATE, context),
        "slurm-nodes.conf": render(env, NODES_TEMPLATE, context),
    }
