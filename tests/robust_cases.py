"""Cases of the generative robustness suite (tests/unit/cli/test_robustness.py): bad files, bad values and bad arguments
for the commands that run without a host.

A case is an argv with placeholders, filled in a fresh scratch tree per case:

- ``{inv}``: a copy of inventory/example whose hosts point at 127.0.0.1 (``{gv}``: its group_vars file);
- ``{models}/target`` and ``{models}/drafter``: copies of examples/models;
- ``{bad}``: a file made by ``make_bad(kind)`` (see ``FILE_KINDS``);
- ``{out}``: the one place a command may write; ``{closed}``: a loopback URL nothing listens on.

``names`` lists what the error output must contain (any one of them): the option, field or file at fault.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from helpers import REPO, point_at_loopback

# what the suite counts, printed by the terminal summary hook in conftest.py
COUNTS: dict[str, int] = {}


def count(kind: str, n: int = 1) -> None:
    COUNTS[kind] = COUNTS.get(kind, 0) + n


@dataclass
class Case:
    id: str
    argv: list[str]
    names: tuple[str, ...] = ()
    expect: str = "error"  # error: non-zero exit naming one of ``names``; any: exit either way, cleanly
    kind: str | None = None  # the bad file to make at {bad}
    setup: typing.Callable[[dict], None] | None = None  # edits the scratch tree before the run
    timeout: float = 10.0
    no_pip: bool = False  # wheelhouse: fail the case if pip would run
    bad_suffix: str = ""  # {bad} is bad<suffix>: matplotlib adds .png to a name without one
    writes: str | None = None  # a second path the command may write ({bad} where the bad path is an output)


# --- bad files ------------------------------------------------------------------------------------------------

FILE_KINDS = ("missing", "empty", "nonutf8", "binary", "json_list", "json_empty", "json_string", "json_wrong_types",
              "json_nan", "json_inf", "json_negative", "huge_line", "directory", "fifo", "dangling")


def make_bad(path: Path, kind: str) -> Path:
    """Make ``path`` a bad input of ``kind``; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writes = {
        "empty": b"",
        "nonutf8": b"{\"hidden_size\": \"\xff\xfe\xc0\"}\n",
        "binary": bytes(range(256)) * 4,
        "json_list": b"[1, 2, 3]\n",
        "json_empty": b"{}\n",
        "json_string": b"\"just a string\"\n",
        "json_wrong_types": json.dumps({"hidden_size": "big", "rounds": "x", "candidates": 5,
                                        "levels_by_concurrency": [1], "levels": {"a": 1},
                                        "num_hidden_layers": [], "vocab_size": {}, "architectures": 7,
                                        "text_config": "no"}).encode(),
        "json_nan": b"{\"hidden_size\": NaN, \"num_hidden_layers\": NaN, \"gpus\": NaN}\n",
        "json_inf": b"{\"hidden_size\": Infinity, \"num_hidden_layers\": -Infinity, \"gpus\": Infinity}\n",
        "json_negative": b"{\"hidden_size\": -7168, \"num_hidden_layers\": -1, \"gpus\": -2}\n",
        "huge_line": b"x" * (1 << 20),
    }
    if kind in writes:
        path.write_bytes(writes[kind])
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling":
        path.symlink_to(path.parent / "no-such-target")
    elif kind != "missing":
        raise ValueError(kind)
    return path


# --- the scratch tree -------------------------------------------------------------------------------------------

_TEMPLATE: list[Path] = []


def _template() -> Path:
    """The scratch tree, built once; its inventory reaches the model copies through {{ inventory_dir }}, so a copy
    of it works wherever it lands."""
    if _TEMPLATE:
        return _TEMPLATE[0]
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="specdeploy-robust-"))
    inv = root / "inventory" / "example"
    shutil.copytree(REPO / "inventory" / "example", inv)
    point_at_loopback(inv)
    models = root / "models"
    shutil.copytree(REPO / "examples" / "models" / "kimi-k2.5-int4", models / "target")
    shutil.copytree(REPO / "examples" / "models" / "kimi-k2.5-eagle3", models / "drafter")
    (root / "secrets").mkdir()
    (root / "secrets" / "example-api-key").write_text("sk-robustness-test\n")
    gv = inv / "group_vars" / "specdeploy_engines.yml"
    text = gv.read_text().replace("examples/models/kimi-k2.5-int4", "models/target")
    gv.write_text(text.replace("examples/models/kimi-k2.5-eagle3", "models/drafter"))
    (root / "cwd").mkdir()
    _TEMPLATE.append(root)
    return root


def cleanup_template() -> None:
    while _TEMPLATE:
        shutil.rmtree(_TEMPLATE.pop(), ignore_errors=True)


