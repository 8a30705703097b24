"""The reading side of the security classes (robust_security): hostile host and group names, terminal control
sequences wherever text from outside is shown, secret values echoed by a leaky run, and input nested, sized and
shaped to exhaust a reader."""
from __future__ import annotations

import json
import os
import random
import threading
import typing
from pathlib import Path

import yaml

import robust_cases as rc
from robust_security import SecCase, alerts_body, fill, no_network, with_peer


# --- class: hostile names ---------------------------------------------------------------------------------------

CONTROLS = ("\x1b[2J", "\x07", "\x9b", "\r", "\n", "\t", " ", "\x7f", "\x00")
INVISIBLE = ("\u200b", "\u200d", "\ufeff", "\u202e", "\u2028", "\u00ad")
LOOKALIKE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441"}


def hostile_names(base: str = "gpu-a") -> dict[str, str]:
    """label -> a name generated from ``base``: path escapes, separators, control and invisible characters at
    each end and inside, leading dot or dash, look-alike letters."""
    out = {"dotdot": "..", "dot": "."}
    for label, pre in (("up", "../"), ("up-etc", "../../etc/systemd/system/"), ("abs", "/"), ("here", "./")):
        out[f"prefix-{label}"] = pre + base
    for sep in ("/", "\\", "/../"):
        out[f"infix-{sep!r}"] = base[:3] + sep + base[3:]
    for i, c in enumerate(CONTROLS + INVISIBLE):
        where = ("end", "inside", "start")[i % 3]
        out[f"char-{ord(c[0]):04x}-{where}"] = (base + c if where == "end" else base[:3] + c + base[3:]
                                            if where == "inside" else c + base)
    out["lead-dot"], out["lead-dash"], out["lead-dashes"] = "." + base, "-" + base, "--" + base
    for ch, look in LOOKALIKE.items():
        if ch in base:
            out[f"look-{ch}"] = base.replace(ch, look, 1)
    return out


def _rename(kind: str, new: str):
    def setup(ctx):
        hosts = Path(ctx["inv"]) / "hosts.yml"
        data = yaml.safe_load(hosts.read_text())
        eng = data["all"]["children"]["specdeploy_engines"]
        if kind == "host":
            eng["hosts"][new] = eng["hosts"].pop("gpu-a")
        else:  # a child group holding gpu-a
            eng.setdefault("children", {})[new] = {"hosts": {"gpu-a": None}}
        hosts.write_text(yaml.safe_dump(data, allow_unicode=False))
    return setup


NAME_COMMANDS = {"plan": ["plan", "-i", "{inv}", "--out", "{out}/p"], "preflight": ["preflight", "-i", "{inv}"],
                 "argv": ["engine", "argv", "-i", "{inv}", "--host", "gpu-b"],
                 "verify": ["verify", "-i", "{inv}", "--events", "{out}/events.jsonl"],
                 "status": ["status", "-i", "{inv}", "--prometheus", "{closed}", "--timeout", "0.5"],
                 "canary": ["canary", "-i", "{inv}", "--host", "gpu-b", "--out", "{out}/c"],
                 "regate": ["regate", "-i", "{inv}", "--prometheus", "{closed}", "--state", "{out}/st.json"],
                 "report": ["report", "-i", "{inv}", "--out", "{out}/r.png"]}


def hostile_name_cases() -> list[SecCase]:
    from specdeploy.values.terminal import safe
    cases = []
    names = hostile_names()
    for (label, name), kind, (cmd, argv) in ((n, k, c) for n in names.items() for k in ("host", "group")
                                             for c in NAME_COMMANDS.items()):
        if kind == "group" and ("/" in name or name in (".", "..")) and cmd != "plan":
            continue
        shown = safe(name)
        cases.append(SecCase("hostile-names", f"{kind}-{label}-{cmd}", argv, (shown, repr(name)[1:-1]),
                             setup=_rename(kind, name), patch=no_network))
    return cases


# --- class: terminal control ------------------------------------------------------------------------------------

