"""The one jinja2 Environment (StrictUndefined): package templates, or an admin's --template-dir
whose files of the same name take precedence."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from slurm_hetero import __version__
from slurm_hetero.errors import ConfigError
from slurm_hetero.slurm.syntax import comment

GRES_TEMPLATE = "gres.conf.j2"
NODES_TEMPLATE = "slurm_nodes.conf.j2"


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
    """Render one template; template errors become ConfigError naming the template and line."""
    try:
        return env.get_template(name).render(version=__version__, **context)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(
            f"template syntax error: {e.message}", e.filename or name, f"line {e.lineno}"
        ) from e
    except jinja2.UndefinedError as e:
        raise ConfigError(f"template uses an undefined value: {e.message}", name) from e


def render_configs(context: Mapping[str, Any], template_dir: Path | None = None) -> dict[str, str]:
    """gres.conf and slurm-nodes.conf text from a render context (see render.context)."""
    env = environment(template_dir)
    context = {**context, "source": comment(context.get("source", ""))}
    return {
        "gres.conf": render(env, GRES_TEMPLATE, context),
        "slurm-nodes.conf": render(env, NODES_TEMPLATE, context),
    }
