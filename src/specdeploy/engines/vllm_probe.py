"""The vLLM probe: runs inside the engine's own Python (the image or venv the deploy starts), so it imports only
the standard library, torch and vLLM. No GPU and no target weights are needed.

It reads a job on stdin, ``{"cases": [{"id", "target", "drafter", "method", "num_speculative_tokens",
"trust_remote_code", "dtype"}, ...]}``, and for each case runs the engine's own code:

1. ``ModelConfig`` of the target and ``SpeculativeConfig`` of the drafter (the engine's validation: the EAGLE-3
   target list, the method, the drafter's architecture in the registry, its config keys);
2. the target's model class from the engine's registry and its EAGLE-3 interface (``supports_eagle3``), with
   the aux layers the model runner will capture (the drafter config's ids, else the class's default);
3. the drafter model, built with the engine's ``initialize_model`` on the meta device, and the engine's own
   weight loading over fake tensors made from the checkpoint's safetensors headers (names, shapes, dtypes):
   the whole load through the engine's ``DefaultModelLoader`` (its verdict), then tensor by tensor for the
   names it rejects, and the parameters no tensor reached.

It prints one line ``SPECDEPLOY-PROBE <json>`` on stdout; the engine's own logging goes to stderr.
"""
from __future__ import annotations

import functools
import json
import os
import re
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

MARK = "SPECDEPLOY-PROBE "
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
          "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
          "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
MAX_MSG = 600