SEQUENCES = {"clear": "\x1b[2J\x1b[H", "title": "\x1b]0;owned\x07", "link": "\x1b]8;;http://x.invalid/\x1b\\here"
             "\x1b]8;;\x1b\\", "c1-csi": "\x9b31m", "bell": "\x07", "bidi": "\u202ecod.exe", "cr": "\rSPOOF",
             "backspace": "ok\x08\x08", "zero-width": "a\u200bb"}


def _metrics(p: str) -> str:
    lab = p.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ("# TYPE specdeploy_engine_up gauge\nspecdeploy_engine_up 1\n"
            "# TYPE specdeploy_engine_info gauge\n"
            f'specdeploy_engine_info{{engine="vllm{lab}",version="0.16.0{lab}",release="r{lab}",spec_tokens="3"}} 1\n'
            "# TYPE specdeploy_gate_verdict gauge\n"
            f'specdeploy_gate_verdict{{verdict="keep{lab}"}} 1\n')


def _terminal_carriers() -> dict[str, typing.Callable[[str], tuple[list[str], typing.Callable | None,
                                                                       typing.Callable | None]]]:
    """carrier -> payload -> (argv, setup, patch): where text from outside reaches the terminal."""
    def log_line(p):
        def setup(ctx):
            (Path(ctx["root"]) / "engine.log").write_text(f"INFO start {p}\nTraceback (most recent call last):\n"
                                                          f"RuntimeError: CUDA out of memory {p}\n")
        return ["triage", "{root}/engine.log"], setup, None

    def log_name(p):
        return ["triage", "{root}/missing" + p.replace("\x00", "") + ".log"], None, None

    def candidate(p):
        def setup(ctx):
            r = rc._tune_results()
            r["rounds"][0]["candidates"].append(dict(r["rounds"][0]["candidates"][0], name=f"cand{p}"))
            (Path(ctx["root"]) / "r.json").write_text(json.dumps(r))
        return ["nccl", "choose", "{root}/r.json"], setup, None

    def e_value(p):
        return ["plan", "-i", "{inv}", "-e", json.dumps({"specdeploy_served_model_name": f"m{p}"})], None, None

    def inv_path(p):
        return ["plan", "-i", "{root}/inv" + p.replace("\x00", "")], None, None

    def out_path(p):
        return ["report", "--prometheus", "{closed}", "--out", "{root}/r" + p.replace("\x00", "") + ".png"], \
            None, None

    def exporter_label(p):
        def setup(ctx):
            rc.set_var(ctx, "specdeploy_exporter_port", int(ctx["peer_port"]))
        return ["status", "-i", "{inv}", "--prometheus", "{closed}", "--timeout", "2"], setup, \
            with_peer(_metrics(p))

    def alert_label(p):
        return ["regate", "-i", "{inv}", "--prometheus", "{peer}", "--dry-run", "--state", "{root}/st.json"], \
            None, with_peer(alerts_body(p))
    return {"log-line": log_line, "log-name": log_name, "candidate": candidate, "e-value": e_value,
            "inventory-path": inv_path, "out-path": out_path, "exporter-label": exporter_label,
            "alert-label": alert_label}


def terminal_cases() -> list[SecCase]:
    cases = []
    for (sname, seq), (cname, carrier) in ((s, c) for s in SEQUENCES.items() for c in _terminal_carriers().items()):
        argv, setup, patch = carrier(seq)
        if patch is not None and setup is not None:
            def both(ctx, mp, patch=patch, setup=setup):
                patch(ctx, mp)
                setup(ctx)
            patch, setup = both, None
        cases.append(SecCase("terminal-control", f"{cname}-{sname}", argv, expect="any", setup=setup, patch=patch,
                             writes=("{root}/st.json", "{root}/.st.json.lock")))
    return cases


# --- class: secrets by value ------------------------------------------------------------------------------------

def _token(seed: int) -> str:
    return "s3cr3t-" + random.Random(seed).randbytes(8).hex()


LEAKS = ("task", "msg", "debug", "stderr", "triage")  # where the fake run echoes a value, as a leaky play would


