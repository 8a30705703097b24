"""The ranks of a two-host serving group read by the real vLLM: for 0.16.0 and 0.32.0 (their CPU builds,
``testing.realengine``), layouts ``tp`` and ``dp_ep``, the leader and the follower of a group of two 8-GPU hosts,
the FULL command line ``specdeploy plan`` renders for that host is handed to the release's own ``vllm serve``
machinery in the venv's Python (never imported here):

- the parser ``vllm serve`` builds (``ServeSubcommand.subparser_init``: ``make_arg_parser`` on a
  ``FlexibleArgumentParser`` subparser) parses ``argv[2:]``, and the subcommand's own ``validate`` runs;
- the subcommand's ``cmd`` runs with its three exits (``run_headless``, ``run_multi_api_server``, the single API
  server) replaced by a recorder, so the entry point vLLM itself picks for the rank, and the API-server count it
  defaults to, are the engine's own decisions;
- the recorder then builds the engine config as that entry point does (``AsyncEngineArgs.from_cli_args`` then
  ``create_engine_config(..., headless=...)``): this works on CPU (the platform is vLLM's CPU platform; no device is
  touched, no weight read), so the resulting ``ParallelConfig`` (world sizes, data-parallel rank, node rank within
  the data-parallel replica) is asserted too.

The model is a directory holding only a DeepSeek-V3-shaped MoE config.json with 16 attention heads (TP 16 divides
them), written to tmp_path: ``create_engine_config`` reads the config, never the weights.

Bad ranks, refused by the real engine where it refuses them: a follower line whose --node-rank equals --nnodes,
and a dp_ep follower whose --data-parallel-start-rank equals --data-parallel-size. The parser takes both (they are
plain ints); the engine refuses them while building its config, in each release's own words.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from specdeploy.engines import get_adapter
from specdeploy.plan import plan
from specdeploy.testing import realengine
from specdeploy.values.topology import Rank

pytestmark = pytest.mark.realengine

VERSIONS = ("0.16.0", "0.32.0")
LAYOUTS = ("tp", "dp_ep")
HOSTS = {"h1": "10.0.0.1", "h2": "10.0.0.2"}  # h1 leads (rank 0), h2 follows (rank 1)
GPUS = 8
PORT = 29501  # the group's rendezvous port (specdeploy's default)

# DeepSeek-V3 shaped, MoE (expert parallelism applies), 16 heads so TP 16 divides them; no weights.
MODEL_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
    "q_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "hidden_act": "silu",
    "vocab_size": 512, "max_position_embeddings": 4096, "rope_theta": 50000.0, "rms_norm_eps": 1e-05,
    "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}

# Runs in the venv's python: argv[1] is a JSON list of cases {"name", "argv" (after `vllm serve`), "env"}.
PROBE = r'''
import json, os, sys, traceback
import vllm
import vllm.entrypoints.cli.serve as serve
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser

ARGS = ["model_tag", "nnodes", "node_rank", "master_addr", "master_port", "distributed_executor_backend",
        "tensor_parallel_size", "data_parallel_size", "data_parallel_size_local", "data_parallel_start_rank",
        "data_parallel_address", "data_parallel_rpc_port", "data_parallel_rank", "enable_expert_parallel",
        "headless", "api_server_count"]
PARALLEL = ["world_size", "world_size_across_dp", "tensor_parallel_size", "data_parallel_size",
            "data_parallel_size_local", "data_parallel_rank", "data_parallel_master_ip", "data_parallel_rpc_port",
            "nnodes", "node_rank", "nnodes_within_dp", "node_rank_within_dp", "master_addr", "master_port",
            "distributed_executor_backend", "enable_expert_parallel", "data_parallel_hybrid_lb",
            "data_parallel_external_lb", "local_engines_only"]


def plain(v):
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


def error(e):
    return {"type": type(e).__name__, "message": str(e), "tb": traceback.format_exc()[-2500:]}


def build_config(args, entry, res):
    """What the entry point vLLM picked does first: the engine args from the namespace, then the config. The
    ParallelConfig create_engine_config builds is kept as it is handed to VllmConfig, so that a refusal of the
    whole config (VllmConfig's own checks, some of them of this machine) still leaves the engine's parallel view."""
    import vllm.engine.arg_utils as au
    ea = vllm.AsyncEngineArgs.from_cli_args(args)
    if entry == "run_multi_api_server":
        ea._api_process_count = args.api_server_count
        ea._api_process_rank = -1
    seen = {}
    original = au.VllmConfig

    def capture(*a, **kw):
        seen["pc"] = kw.get("parallel_config")
        return original(*a, **kw)
    au.VllmConfig = capture
    try:
        ea.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER, headless=entry == "run_headless")
    except BaseException as e:
        res["config_error"] = error(e)
    finally:
        au.VllmConfig = original
    if seen.get("pc") is not None:
        res["parallel"] = {}
        for f in PARALLEL:
            try:
                res["parallel"][f] = plain(getattr(seen["pc"], f, None))
            except Exception as e:
                res["parallel"][f] = {"error": f"{type(e).__name__}: {e}"}


class Reached(Exception):
    pass


def case(c):
    os.environ.update(c["env"])
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(required=False, dest="subparser")
    cmd = serve.ServeSubcommand()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    res = {}
    try:
        args = top.parse_args(["serve", *c["argv"]])
        cmd.validate(args)
    except BaseException as e:  # argparse exits with SystemExit(2)
        res["parse_error"] = error(e)
        return res
    res["parsed"] = {f: plain(getattr(args, f, None)) for f in ARGS}
    reached = {}

    def recorder(name):
        def rec(a, *rest, **kw):
            reached["entry"], reached["args"] = name, a
            raise Reached
        return rec

    serve.run_headless = recorder("run_headless")
    serve.run_multi_api_server = recorder("run_multi_api_server")
    if hasattr(serve, "run_dp_supervisor"):
        serve.run_dp_supervisor = recorder("run_dp_supervisor")
    serve.run_server = recorder("run_server")  # `uvloop.run(run_server(args))`: raises before uvloop runs
    try:
        args.dispatch_function(args)
        res["cmd_error"] = {"type": "NoEntry", "message": "serve's cmd returned without an entry point"}
        return res
    except Reached:
        pass
    except BaseException as e:
        res["cmd_error"] = error(e)
        return res
    res["entry"] = reached["entry"]
    res["api_server_count"] = reached["args"].api_server_count
    res["model"] = reached["args"].model  # serve's cmd: the positional model tag wins over --model
    build_config(reached["args"], reached["entry"], res)
    return res


out = {"vllm": vllm.__version__}
for c in json.loads(sys.argv[1]):
    out[c["name"]] = case(c)
print("PROBE " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return d


def write_inventory(tmp, version: str, layout: str, model) -> str:
    doc = {"all": {"children": {"specdeploy_engines": {
        "vars": {"specdeploy_engine": "vllm", "specdeploy_engine_version": version,
                 "specdeploy_hardware": "h200_nvl8", "specdeploy_model_path": str(model),
                 "specdeploy_served_model_name": "m"},
        "children": {"g": {"vars": {"specdeploy_topology": layout, "specdeploy_group": "g"},
                           "hosts": {h: {"ansible_host": a} for h, a in HOSTS.items()}}}}}}}
    p = tmp / f"hosts-{version}-{layout}.yml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def flag_value(argv, name):
    return argv[argv.index(name) + 1]


def with_value(argv, name, value):
    out = list(argv)
    out[out.index(name) + 1] = str(value)
    return out


def rendered(version: str, model, tmp) -> dict:
    """(layout, host) -> (argv, env) as `specdeploy plan` renders them."""
    out = {}
    for layout in LAYOUTS:
        _, plans, _ = plan(write_inventory(tmp, version, layout, model))
        for host, _, p in plans:
            out[layout, host] = (list(p.argv), dict(p.env))
    return out


def run_probe(version: str, venv, cases: list[dict], tmp) -> dict:
    script = tmp / "probe_ranks.py"
    script.write_text(PROBE)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "TMPDIR": os.environ.get("TMPDIR", "/tmp"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_LOGGING_LEVEL": "WARNING", **realengine.env(version)}
    r = subprocess.run([str(venv / "bin" / "python"), str(script), json.dumps(cases)], capture_output=True,
                       text=True, env=env, cwd=tmp, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-5000:]
    return json.loads(lines[-1][len("PROBE "):])


@pytest.fixture(scope="module", params=VERSIONS)
def engine(request, model, tmp_path_factory):
    """For one release: the rendered command lines, and what that release's `vllm serve` made of each."""
    version = request.param
    venv = realengine.venv(version)  # built here (CI builds it too): a machine that cannot fails, with the reason
    tmp = tmp_path_factory.mktemp(f"ranks-{version}")
    lines = rendered(version, model, tmp)
    follower_tp, env_tp = lines["tp", "h2"]
    follower_dp, env_dp = lines["dp_ep", "h2"]
    cases = [{"name": f"{layout}/{host}", "argv": argv[2:], "env": env} for (layout, host), (argv, env)
             in lines.items()]
    cases.append({"name": "bad/node_rank", "env": env_tp,
                  "argv": with_value(follower_tp, "--node-rank", flag_value(follower_tp, "--nnodes"))[2:]})
    cases.append({"name": "bad/dp_start_rank", "env": env_dp,
                  "argv": with_value(follower_dp, "--data-parallel-start-rank",
                                     flag_value(follower_dp, "--data-parallel-size"))[2:]})
    got = run_probe(version, venv, cases, tmp)
    assert got["vllm"].startswith(version)
    return version, lines, got


def test_the_plan_renders_the_adapters_rank_flags(engine):
    """The argv under test is the plan's, and it carries exactly the adapter's layout flags for the rank."""
    version, lines, _ = engine
    adapter = get_adapter("vllm", version)
    for (layout, host), (argv, env_) in lines.items():
        index = list(HOSTS).index(host)
        rank = Rank(layout=layout, group="g", index=index, hosts=tuple(HOSTS), leader_address=HOSTS["h1"],
                    address=HOSTS[host], port=PORT, gpus=GPUS, tp_per_dp=1)
        flags, env = adapter.layout_args(None, rank)
        assert argv[:2] == ["vllm", "serve"] and flags
        i = argv.index(flags[0])
        assert argv[i:i + len(flags)] == flags, (layout, host, flags, argv)
        assert all(env_[k] == v for k, v in env.items()), (layout, host, env)


def ok(got: dict, name: str, model) -> dict:
    """The case's result; vLLM parsed it, took the rendered model, picked an entry point and built its
    ParallelConfig."""
    res = got[name]
    errs = {k: res[k] for k in ("parse_error", "cmd_error") if k in res}
    assert not errs and "parallel" in res, f"{name}: {json.dumps(errs or res, indent=1)[-4000:]}"
    assert res["parsed"]["model_tag"] == res["model"] == str(model), res
    return res


def cpu_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def config_accepted_or_short_of_this_machines_memory(res: dict, version: str, tp: int) -> None:
    """The whole VllmConfig was accepted, except for one check of THIS machine: vLLM 0.16.0's
    CacheConfig.verify_with_parallel_config reserves swap_space (4 GiB) per tensor-parallel rank and counts every
    rank of the TP world as on this node (its own FIXME), refusing above 70% of this host's RAM. TP 16 asks
    64 GiB, which the rank's real host (an H200 NVL8 node) has; a small controller may not. Anything else is a
    refusal and fails."""
    err = res.get("config_error")
    if err is None:
        return
    asked = 4 * tp * 2**30
    assert version == "0.16.0" and "Too large swap space." in err["message"] and asked > 0.7 * cpu_memory(), err


@pytest.mark.parametrize("host", list(HOSTS))
def test_tp_ranks_as_vllm_reads_them(engine, host, model):
    version, _, got = engine
    res = ok(got, f"tp/{host}", model)
    a, pc = res["parsed"], res["parallel"]
    rank = list(HOSTS).index(host)
    assert a["nnodes"] == 2 and a["node_rank"] == rank
    assert a["master_addr"] == HOSTS["h1"] and a["master_port"] == PORT
    assert a["distributed_executor_backend"] == "mp" and a["tensor_parallel_size"] == 16
    assert a["data_parallel_size"] == 1 and a["enable_expert_parallel"] is False
    assert a["headless"] is (rank == 1)
    if rank == 0:  # one API server in this process; the engine core spans both hosts (0.32.0's cmd resets the
        # count to None on this path)
        assert res["entry"] == "run_server", res
        assert res["api_server_count"] == (1 if version == "0.16.0" else None), res
    else:  # no API server: the headless path, and inside it the multiproc executor's workers
        assert res["entry"] == "run_headless" and res["api_server_count"] == 0, res
    # the engine's own ParallelConfig, built on CPU exactly as that entry point builds it
    assert pc["world_size"] == 16 and pc["world_size_across_dp"] == 16 and pc["tensor_parallel_size"] == 16
    assert pc["data_parallel_size"] == 1 and pc["data_parallel_rank"] == 0
    assert pc["nnodes"] == 2 and pc["node_rank"] == rank
    assert pc["nnodes_within_dp"] == 2 and pc["node_rank_within_dp"] == rank  # run_headless: > 0 -> workers
    assert pc["master_addr"] == HOSTS["h1"] and pc["master_port"] == PORT
    assert pc["distributed_executor_backend"] == "mp"
    config_accepted_or_short_of_this_machines_memory(res, version, 16)


@pytest.mark.parametrize("host", list(HOSTS))
def test_dp_ep_ranks_as_vllm_reads_them(engine, host, model):
    version, _, got = engine
    res = ok(got, f"dp_ep/{host}", model)
    a, pc = res["parsed"], res["parallel"]
    rank = list(HOSTS).index(host)
    assert a["data_parallel_size"] == 16 and a["data_parallel_size_local"] == GPUS
    assert a["data_parallel_address"] == HOSTS["h1"] and a["data_parallel_rpc_port"] == PORT
    assert a["enable_expert_parallel"] is True and a["tensor_parallel_size"] == 1
    assert a["data_parallel_start_rank"] == (8 if rank else None)
    assert a["headless"] is (rank == 1)
    assert a["nnodes"] == 1 and a["node_rank"] == 0  # dp_ep places ranks by start rank, not by node rank
    if rank == 0:
        # no start rank, no external rank: vLLM's internal load balancing, one API server per DP rank of the
        # whole group (serve's default api_server_count = data_parallel_size)
        assert res["entry"] == "run_multi_api_server" and res["api_server_count"] == 16, res
    else:
        assert res["entry"] == "run_headless" and res["api_server_count"] == 0, res
    assert pc["world_size"] == 1 and pc["world_size_across_dp"] == 16 and pc["tensor_parallel_size"] == 1
    assert pc["data_parallel_size"] == 16 and pc["data_parallel_size_local"] == GPUS
    assert pc["data_parallel_rank"] == 8 * rank  # run_headless starts the local engines at this index
    assert pc["data_parallel_master_ip"] == HOSTS["h1"] and pc["data_parallel_rpc_port"] == PORT
    assert pc["enable_expert_parallel"] is True
    assert pc["data_parallel_hybrid_lb"] is False and pc["data_parallel_external_lb"] is False
    assert pc["node_rank_within_dp"] == 0  # run_headless: the data-parallel engines path, not TP workers
    assert "config_error" not in res, res["config_error"]


def test_a_node_rank_equal_to_nnodes_is_refused_by_the_engine(engine):
    version, _, got = engine
    res = got["bad/node_rank"]
    # the parser takes it (an int), serve's cmd picks the headless path, the engine config refuses it
    assert "parse_error" not in res and "cmd_error" not in res, res
    assert res["parsed"]["node_rank"] == 2 and res["parsed"]["nnodes"] == 2
    assert res["entry"] == "run_headless"
    err = res.get("config_error")
    assert err, f"vLLM {version} built a config for node rank 2 of 2: {res.get('parallel')}"
    if version == "0.16.0":
        assert err["type"] == "AssertionError" and err["message"] == "node_rank=2 must be less than nnodes=2.", err
    else:
        assert err["type"] == "ValueError", err
        assert "`--node-rank` must be between 0 and 1; got `--node-rank 2`" in err["message"], err


def test_a_dp_start_rank_equal_to_the_dp_size_is_refused_by_the_engine(engine):
    version, _, got = engine
    res = got["bad/dp_start_rank"]
    assert "parse_error" not in res and "cmd_error" not in res, res
    assert res["parsed"]["data_parallel_start_rank"] == 16 and res["entry"] == "run_headless"
    err = res.get("config_error")
    assert err, f"vLLM {version} built a config for data-parallel start rank 16 of 16: {res.get('parallel')}"
    assert "data_parallel_rank (16) must be in the range [0, 16)" in err["message"], err
