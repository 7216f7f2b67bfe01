"""Tensor parallelism with DTensor: a stage's attention and MLP sharded over the layout's tp group
by `parallelize_module` with Megatron's plan (`LLAMA_PLAN`): q, k, v, gate and up projections by
columns, o and down by rows. Each block's input enters as one replicated DTensor: two all-reduces
per block forward and two backward, as the planner prices them. Attention must reshape its
projections by head size (``view(b, s, -1, head_dim)``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["LLAMA_PLAN", "parallelize"]

# submodule name pattern (fnmatch, under each block) -> "input" | "colwise" | "rowwise"
LLAMA_PLAN: Mapping[str, str] = {
    "*self_attn": "input",
    "*mlp": "input",
    "*self_attn.q_proj": "colwise",
    "*self_attn.k_proj": "colwise",
    "*self_attn.v_proj": "colwise",
    "*self_attn.o_proj": "rowwise",
    "*mlp.gate_proj": "colwise",
    "*mlp.up_proj": "colwise",
    "*mlp.down_proj": "rowwise",
}


def parallelize(
    stage: torch.nn.Module, tp_group: ProcessGroup | None, plan: Mapping[str, str] = LLAMA_PLAN
) -> torch.nn.Module:
    """Shard `stage`'s linear layers named by `plan` over `tp_group` (in place; returned); a plan
    that matches nothing is an error, since the planner priced the stage tp-fold faster."""
    if tp_group is None:
        return stage
    from slurm_hetero.training.pipeline import module_device, require_torch_module

    require_torch_module("torch.distributed.tensor.parallel", "tensor-parallel stages")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles: dict[str, Any] = {
        "input": _replicated_input,
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
    }
    names = [name for name, _ in stage.named_modules() if name]
    chosen = {
        name: style for name in names for pattern, style in plan.items() if fnmatch.fnmatchcase(name, pattern)
    }
    if not any(style != "input" for style in chosen.values()):
        raise ValueError(
            f"no submodule matches the tensor-parallel plan ({', '.join(plan)}); name the model's "
            "projections in `plan`"
        )
    mesh = DeviceMesh.from_group(tp_group, device_type=module_device(stage).type)
    return parallelize_module(stage, mesh, {name: styles[style]() for name, style in chosen.items()})


def _replicated_input() -> Any:
    """A `ParallelStyle` that makes a module's input (first positional tensor, else `hidden_states`)
    a replicated DTensor; torch's `PrepareModuleInput` takes one of the two, not whichever comes."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel.style import ParallelStyle

    def replicated(x: Any, mesh: Any) -> Any:
        is_plain = isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        return DTensor.from_local(x, mesh, (Replicate(),), run_check=False) if is_plain else x

    class ReplicatedInput(ParallelStyle):
        def _apply(self, module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
            def hook(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                if args:
                    return (replicated(args[0], device_mesh), *args[1:]), kwargs
                if "hidden_states" in kwargs:
                    kwargs = {**kwargs, "hidden_states": replicated(kwargs["hidden_states"], device_mesh)}
                return args, kwargs

            module.register_forward_pre_hook(hook, with_kwargs=True)
            return module

    return ReplicatedInput()