def _fake_runner(values: list[str], channel: str, seen: list):
    """patch: ansible_runner.run_async played by a run that echoes ``values`` through ``channel`` and records
    what reached ansible-playbook (the -e file it was given, read while the run lasts)."""
    def patch(ctx, mp):
        import shlex
        import types

        import ansible_runner

        def run_async(**kw):
            args = shlex.split(kw.get("cmdline") or "")
            files = [a[1:] for a in args if a.startswith("@")]
            seen.append({"extravars": kw.get("extravars"), "files": {f: Path(f).read_text() for f in files
                                                                     if Path(f).is_file()},
                         "private": kw.get("private_data_dir")})
            v = " ".join(values)
            for host in ("gpu-a", "gpu-b"):
                task = f"Use {v}" if channel == "task" else "Install the key"
                h = kw["event_handler"]
                h({"event": "runner_on_start", "event_data": {"host": host, "task": task, "role": "inference_engine"}})
                res = {"msg": f"failed with {v}"} if channel == "msg" else {"stderr": f"key={v}"} \
                    if channel == "stderr" else {"msg": "no"}
                if channel == "debug":
                    h({"event": "runner_on_ok", "event_data": {"host": host, "task": task, "task_action": "debug",
                                                               "res": {"msg": f"value {v}"}}})
                if channel == "triage":
                    res["ansible_facts"] = {"inference_engine_triage": {"root_cause": f"bad {v}", "outcome": "failed"}}
                h({"event": "runner_on_failed", "event_data": {"host": host, "task": task, "res": res}})
            h({"event": "playbook_on_stats", "event_data": {"failures": {"gpu-a": 1, "gpu-b": 1}}})
            t = threading.Thread(target=lambda: None)
            t.start()
            return t, types.SimpleNamespace(rc=2)
        mp.setattr(ansible_runner, "run_async", run_async)
    return patch


def secret_cases() -> list[SecCase]:
    """-e values under names that do not look secret, nested, as KEY=VALUE, JSON and @file; API key file
    contents; each echoed by the run through each channel."""
    cases = []
    shapes = {
        "kv": lambda v: ["-e", f"hf_tok={v}"],
        "kv-plain-name": lambda v: ["-e", f"note={v}"],
        "json-nested": lambda v: ["-e", json.dumps({"cfg": {"endpoint": {"auth": [v]}}})],
        "at-file": lambda v: ["-e", "@{root}/vars.yml"],
        "schema-var": lambda v: ["-e", f"specdeploy_served_model_name={v}"],
        "api-key-file": lambda v: [],
    }
    for i, ((shape, argv_of), channel) in enumerate((s, c) for s in shapes.items() for c in LEAKS):
        v = _token(i)
        seen: list = []

        def setup(ctx, v=v, shape=shape):
            (Path(ctx["root"]) / "vars.yml").write_text(f"model_token: {v}\n")
            if shape == "api-key-file":
                (Path(ctx["root"]) / "secrets" / "example-api-key").write_text(v + "\n")
                rc.set_var(ctx, "specdeploy_api_key_file", str(Path(ctx["root"]) / "secrets" / "example-api-key"))

        def check(ctx, out, v=v, seen=seen, shape=shape):
            (call,) = seen[-1:]
            assert call["extravars"] is None, "the -e values went to ansible-runner's env/extravars"
            if shape != "api-key-file":
                assert any(v in text for text in call["files"].values()), "the -e value did not reach ansible"
            for f in call["files"]:
                assert not Path(f).exists() or f.endswith("vars.yml"), f"{f} was left after the run"
            assert not Path(call["private"]).parent.exists(), "the runner's private directory was left"
            events = list((Path(ctx["root"]) / "cwd" / ".cache" / "runs").glob("*/events.jsonl"))
            assert events and "<redacted>" in events[0].read_text(), "no event log, or nothing redacted"
        argv = ["verify", "-i", "{inv}", *argv_of(v)]
        # the vars file and the API key file are the operator's own: everything else must not hold the value
        cases.append(SecCase("secrets", f"{shape}-{channel}", argv, expect="any", setup=setup,
                             secrets=(v,), patch=_fake_runner([v], channel, seen), check=check,
                             writes=("{root}/vars.yml", "{root}/secrets", "{root}/cwd/.cache"),
                             extra={"allowed_holders": ("vars.yml", "example-api-key")}))
    return cases