def scratch(root: Path) -> dict:
    """Build the per-case tree under ``root``; returns the placeholder values."""
    shutil.copytree(_template(), root, dirs_exist_ok=True, symlinks=True)
    inv = root / "inventory" / "example"
    return {"root": str(root), "inv": str(inv), "gv": str(inv / "group_vars" / "specdeploy_engines.yml"),
            "models": str(root / "models"), "bad": str(root / "bad"), "out": str(root / "out"),
            "closed": "http://127.0.0.1:9"}


def set_var(ctx: dict, key: str, value) -> None:
    gv = Path(ctx["gv"])
    data = yaml.safe_load(gv.read_text())
    data[key] = value
    gv.write_text(yaml.safe_dump(data, allow_unicode=False))


def bad_model_config(which: str, kind: str):
    """setup: replace config.json of the target or drafter copy with a bad file of ``kind``."""
    def setup(ctx):
        cfg = Path(ctx["models"]) / which / "config.json"
        cfg.unlink()
        make_bad(cfg, kind)
    return setup


# --- inventory variables ------------------------------------------------------------------------------------

def _base_types(ann) -> set:
    origin = typing.get_origin(ann)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return set().union(*(_base_types(a) for a in typing.get_args(ann)))
    if origin is typing.Literal:
        return {"literal"}
    if origin in (list, dict):
        return {origin}
    if isinstance(ann, type) and ann.__name__ == "CustomHardware":
        return {dict}
    return {ann}


CONTROL = "a\x00b\x1b[31mc\x07\n"


def bad_values(ann) -> list[tuple[str, object, str]]:
    """(label, value, expectation) for one field's annotation. ``error``: the value is of a wrong type or out of
    any sensible range; ``control``: control characters in a string (rejected by the schema work); ``any``:
    no traceback, either outcome."""
    types = _base_types(ann)
    out: list[tuple[str, object, str]] = []
    if not types & {list, dict}:
        out += [("list", [1, "two"], "error"), ("dict", {"k": {"n": 1}}, "error")]
    if types & {int, float}:
        out += [("word", "not-a-number", "error") if str not in types else ("word", "not-a-number", "any"),
                ("nan", math.nan, "error"), ("inf", math.inf, "error"), ("huge", 10 ** 30, "error")]
    if int in types and float not in types:
        out.append(("fraction", 1.5, "error"))
    if types & {int, float} and str not in types:
        out.append(("negative", -5, "error"))
    if str in types or "literal" in types:
        out += [("control", CONTROL, "control" if str in types else "error"), ("huge-str", "x" * 20000, "any")]
    if "literal" in types and str not in types:
        out.append(("empty", "", "error"))
    if bool in types:
        out.append(("bool-word", "maybe", "error"))
    if list in types:
        out += [("scalar", "just-a-string", "error"), ("nested", [["a"], {"b": 1}], "error")]
    if dict in types:
        out += [("scalar", "just-a-string", "error"), ("list", ["a", "b"], "error"),
                ("nested", {"K": [1, {"x": None}]}, "error")]
    return out


# Out-of-range numbers the schema accepts today (the schema area decides their ranges), by field and value label;
# -e JSON nan/inf reach the serial number as floats, a YAML file's do not always.
EKV_LABELS = {"word", "nan", "fraction", "bool-word"}  # -e KEY=VALUE: its own YAML typing of the value
GV_LABELS = {"list", "dict", "control", "nan", "negative", "empty", "bool-word", "scalar"}  # the rest: -e JSON


def variable_cases() -> list[Case]:
    from specdeploy.hostvars.schema import HostVars
    cases: list[Case] = []
    for name, f in HostVars.model_fields.items():
        for label, value, expect in bad_values(f.annotation):
            if expect == "control":
                expect = "error"
            gv_setup = (lambda n, v: (lambda ctx: set_var(ctx, n, v)))(name, value)
            if label in GV_LABELS:
                cases.append(Case(f"gv-{name}-{label}", ["plan", "--json", "-i", "{inv}"], (name,), expect,
                                  setup=gv_setup))
            cases.append(Case(f"ejson-{name}-{label}", ["plan", "--json", "-i", "{inv}", "-e",
                                                        json.dumps({name: value})], (name,), expect))
            if label in EKV_LABELS and isinstance(value, (int, float, str)):
                cases.append(Case(f"ekv-{name}-{label}", ["plan", "--json", "-i", "{inv}", "-e", f"{name}={value}"],
                                  (name,), "any" if label == "word" else expect))
            if label in ("list", "control"):
                cases.append(Case(f"preflight-{name}-{label}", ["preflight", "-i", "{inv}"], (name,), expect,
                                  setup=gv_setup))
                cases.append(Case(f"argv-{name}-{label}", ["engine", "argv", "-i", "{inv}", "--host", "gpu-a"],
                                  (name,), expect, setup=gv_setup))
    return cases