def _short(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    return msg if len(msg) <= MAX_MSG else msg[:MAX_MSG] + " ..."


def headers(directory: str) -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of every tensor in the directory's *.safetensors, in file order."""
    out = []
    for f in sorted(Path(directory).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            head = json.loads(fh.read(n))
        for name, meta in head.items():
            if name != "__metadata__":
                out.append((name, meta["dtype"], list(meta["shape"])))
    return out


class Engine:
    """What the cases share: vLLM imported once, a one-process distributed group on gloo."""

    def __init__(self):
        import torch
        import vllm
        from vllm import config as C
        self.torch, self.vllm, self.C = torch, vllm, C
        self.version = vllm.__version__
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        fd, path = tempfile.mkstemp(prefix="specdeploy-probe-")
        os.close(fd)
        os.unlink(path)
        with C.set_current_vllm_config(C.VllmConfig()):
            init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{path}",
                                         local_rank=0, backend="gloo")
            initialize_model_parallel(1, 1)

    # --- configs --------------------------------------------------------------------------------------------
    def model_config(self, case: dict):
        kw = {"model": case["target"], "tokenizer": case["target"], "skip_tokenizer_init": True,
              "trust_remote_code": bool(case.get("trust_remote_code")), "dtype": case.get("dtype", "auto"),
              "enforce_eager": True, "seed": 0}
        if case.get("max_model_len"):
            kw["max_model_len"] = case["max_model_len"]
        return self.C.ModelConfig(**kw)

    def spec_config(self, mc, case: dict):
        return self.C.SpeculativeConfig(method=case.get("method", "eagle3"), model=case["drafter"],
                                        num_speculative_tokens=int(case.get("num_speculative_tokens", 3)),
                                        target_model_config=mc, target_parallel_config=self.C.ParallelConfig())

    # --- the target -----------------------------------------------------------------------------------------
    def target_class(self, mc):
        from vllm.model_executor.models.interfaces import supports_eagle3
        cls, arch = mc.registry.resolve_model_cls(mc.architectures, model_config=mc)
        return cls, arch, bool(supports_eagle3(cls))

    def default_aux(self, cls, mc):
        """The class's own default aux layers, asked of a stand-in with the target's layer count."""
        n = mc.hf_text_config.num_hidden_layers
        inner = SimpleNamespace(layers=[None] * n, config=mc.hf_text_config, start_layer=0, end_layer=n)
        stub = SimpleNamespace(model=inner, config=mc.hf_config, language_model=SimpleNamespace(model=inner))
        for name in ("get_eagle3_default_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"):
            fn = getattr(cls, name, None)
            if fn is not None:
                return list(fn(stub))
        return None

    def configured_aux(self, sc):
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        ids = GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=sc))
        return list(ids) if ids else None

    def uses_aux(self, sc) -> bool:
        try:
            from vllm.v1.spec_decode.llm_base_proposer import LLMBaseProposer as P
        except ImportError:
            from vllm.v1.spec_decode.eagle import EagleProposer as P
        return bool(P._get_eagle3_use_aux_hidden_state_from_config(
            SimpleNamespace(method=sc.method, draft_model_config=sc.draft_model_config)))

    # --- the drafter ----------------------------------------------------------------------------------------
    def build_drafter(self, mc, sc):
        torch, C = self.torch, self.C
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype
        vc = C.VllmConfig(model_config=mc, speculative_config=sc, parallel_config=sc.target_parallel_config,
                          device_config=C.DeviceConfig("cpu"), load_config=C.LoadConfig(load_format="dummy"))
        dmc = sc.draft_model_config
        with C.set_current_vllm_config(vc), set_default_torch_dtype(dmc.dtype), torch.device("meta"):
            model = initialize_model(vllm_config=vc, model_config=dmc)
        return vc, dmc, model

    def fake(self, spec):
        name, dtype, shape = spec
        dt = getattr(self.torch, DTYPES.get(dtype, "float32"))
        return name, self.torch.empty(shape, dtype=dt, device="meta")

    def load(self, vc, dmc, model, specs):
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader
        got: dict[str, list] = {}  # parameter -> [(checkpoint tensor, shard id, shape)]
        by_id: dict[int, str] = {}
        params = dict(model.named_parameters())
        for pname, p in params.items():
            orig = getattr(p, "weight_loader", default_weight_loader)

            def rec(*a, _orig=orig, _p=pname, **kw):
                if len(a) > 1:
                    shard = a[2] if len(a) > 2 else kw.get("loaded_shard_id", kw.get("shard_id"))
                    got.setdefault(_p, []).append((by_id.get(id(a[1]), "?"), shard, list(a[1].shape)))
                return _orig(*a, **kw)
            p.weight_loader = functools.wraps(orig)(rec)
        tensors = [self.fake(s) for s in specs]
        for n, t in tensors:
            by_id[id(t)] = n
        shapes = {n: list(t.shape) for n, t in tensors}
        loader = DefaultModelLoader(vc.load_config)
        loader.get_all_weights = lambda *_a, **_k: iter(list(tensors))
        loader.counter_before_loading_weights = time.perf_counter()
        whole = None
        rejected = []
        with self.C.set_current_vllm_config(vc):
            try:
                loader.load_weights(model, dmc)
            except Exception as exc:  # the engine's verdict on the whole checkpoint
                whole = _short(exc)
            if whole is not None:
                for n, t in tensors:  # which tensors it rejects, one at a time
                    try:
                        model.load_weights([(n, t)])
                    except Exception as exc:
                        rejected.append({"name": n, "shape": shapes[n], "error": _short(exc),
                                         "kind": _kind(exc)})
        shared = []
        if getattr(model, "has_own_lm_head", True) is False:
            shared.append("lm_head")
        if getattr(model, "has_own_embed_tokens", True) is False:
            shared.append("embed_tokens")
        missing, narrowed = [], []
        for pname, p in params.items():
            if any(pname.startswith(s) or f".{s}." in pname for s in shared):
                continue
            calls = got.get(pname)
            if not calls:
                missing.append(pname)
                continue
            module = model.get_submodule(pname.rsplit(".", 1)[0]) if "." in pname else model
            if hasattr(module, "org_vocab_size"):
                continue  # the vocabulary layers' own loader checks the rows (the parameter is padded)
            want = _shard_rows(module)
            if want:
                for k in want:
                    if not any(str(c[1]) == str(k) for c in calls):
                        missing.append(f"{pname} (shard {k})")
                for name, shard, shp in calls:
                    rows = want.get(shard if shard in want else str(shard))
                    if rows is not None and (shp[0] != rows or shp[1:] != list(p.shape)[1:]):
                        narrowed.append({"name": name, "shape": shp, "parameter": pname, "shard": str(shard),
                                         "want": [rows] + list(p.shape)[1:]})
            else:
                for name, shard, shp in calls:
                    if shp != list(p.shape) and shard is None:
                        narrowed.append({"name": name, "shape": shp, "parameter": pname, "want": list(p.shape)})
        reached = {c[0] for calls in got.values() for c in calls}
        refused = {r["name"] for r in rejected}
        dropped = [n for n, _t in tensors if n not in reached and n not in refused
                   and not (n == "t2d" or n.endswith(".t2d"))]
        return {"load_error": whole, "rejected": rejected, "missing": missing, "narrowed": narrowed,
                "dropped": dropped, "shared_from_target": shared,
                "parameters": {p: list(v.shape) for p, v in params.items()},
                "draft_vocab": getattr(dmc.hf_config, "draft_vocab_size", None),
                "draft_hidden": getattr(dmc.hf_config, "hidden_size", None)}

    # --- one case -------------------------------------------------------------------------------------------
    def run(self, case: dict) -> dict:
        t0 = time.perf_counter()
        out: dict = {"id": case.get("id"), "engine": "vllm", "version": self.version, "problems": []}

        def problem(stage, exc, **extra):
            out["problems"].append({"stage": stage, "error": _short(exc), **extra})
        try:
            mc = self.model_config(case)
        except Exception as exc:
            problem("target_config", exc)
            out["seconds"] = round(time.perf_counter() - t0, 2)
            return out
        out["target_model_type"] = mc.hf_text_config.model_type
        out["target_layers"] = mc.hf_text_config.num_hidden_layers
        out["target_vocab"] = mc.get_vocab_size()
        out["target_hidden"] = mc.get_hidden_size()
        cls = None
        try:
            cls, arch, ok = self.target_class(mc)
            out["target_class"] = arch
            out["supports_eagle3"] = ok
        except Exception as exc:
            problem("target_class", exc)
        saved = mc.hf_text_config.model_type
        try:
            return self._drafter(case, mc, cls, out, problem)
        finally:
            mc.hf_text_config.model_type = saved
            out["seconds"] = round(time.perf_counter() - t0, 2)

    def _drafter(self, case, mc, cls, out, problem) -> dict:
        sc = None
        try:
            sc = self.spec_config(mc, case)
        except Exception as exc:
            problem("speculative_config", exc)
            # past the target list, as an engine without it (the patch set) runs: the drafter is still judged (the
            # stand-in model type stays while the drafter is built: the configs are validated again there)
            if "only supported for" in str(exc):
                try:
                    mc.hf_text_config.model_type = "llama"
                    sc = self.spec_config(mc, case)
                    out["target_check_bypassed"] = True
                except Exception:
                    sc = None
        if sc is None:
            return out
        dmc = sc.draft_model_config
        out["drafter_class"] = getattr(dmc, "_architecture", None) or (dmc.architectures or [None])[0]
        try:
            out["uses_aux_hidden_states"] = self.uses_aux(sc)
            conf = self.configured_aux(sc)
            out["aux_layers_source"] = "drafter config" if conf else "target class default"
            out["aux_layers"] = conf if conf else (self.default_aux(cls, mc) if cls is not None else None)
        except Exception as exc:
            problem("aux_layers", exc)
        try:
            vc, dmc, model = self.build_drafter(mc, sc)
        except Exception as exc:
            problem("drafter_build", exc)
            return out
        try:
            out["load"] = self.load(vc, dmc, model, headers(case["drafter"]))
        except Exception as exc:
            problem("drafter_load", exc)
        return out