# --- class: depth and size --------------------------------------------------------------------------------------

DEPTHS = {"101": 101, "5k": 5000, "100k": 100_000}


def _deep(fmt: str, n: int) -> str:
    if fmt == "json-obj":
        return '{"a": ' * n + "1" + "}" * n
    if fmt == "json-list":
        return "[" * n + "]" * n
    if fmt == "yaml-block":
        return "a:\n" + "".join(" " * i + "a:\n" for i in range(1, min(n, 20_000)))
    return "- " * n + "x\n"  # yaml-dash: a sequence in a sequence in ..., on one line


# reader -> (argv, the file it reads (placeholders), formats it takes, names its error must name)
READERS = {
    "target-check": (["drafter", "check", "{models}/drafter", "--target", "{models}/target", "--engine", "vllm"],
                     "{models}/target/config.json", ("json-obj", "json-list"), ("config.json",)),
    "target-preflight": (["preflight", "-i", "{inv}"], "{models}/target/config.json", ("json-obj",),
                         ("config.json",)),
    "breakeven": (["breakeven", "--target", "{models}/target"], "{models}/target/config.json",
                  ("json-obj", "json-list"), ("config.json",)),
    "drafter-check": (["drafter", "check", "{models}/drafter", "--target", "{models}/target", "--engine", "vllm"],
                      "{models}/drafter/config.json", ("json-obj",), ("config.json",)),
    "choose": (["nccl", "choose", "{root}/r.json"], "{root}/r.json", ("json-obj", "json-list"), ("r.json",)),
    "baseline": (["gate", "--url", "{closed}", "--baseline", "{root}/b.json", "--out", "{out}/g"], "{root}/b.json",
                 ("json-obj",), ("--baseline",)),
    "report-nccl": (["report", "--prometheus", "{closed}", "--nccl", "{root}/r.json", "--out", "{out}/r.png"],
                    "{root}/r.json", ("json-list",), ("--nccl",)),
    "e-file": (["plan", "-i", "{inv}", "-e", "@{root}/x.yml"], "{root}/x.yml",
               ("json-obj", "json-list", "yaml-block", "yaml-dash"), ("x.yml",)),
    "group-vars": (["plan", "-i", "{inv}"], "{inv}/group_vars/all.yml", ("json-obj", "yaml-block", "yaml-dash"),
                   ("all.yml",)),
    "candidates": (["nccl", "tune", "--candidates", "{root}/c.yml", "--out", "{out}/t.json"], "{root}/c.yml",
                   ("json-obj", "yaml-dash"), ("--candidates",)),
    "state": (["regate", "-i", "{inv}", "--prometheus", "{closed}", "--dry-run", "--state", "{root}/st.json"],
              "{root}/st.json", ("json-obj",), ("--state",)),
    "routing-trace": (["breakeven", "--target", "{models}/target", "--routing-trace", "{root}/t.json"],
                      "{root}/t.json", ("json-list",), ("--routing-trace",)),
}


def _put(rel: str, make: typing.Callable[[Path], None]):
    def setup(ctx):
        p = Path(fill(rel, ctx))
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            p.unlink()
        make(p)
    return setup


def _sparse(size: int):
    def make(p: Path):
        with open(p, "wb") as f:
            f.write(b'{"hidden_size": 7168, "pad": "')
            f.truncate(size)
    return make


def _text(text: str):
    return lambda p: p.write_text(text)


def _config_with(**values):
    def setup(ctx):
        p = Path(ctx["models"]) / "target" / "config.json"
        cfg = json.loads(p.read_text())
        (cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg).update(values)
        p.write_text(json.dumps(cfg))
    return setup


JINJA = {"loop": "{% for i in range(100000000) %}x{% endfor %}", "range": "{{ range(100000000) | list | length }}",
         "permutations": "{{ range(12) | permutations | list | length }}", "pow": "{{ 10 ** 100000000 }}",
         "lookup": "{{ lookup('pipe', 'sleep 100') }}", "repeat": "{{ 'x' * 100000000 }}",
         "slow-map": "{{ range(5000000) | map('string') | map('upper') | join | length }}"}


