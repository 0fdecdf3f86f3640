"""`traceml daemon --metrics`: a real daemon process over the committed real runs, scraped by a real
Prometheus that answers PromQL with the same words `traceml status` shows; promtool checks the
exposition and unit-tests the shipped alert rules."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.metrics import HostPortError, parse_host_port
from daemon.reader import Reader
from traceml_tui.core.state import LIVE_RUN_STATES

from support.fixture_runs import FIXTURE_RUNS, INGESTED_AT, name_of
from support.realruns import build_case, subprocess_env

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "examples" / "prometheus"
# A real Prometheus scraping on its own clock: one such test at a time (README, test lanes); its module-scoped
# daemons are built once, on that worker.
pytestmark = pytest.mark.xdist_group("external")
NEEDS_PROMETHEUS = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus/promtool not installed (.ci/run installs Debian's prometheus package)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def _wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{what}: {last!r}")


@pytest.mark.parametrize(("text", "want"), [("127.0.0.1:9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)),
                                            ("[::1]:9000", ("::1", 9000)), ("0.0.0.0:80", ("0.0.0.0", 80))])
def test_parse_host_port(text, want):
    assert parse_host_port(text) == want


@pytest.mark.parametrize("text", ["9464", "host:", "host:0", "host:70000", "host:http"])
def test_bad_metrics_address_is_one_line_exit_2(text, tmp_path, traceml_cmd, cli_env):
    with pytest.raises(HostPortError):
        parse_host_port(text)
    proc = subprocess.run([*traceml_cmd, "daemon", str(tmp_path), "--metrics", text, "--index",
                           str(tmp_path / "i.sqlite")], env=cli_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--metrics" in proc.stderr


@pytest.fixture
def metrics_daemon(tmp_path, cli_env, traceml_cmd):
    """A real `traceml daemon --metrics` over a copy of the committed real runs; yields (url, index, root)."""
    root = tmp_path / "logs"
    shutil.copytree(FIXTURE_RUNS, root, ignore=shutil.ignore_patterns("*.md", "facts.json"))
    index = tmp_path / "state" / "index.sqlite"
    port = _free_port()
    proc = subprocess.Popen([*traceml_cmd, "daemon", str(root), "--index", str(index), "--no-inotify",
                             "--metrics", f"127.0.0.1:{port}", "--metrics-retention", str(10 * 365 * 86400)],
                            env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        _wait(lambda: 'status="completed"} 1.0' in _get(url) and "traceml_backlog_requests{" in _get(url), 60,
              "the daemon's metrics never showed the runs")
        yield url, index, root
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """End a daemon started by a fixture: SIGTERM, then SIGKILL if it lingers."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_say_what_the_reader_says(metrics_daemon):
    url, index, _ = metrics_daemon
    text = _get(url)
    samples = _samples(text)
    with Reader(index) as reader:
        runs = reader.list_runs()
        assert {r.name for r in runs} >= {name_of("completed"), name_of("rank_raises"), name_of("hygiene")}
        for run in runs:
            lab = (("run", run.name), ("run_id", str(run.run_id)), ("status", str(run.status)))
            assert samples[("traceml_run_status", tuple(sorted(lab)))] == 1.0, (run.name, run.status)
            others = [v for (name, labels), v in samples.items() if name == "traceml_run_status"
                      and dict(labels)["run_id"] == str(run.run_id) and dict(labels)["status"] != str(run.status)]
            assert others and set(others) == {0.0}
        hygiene = reader.find_run(name_of("hygiene"))
        by_state: dict[str, int] = {}
        for item in reader.backlog.entries(hygiene.run_id):
            by_state[str(item.state)] = by_state.get(str(item.state), 0) + 1
        completed = reader.find_run(name_of("completed"))
        ranks = {r.rank: r for r in reader.rank_views(completed, reader.rank_rows(completed.run_id))}
    for state, count in by_state.items():
        key = ("traceml_backlog_requests", (("run", hygiene.name), ("run_id", str(hygiene.run_id)), ("state", state)))
        assert samples[key] == count
    assert len(ranks) == 2
    for rank, row in ranks.items():
        key = ("traceml_rank_step_time_median_seconds",
               (("rank", str(rank)), ("run", completed.name), ("run_id", str(completed.run_id))))
        assert samples[key] == pytest.approx(row.step_ms / 1000)  # the run's statistic: its summary's, it ended
    assert samples[("traceml_ingest_records_total", ())] > 0
    assert samples[("traceml_index_up", ())] == 1.0


