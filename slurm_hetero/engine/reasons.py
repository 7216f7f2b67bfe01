"""Reason codes for "no" answers (R5), and the wording of the job_submit hook's answers, once:
`submit.tables` copies `MESSAGES`, `CODE_ORDER` and `LABELS` into the hook's Lua table, whose
`string.format` fills them (so `%s` arguments only). Never rename or reuse a code or a key.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_hetero.core.compat import StrEnum


class ReasonCode(StrEnum):
    """Why a device type cannot take a request or hold a job."""

    TYPE_EXCLUDED = "TYPE_EXCLUDED"  # the partition or cluster allow/deny lists exclude the type
    MISSING_FEATURE = "MISSING_FEATURE"  # no node of the type has the job's --constraint features
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"  # memory per device below what is needed
    TOO_FEW_DEVICES = "TOO_FEW_DEVICES"  # fewer devices per node than requested
    TOO_FEW_NODES = "TOO_FEW_NODES"  # fewer nodes with enough devices than the job spans
    NODE_TOO_SMALL = "NODE_TOO_SMALL"  # no node with enough devices has the job's CPUs or memory per node
    NOT_ENOUGH_DEVICES = "NOT_ENOUGH_DEVICES"  # a model fits on N devices, the inventory has fewer
    UNHEALTHY = "UNHEALTHY"  # every device of the type is marked unhealthy


#: The order in which `score.reason` checks a type (a type counts under its first failure), and
#: in which the hook's messages list the counts.
CODE_ORDER: tuple[ReasonCode, ...] = (
    ReasonCode.TYPE_EXCLUDED,
    ReasonCode.MISSING_FEATURE,
    ReasonCode.INSUFFICIENT_MEMORY,
    ReasonCode.TOO_FEW_DEVICES,
    ReasonCode.NODE_TOO_SMALL,
    ReasonCode.TOO_FEW_NODES,
)

#: Short words for counts in the hook's messages ("2 too small, 1 excluded").
LABELS: Mapping[ReasonCode, str] = {
    ReasonCode.TYPE_EXCLUDED: "excluded",
    ReasonCode.MISSING_FEATURE: "without the features",
    ReasonCode.INSUFFICIENT_MEMORY: "too small",
    ReasonCode.TOO_FEW_DEVICES: "too few per node",
    ReasonCode.NODE_TOO_SMALL: "nodes too small",
    ReasonCode.TOO_FEW_NODES: "too few nodes",
}

#: Message templates by key.
MESSAGES: dict[str, str] = {
    "unknown_type": "unknown device type %s; known types: %s",
    "constraint_counts": "node counts (*N) cannot be checked against device types; "
    "drop the count or ask for a gpu TYPE",
    "constraint_bad": "cannot read it (this hook reads a&b, a|b, (..) and one [a|b])",
    "constraint_unknown": "no node has feature %s",
    "partition_unknown": "unknown partition %s; known partitions: %s",
    "partition_none": "names no partition; known partitions: %s",
    "constraint_terms": "more than %s alternatives (a|b terms, once & is multiplied out): this hook "
    "checks no more",
    "constraint_deep": "parentheses nest more than %s deep (slurmctld refuses it)",
    # job_submit rejections, `REQUEST: HEADLINE[; HINT]`; headlines say what is wrong ...
    "type_excluded": "%s is not allowed here",
    "type_features": "no %s node has the requested features",
    "type_memory": "%s has %s per device",
    "type_count": "%s has at most %s per node",
    "type_nodes": "%s has %s node(s) with %s devices, the job needs %s",
    "node_cpus": "%s nodes with %s devices have at most %s CPUs, the job needs %s per node",
    "node_memory": "%s nodes with %s devices have at most %s memory, the job needs %s per node",
    "node_list": "gpumem/gpucore cannot be decided with -w/--nodelist (the hook picks a device type, "
    "not nodes; -x/--exclude is fine); ask for a gpu TYPE instead: --gres=gpu:TYPE:N, TYPE one of %s",
    "exclude_bad": "-x/--exclude %s: this hook reads host names, name[1-3,5] ranges and commas, "
    "naming at most %s hosts",
    "exclude_long": "-x/--exclude %s: %s characters, more than the %s this hook reads (fold the "
    "names into ranges: name[1-3,5])",
    "per_socket": "gpumem/gpucore cannot be decided with --gpus-per-socket (the hook's table does not "
    "know how many sockets a node has or which devices sit on each); ask for devices per node "
    "(--gpus-per-node=N) with the gpumem, or for a gpu TYPE without it: "
    "--gpus-per-socket=TYPE:N, TYPE one of %s",
    "largest": "largest device is %s with %s",
    "none_fit": "no device type fits (%s)",
    # ... hints say what would fit
    "would_fit": "would fit: --gres=gpu:%s:%s%s",
    "split": "request %s devices with --gres=gpu:%s,gpumem:%s",
    "per_node": "at most %s devices per node (%s)",
    "nodes": "at most %s node(s) with %s devices each (%s): ask -N %s",
    # the node count is -n over --ntasks-per-node: -N alone would contradict them
    "nodes_tasks": "at most %s node(s) with %s devices each (%s): ask -N %s -n %s (--ntasks-per-node=%s)",
    "other_vendor": "%s of vendor %s would fit: add -C %s",
    "excluded": "-x/--exclude leaves too few nodes: it excludes %s (type:nodes; in a heterogeneous "
    "job Slurm also excludes the other components' -w nodes)",
    "het_nodes": "the components of a heterogeneous job never share a node, and this job's earlier "
    "components take %s (type:nodes)",
    "het_nodes_excluded": "the components of a heterogeneous job never share a node, this job's earlier "
    "components take %s (type:nodes), and -x/--exclude excludes %s (type:nodes; Slurm also excludes the "
    "other components' -w nodes)",
    "het_typed": "%s has %s node(s) with %s devices, this job's earlier components take %s of them "
    "(%s chosen by the hook for their gpumem/gpucore), and the components of a heterogeneous job never "
    "share a node; this component needs %s: put it before the gpumem/gpucore components (they are then "
    "decided on the nodes it leaves), or ask those for a gpu TYPE (--gres=gpu:TYPE:N)",
    "job_total": "--gpus=%s is fewer than the %s nodes this job spans (-N, or -n over --ntasks-per-node), "
    "which Slurm refuses; ask --gpus=%s or more, or for fewer nodes",
    # job_submit outcomes (admin comment, slurmctld log, user message)
    "rewrite": "%s -> %s (%s)",
    "rewrite_any": "%s -> %s constraint %s (%s, any-fit)",
    "rewrite_shard": "%s -> %s constraint %s (%s, shares of %s)",
    "scope": " [vendor %s: the default here for a request without a type; for another add -C %s]",
    # edits (slurm_job_modify)
    "edit_shards": "this job holds shards and Slurm cannot update shards to whole devices; "
    "cancel it and submit it again",
    "edit_type": "Slurm 22.05 keeps the %s devices this job holds when an update names another type (%s), "
    "so the job would ask for both; cancel it and submit it again",
    "edit_tasks": "this job asks for devices per task, and Slurm does not show an update how many tasks "
    "the job runs on each node; cancel it and submit it again with the gpumem, or give NumTasks in the "
    "same update",
    "edit_het": "this job is one component of a heterogeneous job, and the hook cannot see the devices "
    "its other components hold (components never share a node), so it cannot choose a type that "
    "leaves the job able to start; cancel the job and submit it again with the gpumem",
    "edit_counts": "the devices this job holds do not fit its edited node or task count, node list, "
    "partition or constraint: %s; to choose devices for the edited job, give the gpumem again in the "
    "same update (gres=gpumem:SIZE)",
    "edit_hosts": "the devices this job holds do not fit its edited node list: -w/--nodelist names %s, "
    "which cannot hold them (%s per node, with the job's CPUs, memory and constraint); name hosts that "
    "can, or cancel the job and submit it again",
    "edit_hidden": "the %s devices this job holds do not take it, and Slurm does not show the hook the "
    "job's -x/--exclude and -w/--nodelist, which may leave %s no node (the job would never start); give "
    "them again in the same update (excnodelist=HOSTS, or excnodelist= when it has none, and reqnodelist=), "
    "or cancel it and submit it again",
    "internal": "internal error in the slurm_hetero job_submit hook; job rejected, tell your admin",
}


#: Bytes of a long user value (an -x hostlist) a message shows, then "...".
SHOWN_CHARS = 80
