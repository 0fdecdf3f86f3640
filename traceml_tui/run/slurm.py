"""What a Slurm job step tells `traceml run` about its place in the job (docs/cluster.md).

`srun traceml run train.py` inside an `sbatch` script needs no topology
flags: the launcher reads the node count, this node's index, the rendezvous
host and a run name from the variables Slurm sets for every task of a step.
Pure functions over an environment mapping; nothing here reads the process
environment itself or touches the cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

#: Rendezvous ports derived from the job id fall in [PORT_BASE, PORT_BASE + PORT_SPAN): above the well-known
#: and registered ranges most services use, below the usual ephemeral range (32768+).
PORT_BASE = 20000
PORT_SPAN = 10000

#: A node list longer than this many hosts is refused (a typo such as ``n[1-99999999]`` must not eat memory).
MAX_HOSTS = 65536


class SlurmError(ValueError):
    """Slurm's variables are malformed or contradict the command line; ``str()`` is one line."""


@dataclass(frozen=True)
class SlurmStep:
    """This task's view of its Slurm job step (one `traceml run` per node)."""

    job_id: str
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    run_name: str


def _split_top(expr: str) -> list[str]:
    """Split a host list at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmError(f"node list {expr[:80]!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"node list {expr[:80]!r}: unbalanced brackets")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise SlurmError(f"node list {expr[:80]!r}: unbalanced brackets")
    parts.append(expr[start:])
    return parts


def _expand_range(spec: str, whole: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if m is None:
            raise SlurmError(f"node list {whole[:80]!r}: {item!r} is not a number or a range")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise SlurmError(f"node list {whole[:80]!r}: range {item!r} runs backwards")
        if int(hi) - int(lo) + 1 > MAX_HOSTS:
            raise SlurmError(f"node list {whole[:80]!r}: range {item!r} holds more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") else 0  # "01-04": zero-padded to the width written
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_nodelist(expr: str) -> list[str]:
    """Expand Slurm's compressed host list (``gpu[01-04,07]``, ``a,b``, ``rack[1-2]-n[1-2]``) in order."""
    expr = expr.strip()
    if not expr:
        raise SlurmError("node list is empty")
    hosts: list[str] = []
    for part in _split_top(expr):
        if not part:
            raise SlurmError(f"node list {expr[:80]!r}: empty host name")
        names = [""]
        for literal, bracket in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            if bracket:
                names = [n + literal + x for n in names for x in _expand_range(bracket, expr)]
            else:
                names = [n + literal for n in names]
            if len(names) > MAX_HOSTS:
                raise SlurmError(f"node list {expr[:80]!r} holds more than {MAX_HOSTS} hosts")
        hosts.extend(names)
        if len(hosts) > MAX_HOSTS:
            raise SlurmError(f"node list {expr[:80]!r} holds more than {MAX_HOSTS} hosts")
    return hosts


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise SlurmError(f"{name}={value[:40]!r} is not a number") from None


def step_of(env: Mapping[str, str]) -> Optional[SlurmStep]:
    """This task's Slurm step, or None outside one.

    Only a task started by ``srun`` counts (``SLURM_STEP_NUM_NODES`` is set):
    an `sbatch` script's own shell runs on the first node alone, so reading
    the job's node count there would wait for launchers that never start.
    One launcher per node: a step with more tasks than nodes is refused.
    """
    if not env.get("SLURM_JOB_ID") or "SLURM_STEP_NUM_NODES" not in env:
        return None
    job_id = env["SLURM_JOB_ID"]
    if not re.fullmatch(r"\d+", job_id):
        raise SlurmError(f"SLURM_JOB_ID={job_id[:40]!r} is not a job number")
    nnodes = _int(env, "SLURM_STEP_NUM_NODES")
    node_rank = _int(env, "SLURM_NODEID")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise SlurmError(f"SLURM_NODEID={node_rank} is outside the step's {nnodes} node(s)")
    if "SLURM_STEP_NUM_TASKS" in env and _int(env, "SLURM_STEP_NUM_TASKS") != nnodes:
        raise SlurmError(
            f"the Slurm step runs {env['SLURM_STEP_NUM_TASKS']} tasks on {nnodes} node(s): start one "
            "`traceml run` per node (srun --ntasks-per-node=1); it starts the ranks itself (--nproc-per-node)")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    hosts = expand_nodelist(nodelist)
    array_job, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array_job and task:
        if not (re.fullmatch(r"\d+", array_job) and re.fullmatch(r"\d+", task)):
            raise SlurmError(f"SLURM_ARRAY_JOB_ID/SLURM_ARRAY_TASK_ID={array_job[:20]!r}/{task[:20]!r} are not numbers")
        run_name = f"slurm-{array_job}-{task}"
    else:
        run_name = f"slurm-{job_id}"
    return SlurmStep(job_id=job_id, nnodes=nnodes, node_rank=node_rank, master_addr=hosts[0],
                     master_port=PORT_BASE + int(job_id) % PORT_SPAN, run_name=run_name)