def test_metrics_carry_the_runs_screens_marks_and_attention_count(metrics_daemon):
    """The validation marks and the attention count of the Runs screen (``✓ completed ⚠ 1 blocked``, ``N need
    attention``) as gauges, from the reader's own view of each run (core.state.validation_mark, needs_attention)."""
    url, index, _ = metrics_daemon
    samples = _samples(_get(url))
    with Reader(index) as reader:
        runs = reader.list_runs()
    marks = {}
    for run in runs:
        lab = (("run", run.name), ("run_id", str(run.run_id)))
        assert samples[("traceml_run_needs_attention", lab)] == (1.0 if run.attention else 0.0), run.name
        shown = {dict(labels)["mark"]: v for (name, labels), v in samples.items()
                 if name == "traceml_run_validation_mark" and dict(labels)["run_id"] == str(run.run_id)}
        if run.validation_mark is None:
            assert shown == {}, run.name
        else:
            marks[run.name] = shown
            expected = ({"blocked": float(run.validation_blocked)} if run.validation_mark.endswith("blocked")
                        else {"missing": 1.0})
            assert shown == expected, (run.name, run.validation_mark, shown)
    # the committed hygiene run: completed, but one request blocked — it needs attention, and says why
    hygiene = next(r for r in runs if r.name == name_of("hygiene"))
    assert hygiene.status_text.endswith("⚠ 1 blocked") and marks[hygiene.name] == {"blocked": 1.0}
    assert samples[("traceml_run_needs_attention", (("run", hygiene.name), ("run_id", str(hygiene.run_id))))] == 1.0
    assert samples[("traceml_runs_need_attention", ())] == sum(1 for r in runs if r.attention) > 1


@NEEDS_PROMETHEUS
def test_promtool_accepts_the_exposition_and_the_rules(metrics_daemon):
    url, _, _ = metrics_daemon
    check = subprocess.run(["promtool", "check", "metrics"], input=_get(url), capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    rules = subprocess.run(["promtool", "check", "rules", "traceml.rules.yml"], cwd=RULES, capture_output=True,
                           text=True, timeout=60)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    unit = subprocess.run(["promtool", "test", "rules", "traceml.rules.test.yml"], cwd=RULES, capture_output=True,
                          text=True, timeout=60)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


@NEEDS_PROMETHEUS
@pytest.mark.slow
def test_real_prometheus_scrapes_the_daemon_and_answers_promql(metrics_daemon, tmp_path):
    url, index, _ = metrics_daemon
    with _prometheus(url, tmp_path) as api:
        failed = _wait(lambda: _query(api, 'traceml_run_status{status="failed"} == 1'), 90,
                       "Prometheus never answered the failed runs")
        with Reader(index) as reader:
            want_failed = {r.name for r in reader.list_runs() if str(r.status) == "failed"}
            completed = reader.find_run(name_of("completed"))
            ranks = sorted(r.rank for r in reader.rank_rows(completed.run_id) if r.latest)
        assert {s["metric"]["run"] for s in failed} == want_failed and want_failed
        steps = _query(api, f'traceml_run_last_step{{run="{completed.name}"}}')
        assert [float(s["value"][1]) for s in steps] == [float(completed.last_step)]
        per_rank = _query(api, f'count by (run) (traceml_rank_step_time_median_seconds{{run="{completed.name}"}})')
        assert [int(s["value"][1]) for s in per_rank] == [len(ranks)]
        # The shipped rule fires for the failed runs (no `for:` delay).
        alerts = _wait(lambda: _firing(api, "TracemlRunFailed"), 30, "TracemlRunFailed never fired")
        assert {a["labels"]["run"] for a in alerts} == want_failed


@contextlib.contextmanager
def _prometheus(url: str, tmp_path: Path):
    """A real Prometheus scraping ``url`` every second with the shipped rules; yields its API base URL."""
    target = urllib.parse.urlparse(url).netloc
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(RULES / 'traceml.rules.yml'))}]\n"
        f"scrape_configs:\n  - job_name: traceml\n    static_configs: [{{targets: ['{target}']}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=15)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()