# --- file inputs --------------------------------------------------------------------------------------------

JSON_KINDS = tuple(k for k in FILE_KINDS if k != "huge_line")
TEXT_OK = {"empty", "nonutf8", "binary", "json_list", "json_empty", "json_string", "json_wrong_types", "json_nan",
           "json_inf", "json_negative", "huge_line"}  # kinds a text reader (logs, saved tool output) may accept
UNREADABLE = {"missing", "directory", "fifo", "dangling"}
OUT_KINDS = UNREADABLE | {"binary", "json_list", "empty"}  # for paths a command writes


def _tune_results(median=5.0, **extra) -> dict:
    cand = {"name": "default", "env": {}, "status": "ok", "graph": {"1": {"median_us": median}},
            "eager": {"1": {"median_us": median}}}
    return {"format": 2, "gpus": 2, "hidden": 7168, "tokens": [1], "modes": ["graph"], "base_env": {},
            "rounds": [{"round": 1, "candidates": [cand]}], **extra}


def _write_json(rel: str, data, raw: str | None = None):
    def setup(ctx):
        p = Path(ctx["root"]) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(raw if raw is not None else json.dumps(data))
    return setup


# structured garbage: well-formed JSON of the wrong shape, by file it is fed as
TUNE_GARBAGE = {
    "rounds-str": {"rounds": "x"},
    "rounds-of-str": {"rounds": ["x"]},
    "candidates-str": {"rounds": [{"candidates": "x"}]},
    "candidate-int": {"rounds": [{"candidates": [5]}]},
    "name-list": {"rounds": [{"candidates": [{"name": [1], "status": "ok"}]}]},
    "graph-list": _tune_results() | {"rounds": [{"candidates": [{"name": "default", "status": "ok",
                                                                  "graph": [1, 2]}]}]},
    "median-str": _tune_results(median="fast"),
    "median-neg": _tune_results(median=-3.0),
    "median-zero": _tune_results(median=0),
    "size-word": _tune_results() | {"rounds": [{"candidates": [{"name": "default", "status": "ok",
                                                                 "graph": {"one": {"median_us": 1.0}}}]}]},
    "gpus-str": _tune_results(gpus="two"),
    "v1-candidates-dict": {"candidates": {"a": 1}},
}
TUNE_RAW = {"median-nan": json.dumps(_tune_results()).replace("5.0", "NaN"),
            "median-inf": json.dumps(_tune_results()).replace("5.0", "Infinity")}
BASELINE_GARBAGE = {
    "lbc-list": {"levels_by_concurrency": [1], "levels": []},
    "lbc-values-str": {"levels_by_concurrency": {"1": "x"}, "levels": []},
    "tps-str": {"levels_by_concurrency": {"1": {"output_tps": "fast"}}, "levels": []},
    "tps-neg": {"levels_by_concurrency": {"1": {"output_tps": -10}}, "levels": []},
    "levels-of-str": {"levels_by_concurrency": {"1": {"output_tps": 10}}, "levels": ["x"]},
    "errors-str": {"levels_by_concurrency": {"1": {"output_tps": 10}}, "levels": [{"errors": "many",
                                                                                    "requests": 3}]},
    "key-word": {"levels_by_concurrency": {"one": {"output_tps": 10}}, "levels": []},
}
BASELINE_RAW = {"tps-nan": '{"levels_by_concurrency": {"1": {"output_tps": NaN}}, "levels": []}',
                "tps-inf": '{"levels_by_concurrency": {"1": {"output_tps": Infinity}}, "levels": []}'}


