"""Score slurm-hetero plans with SAILOR's Simulator (eth-easl/sailor, MIT), unchanged.

Run by `scripts/bench_peers` with the Python of SAILOR's venv and SAILOR's checkout on PYTHONPATH
(never imported by the project). Reads {"sailor_root": DIR, "plans": [{"name", "model", "gbs",
"doc", "devices"}]} on stdin (doc: a `plan --json` document, devices: {our type: count}), writes
[{"name", "score", "fits", "how", "our_p2p", "best_pipeline"}] on stdout. SAILOR numbers the
embedding 0, the blocks 1..L and the head L+1: a stage of our layers [a, e) holds SAILOR's
[a+1, e+1), the first also 0 and the last also L+1. One replica of tensor degree t is one 4-GPU
node of its type (t GPUs of it), in one zone.

- pipeline plans (equal data parallel on every stage): the stock `simulate_iteration_time`.
- data plans (an uneven share of samples per replica): SAILOR's `get_time_per_pipeline` per line
  of identical replicas at that line's own micro-batch count, the slowest line, plus SAILOR's
  `estimate_sync_time` of all replicas as one pipeline (the stock simulator would give every
  replica the same count).
- staged plans (a data-parallel degree per stage, the pipeline micro-batch M split over a stage's
  replicas): each stage at its own per-replica micro-batch ceil(M / dp) (layer times of an
  unprofiled size interpolated between the neighbouring profiled sizes, or scaled from the largest
  below), p2p at that size, the same 1F1B formula as `get_time_per_pipeline`, SAILOR's sync.
Memory: SAILOR's `check_config_fits` (fp32 Adam, 24 B per parameter), per stage at its own
micro-batch for staged plans.

Beside each plan, `best_pipeline`: the best plan of our `pipeline` family (each device type one
run of stages at one tensor-parallel degree, replicated) that this simulator finds, searching the
family's shapes itself, each at its least-bottleneck layer split: about the best the family can
score here, whatever our planner picks.

A diagnostic beside the score, for pipeline plans (`our_p2p`): SAILOR's same formula, its layer
times, network coefficients and sync, with the stage transfers charged by the two rules of the
schedule our runtime runs (torch's 1F1B) where SAILOR's simulator has others:
- a boundary our plan keeps inside a node (every replica's sender and receiver on one node, as the
  plan's ranks place them: a type's devices node by node) is free; SAILOR sends every boundary
  over the network (`estimate_p2p_pipeline_times` never reads the intra-node figures it is given);
- each stage pays each of its boundaries once per micro-batch (torch sends the activation and
  receives the gradient in one batched exchange); SAILOR's first and last stage pay theirs twice.
The gap between the two is that difference of worlds, not of cost models.
"""

import contextlib
import io
import itertools
import json
import math
import os
import sys

ROOT = json.loads(sys.stdin.read())
os.environ["SAILOR_PATH"] = ROOT["sailor_root"]
from sailor.Planner.simulations.constants import GPU_MEMORY_GB  # noqa: E402
from sailor.Planner.simulations.runtime_simulator import (  # noqa: E402
    Simulator,
    convert_homogeneous,
    estimate_p2p_pipeline_times,
)
from sailor.profiling.profile_utils import estimate_send_time  # noqa: E402

S = f"{ROOT['sailor_root']}/sailor/sailor/Planner"
ZONE = "us-central1-a"
PER_NODE = 4
TYPES = {"a100_40g": "A100-40", "v100_16g": "V100-16", "gh200": "GH-96", "a100_80g": "A100-80"}
CONFIGS = {"OPT-350": "opt_350", "GPT-Neo-2.7": "gpt_neo27"}
with open(f"{S}/llm_info.json") as f:
    LLM = json.load(f)
with open(f"{S}/simulations/profiles_tmp.json") as f:
    PROFILES = json.load(f)


def simulator(model, gbs):
    with open(f"{S}/simulations/configs/training_config_{CONFIGS[model]}.json") as f:
        config = json.load(f)
    config["global_batch_size"] = gbs
    return Simulator(ROOT["sailor_root"], config, LLM, False, PROFILES, zone=ZONE)


def replica(gpu, tp):
    return [[(gpu, PER_NODE, ZONE)], tp]