def depth_size_cases() -> list[SecCase]:
    cases = []
    for (rname, (argv, path, fmts, names)), (dname, n) in ((r, d) for r in READERS.items()
                                                            for d in DEPTHS.items()):
        for fmt in fmts:  # block nesting is bounded by its column (bounded.MAX_YAML_COLUMN), not by MAX_DEPTH
            harmless = fmt == "yaml-block" and n <= 1000
            cases.append(SecCase("depth-size", f"deep-{rname}-{fmt}-{dname}", argv, names,
                                 "any" if harmless else "error", setup=_put(path, _text(_deep(fmt, n))), timeout=30))
    cases.append(SecCase("depth-size", "deep-e-inline", ["plan", "-i", "{inv}", "-e", _deep("json-obj", 5000)],
                         ("-e",)))
    cases.append(SecCase("depth-size", "deep-alerts", ["regate", "-i", "{inv}", "--prometheus", "{peer}", "--dry-run",
                                                        "--state", "{root}/st.json"], ("--prometheus",),
                         patch=with_peer(_deep("json-obj", 5000)), writes=("{root}/st.json", "{root}/.st.json.lock")))
    cases.append(SecCase("depth-size", "deep-prometheus-query", ["status", "-i", "{inv}", "--prometheus", "{peer}",
                                                                 "--timeout", "2"], expect="any",
                         patch=with_peer(_deep("json-list", 100000))))
    big = 300 << 20
    for rname in ("target-check", "target-preflight", "breakeven", "choose", "baseline", "e-file", "group-vars",
                  "state", "routing-trace"):
        argv, path, _, names = READERS[rname]
        cases.append(SecCase("depth-size", f"size-{rname}-300M", argv, names, setup=_put(path, _sparse(big)),
                             timeout=30))
    cases.append(SecCase("depth-size", "size-triage-300M", ["triage", "{root}/engine.log"], expect="any",
                         setup=_put("{root}/engine.log", _sparse(big)), timeout=30))
    fifo = os.mkfifo
    for rname in ("target-check", "target-preflight", "breakeven", "drafter-check", "choose", "baseline", "e-file",
                  "group-vars", "candidates", "state", "routing-trace"):
        argv, path, _, names = READERS[rname]
        cases.append(SecCase("depth-size", f"fifo-{rname}", argv, names, setup=_put(path, fifo), timeout=15))
    cases.append(SecCase("depth-size", "fifo-shard-check", READERS["target-check"][0], ("safetensors",),
                         setup=_put("{models}/target/model-00001-of-00001.safetensors", fifo), expect="any",
                         timeout=15))
    cases.append(SecCase("depth-size", "fifo-triage", ["triage", "{root}/engine.log"], ("engine.log",),
                         setup=_put("{root}/engine.log", fifo), timeout=15))
    for key, values in (("num_hidden_layers", (10**5, 10**9, 2**63)), ("hidden_size", (10**9, 2**63)),
                        ("vocab_size", (10**12,)), ("num_attention_heads", (10**9,))):
        for v in values:
            for rname in ("target-check", "target-preflight", "breakeven"):
                cases.append(SecCase("depth-size", f"absurd-{key}-{v}-{rname}", READERS[rname][0], (key, "config"),
                                     setup=_config_with(**{key: v}), timeout=30))
    for jname, tmpl in JINJA.items():
        for where in ("e", "group-vars"):
            argv = ["plan", "-i", "{inv}"] + (["-e", json.dumps({"specdeploy_served_model_name": tmpl})]
                                              if where == "e" else [])
            setup = None if where == "e" else (lambda ctx, t=tmpl: rc.set_var(ctx, "specdeploy_served_model_name", t))
            cases.append(SecCase("depth-size", f"jinja-{jname}-{where}", argv, ("specdeploy_served_model_name",),
                                 setup=setup, patch=_budget(1.0), timeout=20))
    return cases


def _budget(seconds: float):
    def patch(ctx, mp):
        import specdeploy.hostvars.inventory_ansible as ia
        import specdeploy.hostvars.jinja_guard as jg
        mp.setattr(jg, "BUDGET_S", seconds)
        mp.setattr(ia, "VAULT_SCRIPT_S", seconds)
    return patch


