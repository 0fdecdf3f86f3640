"""The QC block of `hygiene:` (hygiene/qc_block.py, docs/qc.md "The QC block"): bound before launch."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceml_tui.hygiene import qc_block
from traceml_tui.hygiene.config import HygieneConfigError, parse_hygiene
from traceml_tui.run import cli as run_cli

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((REPO / "examples" / "hygiene" / "traceml.yaml").read_text())
MEMBERS = ["case-001", "case-007", "case-013"]
BOUND_QC = {
    "cadence": 100,
    "owner": "vanguard-hal",
    "output": "qc",
    "roster": {"name": "val-fixed-3", "members": MEMBERS, "selection": "every 6th validation case by id",
               "split": "val"},
    "items": {"batch_grid": "required", "field_stats": "required", "galleries": {"inapplicable": "no groups"},
              "worker_qc": {"inapplicable": "heavy QC runs inside validate.py"}},
}


def _hygiene(qc: dict) -> dict:
    block = copy.deepcopy(EXAMPLE["hygiene"])
    block["qc"] = copy.deepcopy(qc)
    return block


def test_a_bound_block_normalizes_with_the_roster_digest_and_every_item() -> None:
    qc = parse_hygiene(_hygiene(BOUND_QC))["qc"]
    assert qc["owner"] == "vanguard-hal" and qc["output"] == "qc" and qc["cadence"] == 100
    digest = qc_block.roster_digest(MEMBERS)
    assert digest.startswith("sha256:") and len(digest) == 71
    assert qc["roster"] == {"name": "val-fixed-3", "members": MEMBERS, "digest": digest, "size": 3,
                            "selection": "every 6th validation case by id", "split": "val"}
    assert qc["items"] == {"batch_grid": {"required": True}, "field_stats": {"required": True},
                           "galleries": {"required": False, "inapplicable": "no groups"},
                           "worker_qc": {"required": False, "inapplicable": "heavy QC runs inside validate.py"}}
    # bound by its digest alone (a large roster kept elsewhere): the size is required with it
    by_digest = copy.deepcopy(BOUND_QC)
    by_digest["roster"] = {"name": "big", "digest": digest, "size": 3, "selection": "all"}
    assert parse_hygiene(_hygiene(by_digest))["qc"]["roster"] == {"name": "big", "digest": digest, "size": 3,
                                                                  "selection": "all"}
    # a block with cadence alone is what it was (not bound)
    assert parse_hygiene(_hygiene({"cadence": 5}))["qc"] == {"cadence": 5}


def _without(path: str) -> dict:
    qc = copy.deepcopy(BOUND_QC)
    *parents, leaf = path.split(".")
    node = qc
    for key in parents:
        node = node[key]
    del node[leaf]
    return qc


def _with(path: str, value) -> dict:
    qc = copy.deepcopy(BOUND_QC)
    *parents, leaf = path.split(".")
    node = qc
    for key in parents:
        node = node[key]
    node[leaf] = value
    return qc


BAD = [
    (_without("owner"), "hygiene.qc.owner: required"),
    (_without("roster"), "hygiene.qc.roster: required"),
    (_without("output"), "hygiene.qc.output: required"),
    (_without("items"), "hygiene.qc.items: required"),
    (_without("items.galleries"), "hygiene.qc.items.galleries: required: declare it required, or {inapplicable"),
    (_with("items.worker_qc", "required"), "hygiene.qc.recipe: required"),  # a required worker QC names its worker
    (_with("recipe", "qc-v1"), "hygiene.qc.recipe: only with items.worker_qc: required"),
    (_with("items.galleries", "maybe"), "hygiene.qc.items.galleries: must be required or {inapplicable"),
    (_with("items.galleries", {"inapplicable": " "}), "hygiene.qc.items.galleries.inapplicable: must be a nonempty"),
    (_with("items.histograms", "required"), "hygiene.qc.items.histograms: unknown QC item"),
    (_with("output", "figures"), "hygiene.qc.output: must be qc"),
    (_with("owner", ""), "hygiene.qc.owner: must be a nonempty line"),
    (_without("roster.selection"), "hygiene.qc.roster.selection: must be a nonempty line"),
    (_without("roster.name"), "hygiene.qc.roster.name: must be a nonempty line"),
    (_without("roster.members"), "hygiene.qc.roster.members: required"),
    (_with("roster.members", ["a", "b", "a"]), "hygiene.qc.roster.members[2]: 'a' is listed twice"),
    (_with("roster.members", []), "hygiene.qc.roster.members: must be a nonempty list"),
    (_with("roster.digest", "sha256:" + "0" * 64), "hygiene.qc.roster.digest: 'sha256:000"),
    (_with("roster.size", 4), "hygiene.qc.roster.size: 4 but 3 members"),
    (_with("roster.origin", "x"), "hygiene.qc.roster.origin: unknown key"),
]


@pytest.mark.parametrize("qc,said", BAD, ids=[s.split(":")[0] + "-" + str(i) for i, (_, s) in enumerate(BAD)])
def test_a_bad_block_is_refused_naming_the_field(qc: dict, said: str) -> None:
    with pytest.raises(HygieneConfigError) as err:
        parse_hygiene(_hygiene(qc))
    assert str(err.value).startswith(said), str(err.value)
    assert "\n" not in str(err.value)


def test_traceml_run_refuses_a_bad_block_before_the_script_starts(tmp_path: Path, monkeypatch, capsys) -> None:
    config = copy.deepcopy(EXAMPLE)
    config["hygiene"]["qc"] = _without("items.worker_qc")
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "train.py").write_text("open('SCRIPT_RAN', 'w').write('yes')\n")
    monkeypatch.chdir(tmp_path)
    rc = run_cli.main(["train.py", "--run-name", "q"])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert err.startswith(f"traceml run: {(tmp_path / 'traceml.yaml').resolve()}: hygiene.qc.items.worker_qc: "
                          "required"), err
    assert not (tmp_path / "SCRIPT_RAN").exists() and not (tmp_path / "logs").exists()


def test_the_bound_block_is_recorded_in_the_manifest_and_a_changed_roster_refuses_the_resume(
        tmp_path: Path, monkeypatch, capsys) -> None:
    config = copy.deepcopy(EXAMPLE)
    config["hygiene"]["qc"] = copy.deepcopy(BOUND_QC)
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli.main(["train.py", "--run-name", "q"]) == 0
    manifest = json.loads((tmp_path / "logs/q/manifest.json").read_text())
    qc = manifest["hygiene"]["qc"]
    assert qc["owner"] == "vanguard-hal" and qc["roster"]["digest"] == qc_block.roster_digest(MEMBERS)
    assert qc["roster"]["members"] == MEMBERS and qc["items"]["batch_grid"] == {"required": True}

    config["hygiene"]["qc"]["roster"]["members"] = [*MEMBERS, "case-019"]
    (tmp_path / "traceml.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert run_cli.main(["train.py", "--run-name", "q", "--resume"]) != 0
    assert "hygiene.qc.roster.members" in capsys.readouterr().err

#: the machine may be loaded: generation speed is not what these tests check
LOADED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
ITEM_DECL = st.dictionaries(st.sampled_from(qc_block.ITEMS),
                            st.one_of(st.just({"required": True}),
                                      st.just({"required": False, "inapplicable": "n/a"})))


@LOADED
@given(ITEM_DECL, st.dictionaries(st.sampled_from(qc_block.ITEMS), st.integers(min_value=0, max_value=5)))
def test_a_required_item_is_missing_exactly_when_nothing_was_produced(items: dict, produced: dict) -> None:
    rows = qc_block.judge_items(items, produced)
    assert set(rows) == set(items)
    for item, row in rows.items():
        if not items[item]["required"]:
            assert row["state"] == qc_block.INAPPLICABLE and row["reason"] == "n/a"
        else:
            assert row["state"] == (qc_block.PRODUCED if produced.get(item, 0) > 0 else qc_block.MISSING)
    missing = [i for i, r in rows.items() if r["state"] == qc_block.MISSING]
    for field in (qc_block.OK, qc_block.FAILED, qc_block.NOT_RECORDED):
        status = qc_block.qc_status(field, missing, True)
        assert (status == qc_block.FAILED) == (bool(missing) or field == qc_block.FAILED)
        assert status != qc_block.NOT_RECORDED  # a bound block is always judged


def test_the_report_names_a_missing_item_and_counts_what_a_run_directory_holds(tmp_path: Path) -> None:
    import numpy as np

    from traceml_tui.hygiene.batch_grid import save_batch_grid

    declared = parse_hygiene(_hygiene(BOUND_QC))["qc"]
    fields = {"status": "ok", "failed_fields": [], "fields": {"z": {"status": "ok"}}}
    report = qc_block.qc_report(tmp_path, declared, fields)
    assert report["status"] == "failed" and report["missing_items"] == ["batch_grid"]
    assert report["items"]["field_stats"] == {"state": "produced", "required": True, "count": 1}
    assert report["roster"]["size"] == 3 and "members" not in report["roster"]  # the digest names them
    lines = qc_block.report_lines(report)
    assert lines[0].startswith("QC FAILED: required item batch_grid was never produced")

    save_batch_grid(tmp_path, np.zeros((2, 4, 4)), step=0)
    report = qc_block.qc_report(tmp_path, declared, fields)
    assert report["status"] == "ok" and report["missing_items"] == []
    assert not any(line.startswith("QC FAILED") for line in qc_block.report_lines(report))
    # an unbound block keeps the field verdicts and says it is not bound
    assert qc_block.qc_report(tmp_path, {"cadence": 5}, fields) == {**fields, "bound": False}


YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
              st.text(max_size=10), st.sampled_from(["required", "qc", "sha256:" + "a" * 64])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from([*qc_block.ITEMS, "inapplicable", "members",
                                                                       "name", "selection", "digest", "size"]),
                                                      st.text(max_size=6), st.integers()), inner, max_size=5)),
    max_leaves=15)


@LOADED
@given(st.dictionaries(st.sampled_from(qc_block.BINDING_KEYS), YAML_VALUES, min_size=1))
def test_any_block_is_accepted_or_refused_in_one_line_naming_a_qc_field(binding: dict) -> None:
    """The block comes from a user's YAML: whatever it holds, the answer is a normalized block or one line."""
    qc = {**copy.deepcopy(BOUND_QC), **binding}
    try:
        parsed = parse_hygiene(_hygiene(qc))["qc"]
    except HygieneConfigError as exc:
        assert str(exc).startswith("hygiene.qc.") and "\n" not in str(exc)
        return
    if all(qc.get(key) is None for key in qc_block.BINDING_KEYS):
        assert parsed == {"cadence": 100}  # nothing bound: the block as it was
        return
    assert set(parsed) == {"cadence", *qc_block.BINDING_KEYS}
    assert parsed["roster"]["digest"].startswith("sha256:") and parsed["roster"]["size"] >= 1
    assert set(parsed["items"]) == set(qc_block.ITEMS)
    json.dumps(parsed)  # what the manifest records is plain JSON


def test_the_items_phrase_judges_nothing_before_the_run_ends() -> None:
    assert qc_block.items_word(None, True) == "pending: judged when the run ends"
    assert qc_block.items_word(None, False).startswith("not bound")
    assert qc_block.items_word({"bound": True, "missing_items": ["galleries"]}, True) == (
        "FAILED, never produced: galleries")
    assert qc_block.items_word({"bound": True, "missing_items": []}, True) == "all required items produced"