def stage_layers(stages, blocks):
    """SAILOR's layer ids per stage of one line (sorted by index)."""
    last = len(stages) - 1
    return [
        list(range(0 if k == 0 else s["layer_start"] + 1, blocks + 2 if k == last else s["layer_end"] + 1))
        for k, s in enumerate(stages)
    ]


def quiet(call, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return call(*args)


def lines_of(doc):
    by = {}
    for s in doc["stages"]:
        by.setdefault(s["pipeline"], []).append(s)
    return [sorted(v, key=lambda s: s["index"]) for _, v in sorted(by.items())]


def pipeline_dict(lps, per_stage):
    """One SAILOR pipeline: per_stage[k] lists the (gpu, tp) of each replica of stage k."""
    return {
        "num_stages": len(lps),
        "layers_per_stage": lps,
        "dp": [len(r) for r in per_stage],
        "tmp_per_stage": [[replica(g, t) for g, t in r] for r in per_stage],
    }


def tables(sim, mbs):
    fwd, bwd, upd = {}, {}, {}
    for g, prof in sim.profiles.items():
        if str(mbs) not in prof:
            continue
        fwd[g], bwd[g], upd[g] = {}, {}, {}
        for tp, layers in prof[str(mbs)].items():
            vals = [layers[str(x)] for x in range(sim.num_layers)]
            fwd[g][int(tp)], bwd[g][int(tp)], upd[g][int(tp)] = ([v[i] for v in vals] for i in range(3))
    return fwd, bwd, upd


def score_lines(sim, doc, blocks):
    """pipeline and data plans: (seconds, fits, how)."""
    lines = lines_of(doc)
    lps = stage_layers(lines[0], blocks)
    mbs = lines[0][0]["micro_batch"]
    every = [
        [(TYPES[line[k]["type"]], line[k]["tp"]) for line in lines for _ in line[k]["samples"]]
        for k in range(len(lps))
    ]
    combined = {"mbs": mbs, "pipeline_list": [pipeline_dict(lps, every)]}
    fits = quiet(sim.check_config_fits, combined)
    if doc["kind"] == "pipeline":
        return quiet(sim.simulate_iteration_time, combined)[0], fits, "stock simulator"
    fwd, bwd, upd = tables(sim, mbs)
    times = []
    for line in lines:
        per = [[(TYPES[s["type"]], s["tp"])] * len(s["samples"]) for s in line]
        plan = convert_homogeneous(
            {"mbs": mbs, "pipeline_list": [pipeline_dict(lps, per)]}, sim.training_config
        )
        count = max(math.ceil(n / mbs) for n in line[0]["samples"])
        args = (plan.pipeline_list[0], mbs, fwd, bwd, upd, sim.activation_sizes_per_layer, count)
        times.append(quiet(sim.get_time_per_pipeline, *args))
    sync = quiet(sim.estimate_sync_time, convert_homogeneous(combined, sim.training_config))
    return max(times) + sync, fits, "per line at its own micro-batch count + sync"


def our_p2p(sim, doc, blocks, gbs):
    """A pipeline plan's step by `get_time_per_pipeline`'s formula with our schedule's transfer
    rules (the module docstring)."""
    st = lines_of(doc)[0]
    lps, mbs, n = stage_layers(st, blocks), st[0]["micro_batch"], len(st)
    first = {}
    for s in doc["stages"]:
        first[s["type"]] = min(first.get(s["type"], math.inf), *s["ranks"])

    def node(k, j):  # node of replica j's tp rank 0 in stage k
        s = st[k]
        return (s["type"], (s["ranks"][j * s["tp"]] - first[s["type"]]) // PER_NODE)

    inside = [all(node(k, j) == node(k + 1, j) for j in range(st[k]["replicas"])) for k in range(n - 1)]

    def send(k, layer):  # one way across boundary k -> k + 1, SAILOR's coefficients
        a, b = st[k], st[k + 1]
        coef = sim.inter_network_coeffs.get_zone_coeffs(
            ZONE, TYPES[a["type"]], min(a["tp"], PER_NODE), ZONE, TYPES[b["type"]], min(b["tp"], PER_NODE)
        )[0]
        return 0.0 if inside[k] else estimate_send_time(sim.activation_sizes_per_layer[layer] * mbs, coef)

    p2p = []
    for k in range(n):  # each boundary once (SAILOR: the ends twice)
        out = send(k, lps[k][-1]) if k < n - 1 else 0.0
        back = send(k - 1, lps[k][0]) if k > 0 else 0.0
        p2p.append(out + back)
    fwd, bwd, upd = tables(sim, mbs)
    comp = [
        sum(fwd[TYPES[s["type"]]][s["tp"]][x] + bwd[TYPES[s["type"]]][s["tp"]][x] for x in lps[k])
        for k, s in enumerate(st)
    ]
    update = max(upd[TYPES[s["type"]]][s["tp"]][lps[k][0]] for k, s in enumerate(st))
    count = math.ceil(gbs / (mbs * st[0]["replicas"]))
    every = [[(TYPES[s["type"]], s["tp"])] * s["replicas"] for s in st]
    plan = convert_homogeneous(
        {"mbs": mbs, "pipeline_list": [pipeline_dict(lps, every)]}, sim.training_config
    )
    t_pp = (count - 1) * max(c + p for c, p in zip(comp, p2p)) + sum(comp) + sum(p2p) + update
    return t_pp + quiet(sim.estimate_sync_time, plan)


def layer_times(sim, gpu, tp, m):
    """Per-layer (fwd, bwd, update) of (gpu, tp) at micro-batch m, and whether it was profiled."""
    prof = sim.profiles[gpu]
    have = sorted(int(k) for k in prof if str(tp) in prof[k])

    def get(k):
        return [prof[str(k)][str(tp)][str(x)] for x in range(sim.num_layers)]

    if m in have:
        return get(m), "profiled"
    lo = max((k for k in have if k < m), default=None)
    hi = min((k for k in have if k > m), default=None)
    if lo is not None and hi is not None:
        w = (m - lo) / (hi - lo)
        return [
            [x[i] + w * (y[i] - x[i]) for i in range(3)] for x, y in zip(get(lo), get(hi))
        ], f"interpolated {lo}-{hi}"
    if lo is None:
        raise KeyError(f"{gpu} tp {tp} micro-batch {m}: no profiled size below")
    return [[x[0] * m / lo, x[1] * m / lo, x[2]] for x in get(lo)], f"scaled from {lo}"


def score_staged(sim, doc, blocks, gbs):
    st = lines_of(doc)[0]
    lps = stage_layers(st, blocks)
    big = st[0]["micro_batch"]  # the pipeline micro-batch, split over each stage's replicas
    stages = [(TYPES[s["type"]], s["tp"], s["dp"] * s["replicas"]) for s in st]
    ms = [math.ceil(big / dp) for _, _, dp in stages]
    per = [[(g, tp)] * dp for g, tp, dp in stages]
    plan = convert_homogeneous(
        {"mbs": ms[0], "pipeline_list": [pipeline_dict(lps, per)]}, sim.training_config
    )
    pipe, n = plan.pipeline_list[0], len(lps)
    comp, upd, p2p, fits, hows = [], [], [], True, set()
    p2p_by = {
        m: quiet(
            estimate_p2p_pipeline_times,
            sim.activation_sizes_per_layer,
            pipe,
            m,
            sim.inter_network_coeffs,
            sim.intra_network_coeffs,
        )
        for m in set(ms)
    }
    for k, ((g, tp, _), m) in enumerate(zip(stages, ms)):
        times, how = layer_times(sim, g, tp, m)
        hows.add(how)
        comp.append(sum(times[x][0] + times[x][1] for x in lps[k]))
        upd.append(times[lps[k][0]][2])
        p2p.append(p2p_by[m][k])
        info = sim.model_mem_info[str(tp)]
        params = sum(info[str(x)]["params_floats"] for x in lps[k])
        acts = sum(info[str(x)]["act_mem_floats"] for x in lps[k])
        used = params * 24 + acts * m * sim.float_size * (n - k) + (2e9 if tp == 1 else 3e9)
        fits &= used <= GPU_MEMORY_GB[g] * 2**30
    count = math.ceil(gbs / big)
    t_pp = (count - 1) * max(c + p for c, p in zip(comp, p2p)) + sum(comp) + sum(p2p) + max(upd)
    sync = quiet(sim.estimate_sync_time, plan)
    return t_pp + sync, fits, "per stage at ceil(M/dp) (" + ", ".join(sorted(hows)) + ") + sync"


def min_max_split(costs, offsets, cap_hi):
    """The contiguous split of per-stage layer costs (costs[k][x]: layer x on stage k) with the
    least max over stages of cost + offsets[k] (bisection over a greedy feasibility test), or None."""
    n, layers = len(costs), len(costs[0])

    def within(cap):
        out, x = [], 0
        for k in range(n):
            take, acc = [], offsets[k]
            while x < layers - (n - 1 - k) and (not take or acc + costs[k][x] <= cap):
                acc += costs[k][x]
                take.append(x)
                x += 1
            if not take or acc > cap:
                return None
            out.append(take)
        return out if x == layers else None

    lo, hi = 0.0, cap_hi
    if within(hi) is None:
        return None
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if within(mid) is not None else (mid, hi)
    return within(hi)


def best_pipeline(sim, model, devices):
    """The best pipeline of our `pipeline` family that SAILOR's stock simulator finds: every device
    type one contiguous run of stages at one tensor-parallel degree (within a node), `r` replicas
    of the whole (r x tp dividing each type's count), every order of the types, every micro-batch
    size SAILOR profiled for them; per shape the layer split with the least bottleneck of compute
    and p2p (`min_max_split`), kept when it fits SAILOR's memory model. (seconds, description)."""
    prof, best = PROFILES[model], (math.inf, "none fits")
    types = [(TYPES[t], n) for t, n in devices.items()]
    sizes = sorted({int(m) for g, _ in types for m in prof[g]})
    for mbs in sizes:
        for tps in itertools.product(*[[1, 2, 4]] * len(types)):
            if any(n % t for (_, n), t in zip(types, tps)):
                continue
            counts = [n // t for (_, n), t in zip(types, tps)]
            for r in (r for r in range(1, min(counts) + 1) if all(c % r == 0 for c in counts)):
                for order in itertools.permutations(range(len(types))):
                    stages = [(types[i][0], tps[i]) for i in order for _ in range(counts[i] // r)]
                    profiled = all(str(t) in prof[g].get(str(mbs), {}) for g, t in stages)
                    if profiled and len(stages) <= sim.num_layers:
                        best = min(best, _score_shape(sim, prof, mbs, r, stages))
    return best


def _score_shape(sim, prof, mbs, r, stages):
    costs = [[sum(prof[g][str(mbs)][str(t)][str(x)][:2]) for x in range(sim.num_layers)] for g, t in stages]
    per = [[(g, t)] * r for g, t in stages]

    def plan(lps):
        return {"mbs": mbs, "pipeline_list": [pipeline_dict(lps, per)]}

    n = len(stages)
    even = [list(range(k * sim.num_layers // n, (k + 1) * sim.num_layers // n)) for k in range(n)]
    p2p = quiet(estimate_p2p_pipeline_times, sim.activation_sizes_per_layer,
                convert_homogeneous(plan(even), sim.training_config).pipeline_list[0], mbs,
                sim.inter_network_coeffs, sim.intra_network_coeffs)  # fmt: skip
    lps = min_max_split(costs, p2p, sum(map(sum, costs)) + sum(p2p))
    if lps is None or not quiet(sim.check_config_fits, plan(lps)):
        return math.inf, ""
    shape = " | ".join(f"{g} tp{t} x{len(x)}" for (g, t), x in zip(stages, lps))
    return quiet(sim.simulate_iteration_time, plan(lps))[0], f"mb{mbs} r{r}: {shape}"


def main():
    out = []
    for item in ROOT["plans"]:
        sim = simulator(item["model"], item["gbs"])
        doc, blocks = item["doc"], sim.num_layers - 2
        if doc["kind"] == "staged":
            t, fits, how = score_staged(sim, doc, blocks, item["gbs"])
        else:
            t, fits, how = score_lines(sim, doc, blocks)
        ours = our_p2p(sim, doc, blocks, item["gbs"]) if doc["kind"] == "pipeline" else None
        best = best_pipeline(sim, item["model"], item["devices"])
        out.append(
            {
                "name": item["name"],
                "score": t,
                "fits": bool(fits),
                "how": how,
                "our_p2p": ours,
                "best_pipeline": best,
            }
        )
    json.dump(out, sys.stdout)


main()