def _query(api: str, q: str) -> list:
    body = json.loads(_get(f"{api}/query?query={urllib.parse.quote(q)}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


def _firing(api: str, alertname: str) -> list:
    return [a for a in json.loads(_get(f"{api}/alerts"))["data"]["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


@pytest.fixture(scope="module")
def retention_daemon(tmp_path_factory):
    """A real daemon over the committed (old) runs plus one real run that failed just now, with a retention
    shorter than the committed runs' age: yields (url, index, fresh run name, retention)."""
    tmp = tmp_path_factory.mktemp("retention")
    root = tmp / "logs"
    shutil.copytree(FIXTURE_RUNS, root, ignore=shutil.ignore_patterns("*.md", "facts.json"))
    fresh = build_case("single_exits", tmp / "work", logs_dir=root, run_name="fresh-failure").name
    # Half the committed runs' age: they ended longer ago than that, the fresh run well within it.
    retention = (time.time() - INGESTED_AT) / 2
    if retention < 300:
        pytest.skip("the committed runs are too recent to be older than a retention that outlasts this test")
    index = tmp / "state" / "index.sqlite"
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "traceml_tui", "daemon", str(root), "--index", str(index),
                             "--no-inotify", "--metrics", f"127.0.0.1:{port}", "--metrics-retention", str(retention)],
                            env=subprocess_env(tmp / "state"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    want = {name_of(case) for case in ("completed", "rank_raises", "hung", "hygiene")} | {fresh}

    def ingested() -> bool:
        with Reader(index) as reader:
            return want <= {r.name for r in reader.list_runs()} and f'run="{fresh}"' in _get(url)

    try:
        _wait(ingested, 90, "the daemon never ingested the runs")
        yield url, index, fresh, retention
    finally:
        _stop(proc)


@pytest.mark.slow
def test_an_ended_run_drops_out_retention_after_its_last_record_not_after_ingest(retention_daemon):
    """docs/cluster.md: an ended run is dropped S seconds after its last record. A daemon that has just
    ingested old runs (a fresh index) must not export them — nor page for their failures — for another S."""
    url, index, fresh, retention = retention_daemon
    samples = _samples(_get(url))
    exported = {dict(labels)["run"] for (name, labels) in samples if name == "traceml_run_status"}
    with Reader(index) as reader:
        runs = {r.name: r for r in reader.list_runs()}
    assert str(runs[fresh].status) == "failed"
    old = {name for name, r in runs.items() if name != fresh and r.status not in LIVE_RUN_STATES}
    assert {name for name in old if str(runs[name].status) == "failed"}, "no old failed run: nothing tested"
    assert all(runs[name].last_ts < time.time() - retention for name in old)
    live = {name for name, r in runs.items() if r.status in LIVE_RUN_STATES}
    assert exported == live | {fresh}
    failed = {dict(labels)["run"] for (name, labels), v in samples.items()
              if name == "traceml_run_status" and dict(labels)["status"] == "failed" and v == 1.0}
    assert failed == {fresh}
    # every run is still in the index and counted: retention bounds what is exported, not what is kept
    assert samples[("traceml_ingest_records_total", ())] == sum(r.records for r in runs.values())


@NEEDS_PROMETHEUS
@pytest.mark.slow
def test_real_prometheus_pages_for_the_fresh_failure_only(retention_daemon, tmp_path):
    url, _, fresh, _ = retention_daemon
    with _prometheus(url, tmp_path) as api:
        # the rule has no `for:`: every run exported as failed fires at the same evaluation
        alerts = _wait(lambda: _firing(api, "TracemlRunFailed"), 90, "TracemlRunFailed never fired")
        assert {a["labels"]["run"] for a in alerts} == {fresh}
        assert [s["value"][1] for s in _query(api, 'count(traceml_run_status{status="failed"} == 1)')] == ["1"]


def test_metrics_module_does_not_import_textual_or_torch():
    code = "import sys, daemon.metrics; print('textual' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False False", out.stderr
