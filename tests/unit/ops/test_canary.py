"""`specdeploy canary`: the decision from interleaved rounds (worse, better, within the noise, failed requests,
a side without speculation), and the flow it runs: the canary's deploy, then either the fleet's deploy or the
canary's rollback, and the check that the fleet ends where it started when the canary is not promoted."""
from __future__ import annotations

import random
import subprocess

import pytest

from specdeploy.ops import canary as C
from specdeploy.ops.fleet import Target
from specdeploy.values.errors import SpecdeployError


def _side(host, tpot, al=None, spread=0.02, n=6, seed=1, errors=0):
    rnd = random.Random(seed)
    rounds = [{"tpot_ms": tpot * (1 + rnd.uniform(-spread, spread)), "errors": errors if i == 0 else 0,
               "acceptance_length": al * (1 + rnd.uniform(-spread, spread)) if al else None,
               "concurrency": 2} for i in range(n)]
    return C.Side(host, f"http://{host}", rounds)


def test_a_worse_canary_is_rejected_on_both_criteria():
    d = C.decide(_side("a", 10.0, 2.5), _side("b", 14.0, 1.6, seed=2))
    assert d["decision"] == "reject"
    assert d["criteria"]["tpot"]["ok"] is False and d["criteria"]["tpot"]["interval"][1] < 1
    assert d["criteria"]["acceptance_length"]["ok"] is False
    assert any(r.startswith("time per output token") for r in d["reasons"])
    assert any(r.startswith("acceptance length") for r in d["reasons"])


def test_a_better_canary_is_promoted():
    d = C.decide(_side("a", 14.0, 1.6), _side("b", 10.0, 2.5, seed=2))
    assert d["decision"] == "promote" and d["reasons"] == []
    assert d["criteria"]["tpot"]["speedup"] > 1.3 and d["criteria"]["acceptance_length"]["ratio"] > 1.4


def test_a_canary_inside_the_noise_is_not_promoted_when_its_interval_reaches_a_slowdown():
    # the same TPOT with a 30% spread: whatever the point, the interval's bottom is far below 1 - 5%
    d = C.decide(_side("a", 10.0, 2.0, spread=0.3), _side("b", 10.0, 2.0, spread=0.3, seed=7))
    assert d["decision"] == "reject"
    assert d["criteria"]["tpot"]["interval"][0] < 0.95


def test_a_failed_request_on_the_canary_rejects_it():
    d = C.decide(_side("a", 14.0, 1.6), _side("b", 10.0, 2.5, seed=2, errors=1))
    assert d["decision"] == "reject" and "1 request(s) failed on the canary" in d["reasons"]


def test_a_canary_that_stops_speculating_is_judged_by_tpot_only_the_other_way_round_is_refused():
    d = C.decide(_side("a", 12.0, None), _side("b", 10.0, 2.0, seed=2))
    assert d["decision"] == "promote" and d["criteria"]["acceptance_length"]["ok"] is None
    d = C.decide(_side("a", 12.0, 2.0), _side("b", 10.0, None, seed=2))
    assert d["decision"] == "reject"
    assert "the serving release speculates and the canary reports no acceptance length" in d["reasons"]


def test_tpot_falls_back_to_the_clients_figure_without_the_engines_histogram():
    assert C.tpot_ms({"itl_ms": 7.5, "concurrency": 4, "output_tps": 100}) == 7.5
    assert C.tpot_ms({"itl_ms": None, "concurrency": 4, "output_tps": 100}) == 40.0
    assert C.tpot_ms({"itl_ms": None, "concurrency": 4, "output_tps": 0}) is None


HOSTS = [Target("h1", "127.0.0.1", "vllm", 18000, 19450, "specdeploy-vllm", []),
         Target("h2", "127.0.0.2", "vllm", 18000, 19450, "specdeploy-vllm", [])]


class Fleet:
    """The hosts' releases as their exporters report them, changed by the commands the canary runs."""

    def __init__(self, canary_rc=0):
        self.rel = {"h1": "r-old", "h2": "r-old"}
        self.calls: list[list[str]] = []
        self.canary_rc = canary_rc

    def run(self, argv, timeout):
        args = argv[3:]
        self.calls.append(args)
        if args[0] == "deploy" and "--limit" in args:
            if self.canary_rc == 0:
                self.rel[args[args.index("--limit") + 1]] = "r-new"
            return subprocess.CompletedProcess(argv, self.canary_rc)
        if args[0] == "deploy":
            self.rel = {h: "r-new" for h in self.rel}
        elif args[0] == "rollback":
            self.rel[args[args.index("--limit") + 1]] = "r-old"
        return subprocess.CompletedProcess(argv, 0)

    def releases(self, targets, timeout=5.0):
        return {t.host: self.rel[t.host] for t in targets}