def file_cases() -> list[Case]:
    c: list[Case] = []
    T, D = "{models}/target", "{models}/drafter"
    for kind in FILE_KINDS:
        # a bad file or path where a directory or file is expected
        c.append(Case(f"drafter-check-dir-{kind}", ["drafter", "check", "{bad}", "--target", T, "--engine", "vllm"],
                      ("{bad}", "drafter"), kind=kind))
        c.append(Case(f"drafter-check-target-{kind}", ["drafter", "check", D, "--target", "{bad}", "--engine",
                                                       "sglang"], ("{bad}", "target"), kind=kind))
        c.append(Case(f"drafter-convert-dir-{kind}", ["drafter", "convert", "{bad}", "--target", T, "--engine",
                                                      "vllm", "--out", "{out}/d"], ("{bad}", "drafter"), kind=kind))
        c.append(Case(f"patch-root-{kind}", ["patch", "status", "--engine", "vllm", "--root", "{bad}"],
                      ("{bad}", "--root"), kind=kind))
        c.append(Case(f"choose-{kind}", ["nccl", "choose", "{bad}"], ("{bad}",), kind=kind))
        if kind in OUT_KINDS:  # output paths of nccl choose
            refused = {"directory", "dangling", "fifo"}
            good = _write_json("r.json", _tune_results())
            c.append(Case(f"choose-tuner-csv-{kind}", ["nccl", "choose", "{root}/r.json", "--tuner-csv", "{bad}"],
                          ("--tuner-csv", "{bad}"), kind=kind, writes="{bad}", setup=good,
                          expect="error" if kind in refused else "any"))
            c.append(Case(f"choose-host-vars-{kind}", ["nccl", "choose", "{root}/r.json", "--write-host-vars",
                                                       "{bad}"], ("--write-host-vars", "{bad}"), kind=kind,
                          writes="{bad}", setup=good,
                          expect="error" if kind in refused - {"dangling"} | {"binary", "json_list"} else "any"))
            c.append(Case(f"choose-chart-{kind}", ["nccl", "choose", "{root}/r.json", "--chart", "{bad}"],
                          ("--chart", "{bad}"), kind=kind, writes="{bad}", bad_suffix=".png", setup=good,
                          expect="error" if kind in refused else "any", timeout=20))
        for opt in ("--matrix", "--lspci", "--cmdline"):
            argv = ["nccl", "topo", "--matrix", "{root}/topo.txt", "--lspci", "{root}/lspci.txt",
                    "--cmdline", "{root}/cmdline.txt"]
            argv[argv.index(opt) + 1] = "{bad}"
            if opt != "--matrix" and kind not in UNREADABLE | {"binary"}:
                continue
            c.append(Case(f"topo{opt}-{kind}", argv, (opt, "{bad}"), kind=kind, setup=_topo_files,
                          expect="error" if kind in UNREADABLE | {"nonutf8", "binary"} or opt == "--matrix"
                          else "any"))
        c.append(Case(f"tune-candidates-{kind}", ["nccl", "tune", "--candidates", "{bad}", "--out", "{out}/t.json"],
                      ("--candidates", "{bad}"), kind=kind))
        c.append(Case(f"tune-model-{kind}", ["nccl", "tune", "--model", "{bad}", "--out", "{out}/t.json"],
                      ("--model", "{bad}"), kind=kind))
        c.append(Case(f"tune-out-{kind}", ["nccl", "tune", "--gpus", "1", "--only", "default", "--no-aa", "--modes",
                                           "eager", "--iters", "1", "--timeout", "20", "--out", "{bad}"],
                      ("--out", "{bad}"), kind=kind, writes="{bad}", timeout=30,
                      expect="any" if kind in ("missing",) else "error"))
        c.append(Case(f"gate-baseline-{kind}", ["gate", "--url", "{closed}", "--baseline", "{bad}", "--out",
                                                "{out}/g"], ("--baseline", "{bad}"), kind=kind))
        c.append(Case(f"gate-prompts-{kind}", ["gate", "--url", "{closed}", "--prompts", "{bad}", "--out", "{out}/g"],
                      ("--prompts", "{bad}"), kind=kind))
        c.append(Case(f"gate-key-{kind}", ["gate", "--url", "{closed}", "--api-key-file", "{bad}", "--out",
                                           "{out}/g"], ("--api-key-file", "{bad}", "--url"), kind=kind,
                      expect="error"))
        c.append(Case(f"report-nccl-{kind}", ["report", "--prometheus", "{closed}", "--nccl", "{bad}", "--out",
                                              "{out}/r.png"], ("--nccl", "{bad}"), kind=kind))
        c.append(Case(f"triage-log-{kind}", ["triage", "{bad}"], ("{bad}", "LOGFILE"), kind=kind,
                      expect="any" if kind in TEXT_OK else "error"))
        c.append(Case(f"triage-kernel-{kind}", ["triage", "{root}/engine.log", "--kernel-log", "{bad}"],
                      ("--kernel-log", "{bad}"), kind=kind, setup=_engine_log,
                      expect="any" if kind in TEXT_OK else "error"))
        c.append(Case(f"extra-vars-file-{kind}", ["plan", "--json", "-i", "{inv}", "-e", "@{bad}"],
                      ("-e", "{bad}"), kind=kind,
                      expect="any" if kind in ("empty", "json_empty", "json_wrong_types", "json_nan", "json_inf",
                                               "json_negative") else "error"))  # any -e variables are allowed
        c.append(Case(f"plan-out-{kind}", ["plan", "-i", "{inv}", "--out", "{bad}"], ("--out", "{bad}"), kind=kind,
                      writes="{bad}",
                      expect="any" if kind in ("missing", "directory") else "error"))
        c.append(Case(f"inventory-{kind}", ["plan", "--json", "-i", "{bad}"], ("-i", "{bad}"), kind=kind))
        if kind not in ("missing", "directory"):  # those are good outputs: the build would run
            c.append(Case(f"wheelhouse-out-{kind}", ["wheelhouse", "--out", "{bad}", "--target", "3.11:x86_64:2.36"],
                          ("--out", "{bad}"), kind=kind, writes="{bad}", no_pip=True,
                          expect="error"))
        for which in ("target", "drafter"):
            if kind in JSON_KINDS and kind != "missing":
                setup = bad_model_config(which, kind)
                names = ("config.json", "architectures")  # a drafter config without one is of no known format
                c.append(Case(f"cfg-{which}-{kind}-check", ["drafter", "check", D, "--target", T, "--engine", "vllm"],
                              names, setup=setup))
                c.append(Case(f"cfg-{which}-{kind}-convert", ["drafter", "convert", D, "--target", T, "--engine",
                                                              "sglang", "--out", "{out}/d"], names, setup=setup))
                c.append(Case(f"cfg-{which}-{kind}-preflight", ["preflight", "-i", "{inv}"], ("config.json",),
                              setup=setup))
    for name, data in TUNE_GARBAGE.items():
        c.append(Case(f"choose-shape-{name}", ["nccl", "choose", "{root}/r.json"], ("{root}/r.json",),
                      setup=_write_json("r.json", data)))
        c.append(Case(f"report-shape-{name}", ["report", "--prometheus", "{closed}", "--nccl", "{root}/r.json",
                                               "--out", "{out}/r.png"], ("--nccl",), setup=_write_json("r.json", data)))
    for name, raw in TUNE_RAW.items():
        c.append(Case(f"choose-shape-{name}", ["nccl", "choose", "{root}/r.json"], ("{root}/r.json",),
                      setup=_write_json("r.json", None, raw)))
        c.append(Case(f"report-shape-{name}", ["report", "--prometheus", "{closed}", "--nccl", "{root}/r.json",
                                               "--out", "{out}/r.png"], ("--nccl",),
                      setup=_write_json("r.json", None, raw)))
    for name, data in BASELINE_GARBAGE.items():
        c.append(Case(f"baseline-shape-{name}", ["gate", "--url", "{closed}", "--baseline", "{root}/b.json",
                                                 "--out", "{out}/g"], ("--baseline",),
                      setup=_write_json("b.json", data)))
    for name, raw in BASELINE_RAW.items():
        c.append(Case(f"baseline-shape-{name}", ["gate", "--url", "{closed}", "--baseline", "{root}/b.json",
                                                 "--out", "{out}/g"], ("--baseline",),
                      setup=_write_json("b.json", None, raw)))
    # model configs with the right shape but values of the wrong type
    for key, val in (("hidden_size", "big"), ("num_hidden_layers", [61]), ("num_attention_heads", 0),
                     ("vocab_size", None), ("text_config", "no"), ("eos_token_id", ["x"]),
                     ("quantization_config", [1]), ("architectures", 7), ("num_attention_heads", -64)):
        def setup(ctx, key=key, val=val):
            p = Path(ctx["models"]) / "target" / "config.json"
            cfg = json.loads(p.read_text())
            (cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) and key != "text_config"
             else cfg)[key] = val
            p.write_text(json.dumps(cfg))
        label = f"{key}-{type(val).__name__}-{val if isinstance(val, int) else ''}"
        c.append(Case(f"target-field-{label}-preflight", ["preflight", "-i", "{inv}"], (key, "config.json"),
                      setup=setup))
        c.append(Case(f"target-field-{label}-check", ["drafter", "check", D, "--target", T, "--engine", "vllm"],
                      (key, "config.json"), setup=setup))
    return c


