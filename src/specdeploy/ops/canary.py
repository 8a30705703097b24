"""A canary for a new drafter or release: one host first, promoted to the fleet only when it beats the serving one.

:func:`canary` takes a change (``-e`` values, or an inventory that already holds it) and:

1. reads the release every engine host serves (its exporter's ``specdeploy_engine_info``);
2. deploys the change to the canary host alone, through the ordinary deploy (preflight, probe, drain behind the
   router and the deploy's own rollback on failure). Behind the router the canary then takes its share of the
   traffic, one replica among the others;
3. measures the canary against a control host still on the serving release at matched load: the same prompts at
   the same concurrency, sent to each engine directly, in interleaved rounds (control then canary, then canary
   then control, ...) so that a drift of the machine falls on both sides alike;
4. promotes (the ordinary deploy of the same change to every engine host, one at a time) only when the canary
   beats the control: its time per output token is lower, with the 95% interval of the ratio not reaching a
   slowdown beyond ``tolerance``, and, where both speculate, its acceptance length is at least the control's,
   with the same rule for its interval. Anything else -- worse, or not distinguishable from the noise -- is not a
   promotion: the canary host is rolled back whole (``rollback.yml``: unit, drafter, gate verdict) and the fleet
   ends on the release it served before, which is checked.

What was measured and decided is written as ``canary.json`` with a chart beside it.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError

ROUNDS = 6  # interleaved rounds per side: enough for an interval (ratio_interval needs two a side)


@dataclass
class Side:
    host: str
    url: str
    rounds: list[dict]

    def series(self, key: str) -> list[float]:
        return [r[key] for r in self.rounds if isinstance(r.get(key), (int, float)) and r[key] > 0]


def tpot_ms(level: dict) -> float | None:
    """Time per output token of one round: the engine's own inter-token latency where it has the histogram, else
    the client's (concurrency streams over the round's output rate)."""
    if isinstance(level.get("itl_ms"), (int, float)) and level["itl_ms"] > 0:
        return float(level["itl_ms"])
    tps = level.get("output_tps") or 0
    return 1000.0 * level["concurrency"] / tps if tps > 0 else None


def measure(control: tuple[str, str], candidate: tuple[str, str], engine: str, concurrency: int, requests: int,
            max_tokens: int, rounds: int = ROUNDS, api_key: str | None = None, say=print) -> tuple[Side, Side]:
    """Interleaved rounds at matched load on both sides (each round the same prompts and concurrency)."""
    from specdeploy.speculation.gate import load_prompts, model_name, run_level
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    prompts = load_prompts()
    sides = (Side(control[0], control[1], []), Side(candidate[0], candidate[1], []))
    models = [model_name(s.url, headers) for s in sides]
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            s = sides[i]
            lv = run_level(s.url, engine, models[i], prompts, concurrency, requests, max_tokens, headers, rounds=1)
            lv["tpot_ms"] = tpot_ms(lv)
            for key in ("rounds_tps", "aa"):  # one round: no spread within it
                lv.pop(key, None)
            s.rounds.append(lv)
            al = lv.get("acceptance_length")
            line = f"canary: round {r + 1}/{rounds} {('control', 'canary')[i]} {s.host}: "
            line += f"TPOT {lv['tpot_ms']:.2f} ms" if lv["tpot_ms"] else "no tokens"
            line += f", acceptance length {al:.2f}" if al else ""
            line += f", {lv['errors']} failed" if lv["errors"] else ""
            say(line)
    return sides


def decide(control: Side, candidate: Side, tolerance: float = 0.05) -> dict:
    """promote / reject, with each criterion's figures. TPOT: the speedup control/canary (above 1: the canary is
    faster) must be >= 1 at its point and its interval's bottom >= 1 - tolerance. Acceptance length (where both
    sides report one every round): canary/control >= 1 at the point and its bottom >= 1 - tolerance. A failed
    request on the canary, a side without two measured rounds, or a side that speculates while the other does
    not report an acceptance length, is a rejection with that reason."""
    from specdeploy.speculation.gate import ratio_interval
    out: dict = {"tolerance": tolerance, "criteria": {}}
    reasons = []
    errors = sum(r.get("errors", 0) for r in candidate.rounds)
    if errors:
        reasons.append(f"{errors} request(s) failed on the canary")
    ct, kt = control.series("tpot_ms"), candidate.series("tpot_ms")
    iv = ratio_interval(ct, kt) if len(ct) == len(control.rounds) and len(kt) == len(candidate.rounds) else None
    if iv is None:
        reasons.append("time per output token was not measured in every round on both sides (no interval)")
    else:
        point = statistics.mean(ct) / statistics.mean(kt)
        ok = point >= 1 and iv[0] >= 1 - tolerance
        out["criteria"]["tpot"] = {"control_ms": statistics.mean(ct), "canary_ms": statistics.mean(kt),
                                   "speedup": point, "interval": list(iv), "ok": ok}
        if not ok:
            reasons.append(f"time per output token {statistics.mean(kt):.2f} ms against the serving "
                           f"{statistics.mean(ct):.2f} ms: speedup {point:.3f}x, 95% interval {iv[0]:.3f}-{iv[1]:.3f}")
    ca, ka = control.series("acceptance_length"), candidate.series("acceptance_length")
    full = lambda s, v: len(v) == len(s.rounds)  # noqa: E731
    if full(control, ca) and full(candidate, ka):
        aiv = ratio_interval(ka, ca)
        point = statistics.mean(ka) / statistics.mean(ca)
        ok = aiv is not None and point >= 1 and aiv[0] >= 1 - tolerance
        out["criteria"]["acceptance_length"] = {"control": statistics.mean(ca), "canary": statistics.mean(ka),
                                                "ratio": point, "interval": list(aiv) if aiv else None, "ok": ok}
        if not ok:
            reasons.append(f"acceptance length {statistics.mean(ka):.2f} against the serving "
                           f"{statistics.mean(ca):.2f}" + (f" (ratio {point:.3f}, 95% interval "
                                                             f"{aiv[0]:.3f}-{aiv[1]:.3f})" if aiv else ""))
    elif ca and not ka:
        reasons.append("the serving release speculates and the canary reports no acceptance length")
    else:
        out["criteria"]["acceptance_length"] = {"control": statistics.mean(ca) if ca else None,
                                                "canary": statistics.mean(ka) if ka else None, "ok": None,
                                                "note": "not compared: a side does not speculate in every round"}
    out["decision"] = "reject" if reasons else "promote"
    out["reasons"] = reasons
    return out


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "specdeploy.cli", *args]


def _extra(extra_vars: list[str]) -> list[str]:
    return [a for e in extra_vars for a in ("-e", e)]


def serving_releases(targets, timeout: float = 5.0) -> dict[str, str | None]:
    from specdeploy.ops.status import scrape_exporter
    return {t.host: scrape_exporter(t, timeout).get("release") for t in targets}


def chart(report: dict, out: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sides = report["sides"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "tpot_ms", "time per output token (ms)"),
                           (axes[1], "acceptance_length", "acceptance length")):
        for j, (name, s) in enumerate(sides.items()):
            ys = [r.get(key) for r in s["rounds"]]
            ax.plot(range(1, len(ys) + 1), [y if y else float("nan") for y in ys], "o-",
                    label=f"{name} {s['host']}", color=("tab:blue", "tab:orange")[j])
        ax.set_xlabel("interleaved round")
        ax.set_title(label)
        ax.legend(fontsize=8)
    fig.suptitle(f"canary {report['canary']}: {report['decision']['decision']}")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def canary(inventory: str, host: str, extra_vars: list[str], targets, control: str | None = None,
           concurrency: int = 4, requests: int = 8, max_tokens: int = 64, rounds: int = ROUNDS,
           tolerance: float = 0.05, out_dir: Path | None = None, api_key: str | None = None, say=print,
           run=subprocess.run, timeout: float = 7200, passthrough: list[str] | None = None) -> dict:
    """The whole canary; returns the report (also written as ``out_dir/canary.json``). ``passthrough``: options
    every deploy and rollback it runs is given as well (the vault's)."""
    more = list(passthrough or [])
    by_name = {t.host: t for t in targets}
    if host not in by_name:
        raise SpecdeployError([Finding("error", "--host", f"{host} is not an engine host of {inventory}",
                                       f"give one of: {', '.join(sorted(by_name)) or '(none)'}")])
    others = [t for t in targets if t.host != host]
    if control is not None and control not in {t.host for t in others}:
        raise SpecdeployError([Finding("error", "--control", f"{control} is not another engine host of {inventory}",
                                       "give an engine host other than the canary")])
    if not others:
        raise SpecdeployError([Finding("error", "--host", f"{inventory} has one engine host: a canary needs "
                                       "another host on the serving release to compare with",
                                       "deploy to the single host with the gate (specdeploy_spec_gate) instead")])
    engines = {t.engine for t in targets}
    if len(engines) > 1:
        raise SpecdeployError([Finding("error", "specdeploy_engine", f"the engine hosts serve {sorted(engines)}: "
                                       "a canary compares hosts of one engine", "give --limit to one engine's hosts")])
    before = serving_releases(targets)
    missing = [h for h, r in before.items() if not r]
    if missing:
        raise SpecdeployError([Finding("error", "serving release", f"no serving release read from the exporter "
                                       f"of {', '.join(missing)}", "deploy the fleet first (specdeploy deploy), "
                                       "then run the canary")])
    ctl = by_name[control] if control else others[0]
    cand = by_name[host]
    report: dict = {"canary": host, "control": ctl.host, "before": before, "extra_vars": list(extra_vars),
                    "load": {"concurrency": concurrency, "requests_per_round": requests, "max_tokens": max_tokens,
                             "rounds": rounds}}
    say(f"canary {host}: serving release {before[host]}; control {ctl.host} ({before[ctl.host]})")
    say(f"canary {host}: deploying the change to it alone")
    rc = run(_cli("deploy", "-i", inventory, "--limit", host, *_extra(extra_vars), *more),
             timeout=timeout).returncode
    report["canary_deploy_rc"] = rc
    now = serving_releases([cand])[host]
    report["canary_release"] = now
    if rc != 0 or now in (None, before[host]):
        why = (f"its deploy exited {rc}" if rc != 0 else
               "its deploy changed nothing (the change gives the release it serves)" if now == before[host]
               else "it serves no release after its deploy")
        report["decision"] = {"decision": "reject", "reasons": [why], "criteria": {}}
    else:
        say(f"canary {host}: now {now}; measuring against {ctl.host} at concurrency {concurrency}, "
            f"{rounds} interleaved rounds of {requests} requests")
        from specdeploy.values.peerhttp import host_port
        sides = measure((ctl.host, f"http://{host_port(ctl.address, ctl.engine_port)}"),
                        (cand.host, f"http://{host_port(cand.address, cand.engine_port)}"), cand.engine, concurrency,
                        requests, max_tokens, rounds, api_key, say=say)
        report["sides"] = {"control": {"host": ctl.host, "rounds": sides[0].rounds},
                           "canary": {"host": cand.host, "rounds": sides[1].rounds}}
        report["decision"] = decide(sides[0], sides[1], tolerance)
    d = report["decision"]
    if d["decision"] == "promote":
        say(f"canary {host}: promote - deploying the change to every engine host, one at a time")
        rc = run(_cli("deploy", "-i", inventory, *_extra(extra_vars), "-e", "specdeploy_serial=1", *more),
                 timeout=timeout).returncode
        report["promote_rc"] = rc
    else:
        for r in d["reasons"]:
            say(f"canary {host}: not promoted - {r}")
        if now not in (None, before[host]):
            say(f"canary {host}: rolling it back to {before[host]}")
            rc = run(_cli("rollback", "-i", inventory, "--limit", host, *more), timeout=timeout).returncode
            report["rollback_rc"] = rc
    after = serving_releases(targets)
    report["after"] = after
    report["fleet_on_serving"] = after == before
    if d["decision"] != "promote" and after != before:
        say(f"canary {host}: the fleet is NOT back on its serving releases: {after} (was {before})")
    report["at"] = time.time()
    if out_dir is not None:  # the output rule (plan.outdir): a new directory beside, renamed in
        from specdeploy.plan.outdir import atomic_output_dir
        with atomic_output_dir(out_dir, CANARY_CMD) as tmp:
            (tmp / "canary.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
            if "sides" in report:
                chart(report, tmp / "canary.png")
    return report


CANARY_CMD = "canary"