@pytest.fixture
def fleet(monkeypatch):
    f = Fleet()
    monkeypatch.setattr(C, "serving_releases", f.releases)
    return f


def _measured(worse: bool):
    def measure(control, candidate, *a, **k):
        c, n = _side(control[0], 10.0, 2.4), _side(candidate[0], 13.0 if worse else 8.0, 1.5 if worse else 3.0, seed=3)
        return c, n
    return measure


def test_a_worse_canary_is_rolled_back_and_the_fleet_ends_on_its_serving_release(fleet, monkeypatch, tmp_path):
    monkeypatch.setattr(C, "measure", _measured(worse=True))
    lines = []
    rep = C.canary("inv", "h2", ["specdeploy_drafter_path=/d2"], HOSTS, out_dir=tmp_path, say=lines.append,
                   run=fleet.run, passthrough=["--vault-id", "prod@f"])
    assert [c[0] for c in fleet.calls] == ["deploy", "rollback"]
    assert fleet.calls[0] == ["deploy", "-i", "inv", "--limit", "h2", "-e", "specdeploy_drafter_path=/d2",
                              "--vault-id", "prod@f"]
    assert fleet.calls[1] == ["rollback", "-i", "inv", "--limit", "h2", "--vault-id", "prod@f"]
    assert rep["decision"]["decision"] == "reject" and rep["fleet_on_serving"] is True
    assert rep["after"] == {"h1": "r-old", "h2": "r-old"} and rep["canary_release"] == "r-new"
    assert (tmp_path / "canary.json").is_file() and (tmp_path / "canary.png").stat().st_size > 1000
    assert any("not promoted - time per output token" in m for m in lines)


def test_a_better_canary_is_promoted_to_every_host_one_at_a_time(fleet, monkeypatch):
    monkeypatch.setattr(C, "measure", _measured(worse=False))
    rep = C.canary("inv", "h2", ["x=1"], HOSTS, run=fleet.run, say=lambda m: None)
    assert fleet.calls[1] == ["deploy", "-i", "inv", "-e", "x=1", "-e", "specdeploy_serial=1"]
    assert rep["decision"]["decision"] == "promote" and rep["promote_rc"] == 0
    assert rep["after"] == {"h1": "r-new", "h2": "r-new"} and rep["fleet_on_serving"] is False


def test_a_failed_canary_deploy_is_not_measured_nor_promoted(monkeypatch):
    f = Fleet(canary_rc=2)
    monkeypatch.setattr(C, "serving_releases", f.releases)
    monkeypatch.setattr(C, "measure", lambda *a, **k: pytest.fail("measured after a failed deploy"))
    rep = C.canary("inv", "h2", [], HOSTS, run=f.run, say=lambda m: None)
    assert [c[0] for c in f.calls] == ["deploy"]  # the deploy's own rollback kept the release; nothing to undo
    assert rep["decision"]["reasons"] == ["its deploy exited 2"] and rep["fleet_on_serving"] is True


def test_a_change_that_gives_the_serving_release_is_not_a_canary(fleet, monkeypatch):
    monkeypatch.setattr(C, "measure", lambda *a, **k: pytest.fail("measured an unchanged host"))
    fleet.run = (lambda orig: lambda argv, timeout: subprocess.CompletedProcess(argv, 0))(fleet.run)
    rep = C.canary("inv", "h2", [], HOSTS, run=fleet.run, say=lambda m: None)
    assert "changed nothing" in rep["decision"]["reasons"][0]


@pytest.mark.parametrize("host,control,hosts,field", [
    ("h9", None, HOSTS, "--host"), ("h2", "h2", HOSTS, "--control"), ("h1", None, HOSTS[:1], "--host"),
    ("h1", None, [HOSTS[0], Target("h2", "x", "sglang", 1, 2, "u", [])], "specdeploy_engine")])
def test_impossible_canaries_are_refused_naming_the_field(fleet, host, control, hosts, field):
    with pytest.raises(SpecdeployError) as e:
        C.canary("inv", host, [], hosts, control=control, run=fleet.run, say=lambda m: None)
    assert e.value.problems[0].subject == field and fleet.calls == []


def test_a_host_without_a_serving_release_is_refused_before_anything_runs(fleet):
    fleet.rel["h1"] = None
    with pytest.raises(SpecdeployError) as e:
        C.canary("inv", "h2", [], HOSTS, run=fleet.run, say=lambda m: None)
    assert "h1" in e.value.problems[0].message and fleet.calls == []