def _topo_files(ctx):
    root = Path(ctx["root"])
    (root / "topo.txt").write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-15\nGPU1\tPHB\t X \t0-15\n")
    (root / "lspci.txt").write_text("")
    (root / "cmdline.txt").write_text("BOOT_IMAGE=/vmlinuz ro quiet\n")


def _engine_log(ctx):
    (Path(ctx["root"]) / "engine.log").write_text("INFO starting\nRuntimeError: boom\n")


# --- scalar arguments ---------------------------------------------------------------------------------------

WEIRD = {"empty": "", "control": "v\x00\x1b[2J\x07", "huge": "9" * 5000, "space": "   ", "dash": "-x",
         "unicode": "\u202e\u0000\ufeffé"}
NUMS = {"nan": "nan", "inf": "inf", "-inf": "-inf", "neg": "-1", "zero": "0", "huge": "1e308"}


def argument_cases() -> list[Case]:
    c: list[Case] = []
    R = "{root}/r.json"
    tune = ["nccl", "tune", "--only", "default", "--no-aa", "--out", "{out}/t.json"]
    for label, v in WEIRD.items():
        c += [
            Case(f"image-engine-{label}", ["engine", "image", "--engine", v, "--engine-version", "0.16.0"],
                 ("--engine", "--engine-version")),
            Case(f"image-version-{label}", ["engine", "image", "--engine", "vllm", "--engine-version", v],
                 ("--engine-version",)),
            Case(f"image-patches-{label}", ["engine", "image", "--engine", "vllm", "--engine-version", "0.16.0",
                                            "--patches", v], ("--patches",)),
            Case(f"image-field-{label}", ["engine", "image", "--engine", "sglang", "--engine-version", "0.5.9",
                                          "--field", v], ("--field",)),
            Case(f"argv-host-{label}", ["engine", "argv", "-i", "{inv}", "--host", v], ("--host", "--limit")),
            Case(f"plan-limit-{label}", ["plan", "--json", "-i", "{inv}", "--limit", v], ("--limit",),
                 expect="any" if label == "space" else "error"),
            Case(f"check-engine-{label}", ["drafter", "check", "{models}/drafter", "--target", "{models}/target",
                                           "--engine", v], ("--engine",)),
            Case(f"check-version-{label}", ["drafter", "check", "{models}/drafter", "--target", "{models}/target",
                                            "--engine", "vllm", "--engine-version", v], ("--engine-version",)),
            Case(f"patch-engine-{label}", ["patch", "status", "--engine", v, "--root", "{root}"], ("--engine",)),
            Case(f"schema-defaults-{label}", ["schema", "defaults", v], ("role", "ROLE", v[:20] or "role")),
            Case(f"schema-argspec-{label}", ["schema", "argspec", v], ("role", "ROLE", v[:20] or "role")),
            Case(f"wheelhouse-target-{label}", ["wheelhouse", "--out", "{out}/w", "--target", v], ("--target",),
                 no_pip=True, expect="any" if label in ("empty", "space") else "error"),
            Case(f"extra-vars-{label}", ["plan", "--json", "-i", "{inv}", "-e", v], ("-e",),
                 expect="any" if label in ("empty", "space") else "error"),
            Case(f"choose-mode-{label}", ["nccl", "choose", R, "--mode", v], ("--mode",),
                 setup=_write_json("r.json", _tune_results())),
            Case(f"choose-mix-{label}", ["nccl", "choose", R, "--batch-mix", v], ("--batch-mix",),
                 setup=_write_json("r.json", _tune_results()), expect="any" if label in ("empty",) else "error"),
            Case(f"tune-modes-{label}", tune + ["--modes", v], ("--modes",)),
            Case(f"tune-base-env-{label}", tune + ["--base-env", v], ("--base-env",)),
            Case(f"gate-concurrency-{label}", ["gate", "--url", "{closed}", "--concurrency", v, "--out", "{out}/g"],
                 ("--concurrency",)),
            Case(f"gate-url-{label}", ["gate", "--url", v, "--out", "{out}/g"], ("--url",)),
            Case(f"report-range-{label}", ["report", "--prometheus", "{closed}", "--range", v, "--out",
                                           "{out}/r.png"], ("--range",)),
        ]
    for label, v in NUMS.items():
        bad_al = label != "huge"
        c += [
            Case(f"breakeven-al-{label}", ["breakeven", "--acceptance-length", v, "--step-ratio", "1.2"],
                 ("--acceptance-length",), expect="error" if bad_al else "any"),
            Case(f"breakeven-ratio-{label}", ["breakeven", "--acceptance-length", "2.5", "--step-ratio", v],
                 ("--step-ratio",), expect="error" if label != "huge" else "any"),
            Case(f"breakeven-margin-{label}", ["breakeven", "--acceptance-length", "2.5", "--step-ratio", "1.2",
                                               "--margin", v], ("--margin",),
                 expect="any" if label == "zero" else "error"),
            Case(f"choose-tolerance-{label}", ["nccl", "choose", R, "--prefill-tolerance", v],
                 ("--prefill-tolerance",), setup=_write_json("r.json", _tune_results()),
                 expect="any" if label in ("zero", "huge") else "error"),
            Case(f"choose-min-gain-{label}", ["nccl", "choose", R, "--min-gain", v], ("--min-gain",),
                 setup=_write_json("r.json", _tune_results()), expect="any" if label in ("zero", "huge") else "error"),
            Case(f"choose-min-rounds-{label}", ["nccl", "choose", R, "--min-rounds", v], ("--min-rounds",),
                 setup=_write_json("r.json", _tune_results())),
            Case(f"tune-gpus-{label}", tune + ["--gpus", v], ("--gpus",)),
            Case(f"tune-hidden-{label}", tune + ["--hidden", v], ("--hidden",)),
            Case(f"tune-iters-{label}", tune + ["--iters", v], ("--iters",)),
            *([] if label == "huge" else [Case(f"tune-timeout-{label}", tune + ["--timeout", v], ("--timeout",))]),
            Case(f"tune-rounds-{label}", tune + ["--rounds", v], ("--rounds",)),
            Case(f"gate-requests-{label}", ["gate", "--url", "{closed}", "--requests", v, "--out", "{out}/g"],
                 ("--requests",)),
            Case(f"gate-max-tokens-{label}", ["gate", "--url", "{closed}", "--max-tokens", v, "--out", "{out}/g"],
                 ("--max-tokens",)),
            Case(f"gate-k-{label}", ["gate", "--url", "{closed}", "--k", v, "--out", "{out}/g"], ("--k",)),
            Case(f"gate-margin-{label}", ["gate", "--url", "{closed}", "--margin", v, "--out", "{out}/g"],
                 ("--margin",), expect="any" if label == "zero" else "error"),
            Case(f"report-layers-{label}", ["report", "--prometheus", "{closed}", "--layers", v, "--out",
                                            "{out}/r.png"], ("--layers",)),
            Case(f"report-k-{label}", ["report", "--prometheus", "{closed}", "--k", v, "--out", "{out}/r.png"],
                 ("--k",), expect="any" if label == "zero" else "error"),
        ]
    # an out path that is not a directory, or the command's own input
    for name, out in (("file", "{root}/secrets/example-api-key"), ("drafter", "{models}/drafter"),
                      ("target", "{models}/target"), ("root", "{root}")):
        c.append(Case(f"convert-out-{name}", ["drafter", "convert", "{models}/drafter", "--target", "{models}/target",
                                              "--engine", "vllm", "--out", out], ("--out",)))
    c.append(Case("gate-out-file", ["gate", "--url", "{closed}", "--out", "{root}/secrets/example-api-key"],
                  ("--out", "--url")))
    c.append(Case("report-out-dir", ["report", "--prometheus", "{closed}", "--out", "{root}/models"],
                  ("--out", "--prometheus")))
    # the canary: impossible options, an unknown host, and hosts whose exporters do not answer (nothing deployed)
    canary = ["canary", "-i", "{inv}", "--out", "{out}/c"]
    for label, extra, names in (("host-unknown", ["--host", "gpu-z"], ("--host",)),
                                ("control-self", ["--host", "gpu-a", "--control", "gpu-a"], ("--control",)),
                                ("rounds-1", ["--host", "gpu-a", "--rounds", "1"], ("--rounds",)),
                                ("concurrency-0", ["--host", "gpu-a", "--concurrency", "0"], ("--concurrency",)),
                                ("tolerance-2", ["--host", "gpu-a", "--tolerance", "2"], ("--tolerance",)),
                                ("tolerance-nan", ["--host", "gpu-a", "--tolerance", "nan"], ("--tolerance",)),
                                ("no-exporter", ["--host", "gpu-a"], ("serving release",))):
        c.append(Case(f"canary-{label}", canary + extra, names))
    # k per load band: impossible schedules, and a release that takes one k for every load
    spec = {"specdeploy_spec_enabled": True, "specdeploy_spec_num_tokens": 3, "specdeploy_engine_version": "0.32.0"}
    for label, bands, extra, names in (
            ("k-by-batch-from-2", [{"from_batch": 2, "k": 3}], {}, ("specdeploy_spec_k_by_batch[0].from_batch",)),
            ("k-by-batch-k-above", [{"from_batch": 1, "k": 4}], {}, ("specdeploy_spec_k_by_batch[0].k",)),
            ("k-by-batch-descending", [{"from_batch": 1, "k": 3}, {"from_batch": 9, "k": 1},
                                       {"from_batch": 4, "k": 2}], {}, ("specdeploy_spec_k_by_batch",)),
            ("k-by-batch-all-zero", [{"from_batch": 1, "k": 0}], {}, ("specdeploy_spec_k_by_batch",)),
            ("k-by-batch-extra-key", [{"from_batch": 1, "k": 3}],
             {"specdeploy_spec_config_extra": {"num_speculative_tokens_per_batch_size": [[1, 9, 3]]}},
             ("num_speculative_tokens_per_batch_size",)),
            ("k-by-batch-old-vllm", [{"from_batch": 1, "k": 3}, {"from_batch": 8, "k": 1}],
             {"specdeploy_engine_version": "0.18.0"}, ("specdeploy_spec_k_by_batch",)),
            ("k-by-batch-sglang", [{"from_batch": 1, "k": 3}, {"from_batch": 8, "k": 1}],
             {"specdeploy_engine": "sglang", "specdeploy_engine_version": "0.5.9"}, ("specdeploy_spec_k_by_batch",)),
            ("k-by-batch-unknown-key", [{"from_batch": 1, "k": 3, "until": 8}], {}, ("until",))):
        e = json.dumps({**spec, "specdeploy_spec_k_by_batch": bands, **extra})
        c.append(Case(f"plan-{label}", ["plan", "--json", "-i", "{inv}", "-e", e], names))
    # serving layouts the inventory cannot carry (the example's hosts are PCIe hosts without RDMA)
    g = {"specdeploy_group": "kimi"}
    for label, e, names in (
            ("tp-without-rdma", {"specdeploy_topology": "tp", **g}, ("specdeploy_topology", "RDMA")),
            ("tp-without-group", {"specdeploy_topology": "tp"}, ("specdeploy_group",)),
            ("dp-ep-tp-3", {"specdeploy_topology": "dp_ep", "specdeploy_tensor_parallel_size": 3, **g},
             ("specdeploy_tensor_parallel_size",)),
            ("tp-tp-4", {"specdeploy_topology": "tp", "specdeploy_tensor_parallel_size": 4, "specdeploy_rdma": True,
                         **g}, ("specdeploy_tensor_parallel_size",)),
            ("pd-without-role", {"specdeploy_topology": "pd", "specdeploy_rdma": True, **g}, ("specdeploy_pd_role",)),
            ("pd-on-vllm", {"specdeploy_topology": "pd", "specdeploy_pd_role": "prefill", "specdeploy_rdma": True,
                            "specdeploy_router": "sglang-router", **g}, ("specdeploy_topology",)),
            ("pd-only-prefill", {"specdeploy_topology": "pd", "specdeploy_pd_role": "prefill", "specdeploy_rdma": True,
                                 "specdeploy_router": "sglang-router", "specdeploy_engine": "sglang",
                                 "specdeploy_engine_version": "0.5.23", **g}, ("decode",)),
            ("single-shared-group", g, ("specdeploy_group",)),
            ("role-without-pd", {"specdeploy_pd_role": "decode"}, ("specdeploy_pd_role",)),
            ("dist-port-is-engine-port", {"specdeploy_topology": "dp_ep", "specdeploy_dist_port": 8000, **g},
             ("specdeploy_dist_port",)),
            ("dist-address", {"specdeploy_dist_address": "10.0.0.1 --evil", "specdeploy_topology": "dp_ep", **g},
             ("specdeploy_dist_address",)),
            ("extra-nnodes", {"specdeploy_engine_extra_args": ["--nnodes", "2"]}, ("specdeploy_engine_extra_args",)),
            ("interface-slash", {"specdeploy_dist_interface": "../eth0"}, ("specdeploy_dist_interface",))):
        c.append(Case(f"plan-layout-{label}", ["plan", "--json", "-i", "{inv}", "-e", json.dumps(e)], names))
    for label, w in (("short", "1"), ("negative", "1,-1"), ("zero", "0,0"), ("nan", "nan,1"), ("word", "a,b"),
                     ("empty-item", "1,")):
        c.append(Case(f"gate-weights-{label}", ["gate", "--url", "{closed}", "--concurrency", "1,8", "--weights", w,
                                                "--out", "{out}/g"], ("--weights",)))
    for label, extra, names in (("missing", ["--target", "{out}/nothing-here"], ("--target", "nothing-here")),
                                ("bad-config", ["--target", "{bad}"], ("--target", "config")),
                                ("hardware", ["--target", "{models}/target", "--hardware", "tpu9"], ("--hardware",))):
        c.append(Case(f"gate-target-{label}", ["gate", "--url", "{closed}", "--out", "{out}/g", *extra], names,
                      kind="json_list" if label == "bad-config" else None))
    c.append(Case("tune-all-crash", ["nccl", "tune", "--gpus", "1", "--only", "default", "--no-aa", "--modes",
                                     "eager", "--iters", "1", "--timeout", "30", "--out", "{out}/t.json"],
                  ("runs ok", "crash", "--out", "nccl tune"), timeout=60))
    return c


def all_cases() -> list[Case]:
    return variable_cases() + file_cases() + argument_cases()
