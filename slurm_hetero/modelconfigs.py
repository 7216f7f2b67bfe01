"""Model configurations by name or path: the Hugging Face `config.json` files bundled in
`slurm_hetero/data/hf_configs/`, or a user's own. The only reader of those files; `fit`,
`sbatch`, `plan` and `launch` all describe models through it."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from slurm_hetero.engine.modelspec import ModelSpec, from_hf_config
from slurm_hetero.errors import ConfigError

CONFIG_PACKAGE = "slurm_hetero.data.hf_configs"


def bundled_names() -> list[str]:
    """Names of the configs shipped in `slurm_hetero/data/hf_configs/` (file names without .json)."""
    root = resources.files(CONFIG_PACKAGE)
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", source) from e


def load_model(ref: str) -> ModelSpec:
    """A bundled model by name, or a Hugging Face `config.json` (or a directory holding one)."""
    if ref in bundled_names():
        text = resources.files(CONFIG_PACKAGE).joinpath(f"{ref}.json").read_text(encoding="utf-8")
        return from_hf_config(_parse_json(text, ref), ref)
    path = Path(ref)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(
            f"unknown model {ref!r}: not a bundled model nor a config.json file; "
            f"bundled: {', '.join(bundled_names())}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e}", str(path)) from e
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_hf_config(_parse_json(text, str(path)), name)
