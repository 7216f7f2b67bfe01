"""Models by name or path: the Hugging Face `config.json` files bundled in `data/hf_configs/`,
or a user's own."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from slurm_hetero.core.errors import ConfigError, RequestError
from slurm_hetero.core.readfile import MAX_CONFIG_BYTES, read_text
from slurm_hetero.engine.modelcost import CostSettings, layer_table
from slurm_hetero.engine.modelfamilies import from_hf_config
from slurm_hetero.engine.modelspec import ModelSpec
from slurm_hetero.engine.stagecost import LayerCosts
from slurm_hetero.inventory.document import unique_keys
from slurm_hetero.slurm import syntax

CONFIG_PACKAGE = "slurm_hetero.data.hf_configs"


def bundled_names() -> list[str]:
    """Names of the bundled configs."""
    root = resources.files(CONFIG_PACKAGE)
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def _parse_json(text: str, source: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except RecursionError:
        raise ConfigError("nested too deeply to be a model config", source) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", source) from e
    except ValueError as e:  # an integer of more digits than Python converts, a key given twice
        raise ConfigError(f"malformed JSON: {e}", source) from None


def load_model(ref: str) -> ModelSpec:
    """A bundled model by name, or a Hugging Face `config.json` (or a directory holding one)."""
    if ref in bundled_names():
        text = resources.files(CONFIG_PACKAGE).joinpath(f"{ref}.json").read_text(encoding="utf-8")
        return from_hf_config(_parse_json(text, ref), ref)
    path = Path(ref)
    try:  # a name longer than NAME_MAX or PATH_MAX is an OSError, not just "no such file"
        path = path / "config.json" if path.is_dir() else path
        found = path.is_file()
    except OSError:
        found = False
    if not found:
        raise ConfigError(
            f"unknown model {syntax.text(ref)}: not a bundled model nor a config.json file; "
            f"bundled: {', '.join(bundled_names())}"
        )
    text = read_text(path, MAX_CONFIG_BYTES, "model config", ConfigError)
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return from_hf_config(_parse_json(text, str(path)), name)


DEFAULT_SEQ = 2048  # fit's and sbatch's sequence length when none is given (capped at the context)


BEYOND_CONTEXT = "--beyond-context"


def sequence_length(
    spec: ModelSpec, seq: int | None, ref: str | None = None, beyond: bool | None = None
) -> int:
    """`seq`, else DEFAULT_SEQ or the model's context if shorter. Longer than the context is an
    error unless `beyond` (relative positions, RoPE scaling; None: the command has no such option)."""
    if seq is None:
        return min(DEFAULT_SEQ, spec.max_positions)
    if 1 <= seq <= spec.max_positions or (beyond and seq >= 1):
        return seq
    advice = "" if beyond is None else f"; pass {BEYOND_CONTEXT} to estimate longer ones"
    raise RequestError(f"--seq {seq}", f"{ref or spec.name} takes 1 to {spec.max_positions} tokens{advice}")


def layer_costs_for(ref: str, seq: int, settings: CostSettings | None = None) -> LayerCosts:
    """Per-layer costs of a decoder-only model for `seq` tokens (MoE: experts on their layer's stage)."""
    spec = load_model(ref)
    if spec.encoder_layers:
        raise RequestError(ref, "the layout solver handles decoder-only models (no encoder)")
    return LayerCosts.from_table(layer_table(spec, sequence_length(spec, seq, ref), settings))
