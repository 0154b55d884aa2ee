"""The Prometheus exporter and the learner's metrics sinks, scraped over loopback HTTP."""

from __future__ import annotations

import json
import math

import pytest

from asyncrl.observe.metrics import MetricsWriter
from asyncrl.observe.prometheus import PrometheusExporter, Sample, scalar_samples, url_port
from tests.doubles.scraper import scrape

pytestmark = pytest.mark.timeout(60)


def test_exporter_serves_what_was_published_last():
    ex = PrometheusExporter("t", 0)
    try:
        assert ex.port > 0 and url_port(ex.url) == ex.port and ex.url.startswith("http://127.0.0.1:")
        assert scrape(ex.url) == {}
        ex.publish([Sample("loss", 0.25), Sample("frames", 3, "counter"), Sample("nan", math.nan),
                    Sample("by/kind", 2, "counter", (("kind", "too_large"),)), Sample("by/kind", 5, "counter", (("kind", "x"),))])
        got = scrape(ex.url)
        assert got[("t_loss", ())] == 0.25
        assert got[("t_frames_total", ())] == 3
        assert got[("t_by_kind_total", (("kind", "too_large"),))] == 2
        assert got[("t_by_kind_total", (("kind", "x"),))] == 5
        assert not any(name.startswith("t_nan") for name, _ in got)  # non-finite values are left out
        ex.publish([Sample("loss", 0.5)])
        assert scrape(ex.url) == {("t_loss", ()): 0.5}
    finally:
        ex.close()


def test_two_exporters_in_one_process_do_not_collide():
    a, b = PrometheusExporter("a", 0), PrometheusExporter("b", 0)
    try:
        a.publish([Sample("x", 1)])
        b.publish([Sample("x", 2)])
        assert scrape(a.url) == {("a_x", ()): 1} and scrape(b.url) == {("b_x", ()): 2}
    finally:
        a.close()
        b.close()


def test_scalar_samples_flattens_nested_numbers_and_skips_the_rest():
    got = {s.name: s.value for s in scalar_samples(
        {"loss": 1.5, "ok": True, "label": "x", "push": {"bytes": 10, "s": 0.5}, "hub": {"lost": 0}}, skip=("hub",))}
    assert got == {"loss": 1.5, "push_bytes": 10.0, "push_s": 0.5}


RECORD = {"loss": 0.75, "grad_norm": 2.0, "reward_mean": 0.4, "tokens_per_s": 123.0, "step_time_s": 0.3,
          "behav_prox_logp_absdiff": 0.01, "push": {"bytes": 4096}, "hub": {"accounting": {"trained": 8}}}


def test_learner_metrics_writer_exports_each_step(tmp_path):
    w = MetricsWriter(tmp_path, prometheus_port=0)
    try:
        w.write(7, RECORD)
        got = scrape(w.exporter.url)
        assert got[("asyncrl_learner_step", ())] == 7
        for key in ("loss", "grad_norm", "reward_mean", "tokens_per_s", "step_time_s", "behav_prox_logp_absdiff"):
            assert got[(f"asyncrl_learner_{key}", ())] == RECORD[key], key
        assert got[("asyncrl_learner_push_bytes", ())] == 4096
        assert not any("hub" in name for name, _ in got)  # the hub exports its own counters
        w.write(8, {**RECORD, "loss": 0.5})
        assert scrape(w.exporter.url)[("asyncrl_learner_loss", ())] == 0.5
    finally:
        w.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [7, 8]


def test_metrics_writer_without_port_serves_nothing(tmp_path):
    w = MetricsWriter(tmp_path)
    assert w.exporter is None and w.wandb is None
    w.close()


def test_wandb_offline_logs_the_learner_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e .[wandb]; the test extra has it)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    w = MetricsWriter(tmp_path, wandb_project="asyncrl-test")
    w.write(1, RECORD)
    w.write(2, {**RECORD, "loss": 0.5})
    w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