def _shard_rows(module) -> dict:
    """The rows each shard of a stacked parameter takes (tensor-parallel size 1); empty for other parameters."""
    if hasattr(module, "num_kv_heads") and hasattr(module, "head_size") and hasattr(module, "num_heads"):
        v = getattr(module, "v_head_size", module.head_size)
        return {"q": module.num_heads * module.head_size, "k": module.num_kv_heads * module.head_size,
                "v": module.num_kv_heads * v}
    sizes = getattr(module, "output_sizes", None)
    if isinstance(sizes, (list, tuple)) and len(sizes) > 1:
        return {i: int(x) for i, x in enumerate(sizes)}
    return {}


def _kind(exc: BaseException) -> str:
    """What the loader says about one tensor: no parameter for it, or the wrong shape."""
    s = str(exc)
    if isinstance(exc, KeyError) or "no module or parameter named" in s or "no parameter" in s.lower():
        return "unknown"
    if isinstance(exc, AssertionError) or "size" in s.lower() or "shape" in s.lower() or re.search(r"\bmismatch", s):
        return "shape"
    return "other"


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else None
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != here]  # beside vllm.py: not "vllm"
    if len(sys.argv) > 1:  # a job file (on a host: beside the script, mounted into the engine image)
        with open(sys.argv[1]) as fh:
            job = json.load(fh)
    else:
        job = json.load(sys.stdin)
    for k, v in (job.get("env") or {}).items():  # the engine's environment for the probe, where not set
        os.environ.setdefault(str(k), str(v))
    real = os.dup(1)
    os.dup2(2, 1)  # the engine's logging and prints go to stderr; stdout carries the result only
    t0 = time.perf_counter()
    result: dict = {"ok": True, "cases": []}
    try:
        eng = Engine()
        result["version"] = eng.version
        result["import_seconds"] = round(time.perf_counter() - t0, 2)
        for case in job.get("cases", []):
            try:
                result["cases"].append(eng.run(case))
            except Exception as exc:
                result["cases"].append({"id": case.get("id"), "problems": [
                    {"stage": "probe", "error": _short(exc), "trace": traceback.format_exc()[-1500:]}]})
    except Exception as exc:
        result = {"ok": False, "error": _short(exc), "trace": traceback.format_exc()[-1500:], "cases": []}
    result["seconds"] = round(time.perf_counter() - t0, 2)
    sys.stdout.flush()
    os.write(real, (MARK + json.dumps(result) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
