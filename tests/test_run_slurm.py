"""`srun traceml run` with no topology flags: the node list expander, Slurm's step variables, and two real
launchers on this machine that Slurm's variables alone make one run of two nodes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_run_e2e import NODE_SCRIPT, TRACEML, _env, _free_port

from traceml_tui.run.cli import parse_options
from traceml_tui.run.options import LaunchError
from traceml_tui.run.slurm import PORT_BASE, PORT_SPAN, SlurmError, expand_nodelist, step_of


@pytest.mark.parametrize(("expr", "hosts"), [
    ("node1", ["node1"]),
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("tux[1-3]", ["tux1", "tux2", "tux3"]),
    ("a,b,c", ["a", "b", "c"]),
    ("linux[0-1],gpu[10-11]", ["linux0", "linux1", "gpu10", "gpu11"]),
    ("node[1,3-4]-ib", ["node1-ib", "node3-ib", "node4-ib"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # unpadded ranges grow in width
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("gpu-a100-[1-2].cluster", ["gpu-a100-1.cluster", "gpu-a100-2.cluster"]),
])
def test_expand_nodelist_forms_slurm_documents(expr, hosts):
    assert expand_nodelist(expr) == hosts


@pytest.mark.parametrize("expr", ["", "n[1-", "n1]", "n[3-1]", "n[a]", "n[1-99999999]", "a,,b", "n[[1]]"])
def test_malformed_nodelists_are_refused(expr):
    with pytest.raises(SlurmError):
        expand_nodelist(expr)


def _slurm(nnodes: int, node: int, job: str = "4242", **extra: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_NUM_NODES": str(nnodes), "SLURM_STEP_NUM_TASKS": str(nnodes),
           "SLURM_NODEID": str(node), "SLURM_STEP_NODELIST": f"gpu[01-{nnodes:02d}]"}
    env.update(extra)
    return env


def test_step_of_reads_a_srun_task():
    assert step_of({}) is None
    assert step_of({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "4"}) is None  # the batch script's own shell
    step = step_of(_slurm(4, 2))
    assert (step.nnodes, step.node_rank, step.master_addr, step.run_name) == (4, 2, "gpu01", "slurm-4242")
    assert step.master_port == PORT_BASE + 4242 % PORT_SPAN
    arr = step_of(_slurm(2, 0, SLURM_ARRAY_JOB_ID="100", SLURM_ARRAY_TASK_ID="3"))
    assert arr.run_name == "slurm-100-3"


@pytest.mark.parametrize(("env", "words"), [
    (_slurm(2, 0, SLURM_STEP_NUM_TASKS="8"), "one `traceml run` per node"),
    (_slurm(2, 5), "SLURM_NODEID=5"),
    (_slurm(2, 0, job="12x"), "SLURM_JOB_ID"),
    (_slurm(2, 0, SLURM_STEP_NODELIST="gpu[01-"), "brackets"),
])
def test_bad_slurm_variables_are_one_line(tmp_path, env, words):
    script = tmp_path / "t.py"
    script.write_text("")
    with pytest.raises(LaunchError, match="Slurm") as info:
        parse_options([str(script)], environ=env)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_flags_win_where_they_choose_and_are_refused_where_they_contradict(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    opts = parse_options([str(script)], environ=_slurm(2, 1))
    assert (opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port, opts.run_name) == (
        2, 1, "gpu01", PORT_BASE + 4242, "slurm-4242")
    opts = parse_options([str(script), "--master-addr", "10.0.0.1", "--master-port", "29500", "--run-name", "mine",
                          "--nnodes", "2", "--node-rank", "1"], environ=_slurm(2, 1))
    assert (opts.master_addr, opts.master_port, opts.run_name) == ("10.0.0.1", 29500, "mine")
    for flags, words in ((["--nnodes", "4"], "--nnodes 4 contradicts Slurm's SLURM_STEP_NUM_NODES=2"),
                         (["--node-rank", "0"], "--node-rank 0 contradicts Slurm's SLURM_NODEID=1")):
        with pytest.raises(LaunchError, match=words):
            parse_options([str(script), *flags], environ=_slurm(2, 1))
    single = parse_options([str(script)], environ=_slurm(1, 0))
    assert (single.nnodes, single.node_rank, single.master_port) == (1, 0, None)  # one node: no rendezvous port
    plain = parse_options([str(script), "--run-name", "x"], environ={})
    assert (plain.nnodes, plain.node_rank, plain.master_addr) == (1, 0, "127.0.0.1")


# --------------------------------------------------------------------------- real launchers


def _topology(manifest: dict) -> tuple:
    training = manifest["guard"]["training"]
    return (manifest["topology"] if "topology" in manifest else None, training["nodes_expected"],
            training["nodes_observed"], [n["node_rank"] for n in training["nodes"]], training["status"])


def _launch_nodes(workdir: Path, tmp_path: Path, nnodes: int, *, slurm: bool, name: str) -> dict:
    """``nnodes`` launchers on this machine, configured by Slurm's variables alone or by explicit flags."""
    import shutil

    from test_run_e2e import SEED_YAML

    workdir.mkdir()
    shutil.copy(SEED_YAML, workdir / "traceml.yaml")
    (workdir / "node.py").write_text(NODE_SCRIPT)
    port = _free_port()
    job = str(port - PORT_BASE + PORT_SPAN) if PORT_BASE <= port < PORT_BASE + PORT_SPAN else None
    procs = []
    for node in range(nnodes):
        # one node runs two ranks (the script needs a process group); two nodes run one rank each
        common = ["--logs-dir", str(workdir / "logs"), "--finalize-timeout", "30",
                  "--nproc-per-node", "2" if nnodes == 1 else "1"]
        if slurm and (job is not None or nnodes == 1):
            env = _env(tmp_path, SLURM_JOB_ID=job or "1", SLURM_STEP_NUM_NODES=str(nnodes),
                       SLURM_STEP_NUM_TASKS=str(nnodes), SLURM_NODEID=str(node),
                       SLURM_STEP_NODELIST=",".join(["localhost"] * nnodes))
            args = common
        elif slurm:  # the free port lies outside Slurm's derived range: pass it, the rest still from Slurm
            env = _env(tmp_path, SLURM_JOB_ID="1", SLURM_STEP_NUM_NODES=str(nnodes), SLURM_STEP_NUM_TASKS=str(nnodes),
                       SLURM_NODEID=str(node), SLURM_STEP_NODELIST=",".join(["localhost"] * nnodes))
            args = [*common, "--master-port", str(port)]
        else:
            env = _env(tmp_path)
            args = [*common, "--run-name", name, "--nnodes", str(nnodes), "--node-rank", str(node),
                    *(["--master-port", str(port)] if nnodes > 1 else [])]
        procs.append(subprocess.Popen([*TRACEML, "run", "node.py", *args], cwd=workdir, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * nnodes, [e[-1500:] for e in errs]
    (run_dir,) = [p for p in (workdir / "logs").iterdir() if p.is_dir()]
    if slurm:
        assert run_dir.name.startswith("slurm-")
    return json.loads((run_dir / "manifest.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("nnodes", [1, 2])
def test_slurm_variables_alone_give_the_topology_of_the_explicit_flags(tmp_path, nnodes):
    by_slurm = _launch_nodes(tmp_path / "slurm", tmp_path, nnodes, slurm=True, name="")
    by_flags = _launch_nodes(tmp_path / "flags", tmp_path, nnodes, slurm=False, name="flags")
    assert _topology(by_slurm) == _topology(by_flags)
    assert by_slurm["guard"]["training"]["nodes_observed"] == nnodes
