import json
import subprocess
import sys

import pytest
import yaml

from specdeploy.engines import AllReducePath
from specdeploy.nccl import default_candidates
from specdeploy.nccl import tune as tune_mod
from specdeploy.nccl.choose import ChooseError, choose, load_rounds, parse_batch_mix
from specdeploy.nccl.pcie import explain, iommu_mode, parse_acs, parse_topo_matrix
from specdeploy.nccl.traffic import Traffic, traffic
from specdeploy.plan import plan
from helpers import TESTS

DECODE = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@pytest.fixture
def recorded(repo):
    """Format 1: one run per candidate (the 2x H200 NVLink sweep recorded before rounds existed)."""
    return json.loads((repo / "tests/data/nccl-h200x2-nvlink.json").read_text())


@pytest.fixture
def nvlink_rounds(repo):
    """Format 2: 5 interleaved rounds on 2x H200 NVLink, every candidate, default and A/A twin each round."""
    return json.loads((repo / "tests/data/nccl-h200x2-nvlink-rounds.json").read_text())


@pytest.fixture
def p2p_rounds(repo):
    """Format 2: 5 interleaved rounds on the same machine with NCCL_P2P_DISABLE=1."""
    return json.loads((repo / "tests/data/nccl-h200x2-p2p-off-rounds.json").read_text())


def split_rounds(data: dict) -> list[tuple[str, dict]]:
    """One results file per round, as several `nccl tune --rounds 1` runs would write them."""
    out = []
    for r in data["rounds"]:
        d = {k: v for k, v in data.items() if k != "rounds"}
        d["rounds"] = [r]
        out.append((f"round{r['round']}.json", d))
    return out


def synthetic(factors: list[float], prefill_factor: float = 1.0, aa: bool = True) -> list[tuple[str, dict]]:
    """Files of one round each, built from the real default latencies of the recorded sweep: candidate 'x' runs
    at ``factors[i]`` times the default in round i (decode sizes), ``prefill_factor`` at prefill sizes."""
    base = json.loads((TESTS / "data/nccl-h200x2-nvlink-rounds.json").read_text())
    files = []
    for i, f in enumerate(factors):
        real = base["rounds"][i % len(base["rounds"])]
        dflt = next(c for c in real["candidates"] if c["name"] == "default")
        x = json.loads(json.dumps(dflt))
        x.update(name="x", env={"NCCL_MIN_CTAS": "16"})
        for t, v in x["graph"].items():
            v["median_us"] *= f if int(t) <= 256 else prefill_factor
        cands = [dflt, x]
        if aa:
            cands.append(dict(json.loads(json.dumps(dflt)), name=tune_mod.AA_NAME))
        d = {k: v for k, v in base.items() if k != "rounds"}
        d["rounds"] = [{"round": 1, "order": [c["name"] for c in cands], "candidates": cands}]
        files.append((f"sweep{i}.json", d))
    return files


# --- the choice over rounds -----------------------------------------------------------------------------------

def test_old_format_is_read_as_one_round_and_keeps_the_default(recorded):
    ch = choose(recorded)
    assert ch.rounds == 1 and ch.chosen == "default" and ch.env == {}
    assert "only 1 round" in ch.reason
    # the single run still ranks the candidates as before: min_ctas=16 looked 12% faster in that one run
    assert ch.weighted_us["min_ctas=16"] < 0.9 * ch.weighted_us["default"]
    assert ch.candidates["min_ctas=16"].verdict.startswith("only 1 round")


def test_candidate_winning_in_one_round_only_keeps_default():
    # the pattern of the three back-to-back rounds that did not reproduce: 1.00x, 1.02x, 0.87x
    ch = choose(synthetic([1.00, 1.02, 0.87]))
    assert ch.rounds == 3 and ch.chosen == "default"
    x = ch.candidates["x"]
    assert x.decode.wins == 1 and x.decode.hi >= 1.0
    assert "includes no gain" in x.verdict


def test_candidate_winning_consistently_is_chosen():
    ch = choose(synthetic([0.90, 0.91, 0.89, 0.92]))
    assert ch.chosen == "x" and ch.env == {"NCCL_MIN_CTAS": "16"}
    x = ch.candidates["x"]
    assert x.decode.wins == 4 and x.decode.hi < 0.97
    assert 0.89 <= x.decode.ratio <= 0.92


def test_small_consistent_gain_below_threshold_keeps_default():
    ch = choose(synthetic([0.985, 0.98, 0.99, 0.985]))
    assert ch.chosen == "default" and ch.candidates["x"].verdict.startswith("gain 1.5% < 3%")


def test_prefill_slower_beyond_noise_blocks_a_decode_win():
    ch = choose(synthetic([0.90, 0.91, 0.89], prefill_factor=1.08))
    assert ch.chosen == "default"
    assert "prefill" in ch.candidates["x"].verdict and "slower beyond noise" in ch.candidates["x"].verdict
    # 2% slower at prefill sizes is within the tolerance
    assert choose(synthetic([0.90, 0.91, 0.89], prefill_factor=1.02)).chosen == "x"


def test_recorded_nvlink_rounds_keep_default_and_aa_is_the_noise_floor(nvlink_rounds):
    ch = choose(split_rounds(nvlink_rounds))  # several files, pooled
    assert ch.rounds == 5 and len(ch.sources) == 5
    assert ch.chosen == "default" and "no candidate" in ch.reason
    assert ch.aa is not None and ch.aa.decode.rounds == 4  # the A/A run crashed in one round (port in use)
    assert ch.aa_floor is not None and ch.aa_floor > 0.03
    assert any("crash" in f for f in ch.aa.failures)
    # the seeds' set is rejected at prefill sizes on every path
    assert "prefill" in ch.candidates["seeds"].verdict
    # pooling the files gives the same answer as the one multi-round file
    assert choose(nvlink_rounds).candidates["min_ctas=16"].decode.ratio == \
        pytest.approx(ch.candidates["min_ctas=16"].decode.ratio)


def test_recorded_p2p_off_rounds_pick_min_ctas(p2p_rounds):
    ch = choose(p2p_rounds)
    assert ch.chosen == "min_ctas=16"
    assert ch.env == {"NCCL_P2P_DISABLE": "1", "NCCL_MIN_CTAS": "16"}
    d = ch.candidates["min_ctas=16"].decode
    assert d.wins == 5 and d.hi < 0.97 and 1 - d.ratio > ch.aa_floor


def test_old_and_new_files_pool_and_mismatched_files_are_refused(recorded, nvlink_rounds, p2p_rounds):
    _, rounds = load_rounds([("old.json", recorded), ("new.json", nvlink_rounds)])
    assert len(rounds) == 6 and rounds[0].source == "old.json"
    with pytest.raises(ChooseError, match="p2p.json: base_env"):
        load_rounds([("nv.json", nvlink_rounds), ("p2p.json", p2p_rounds)])
    bad = json.loads(json.dumps(nvlink_rounds))
    for c in bad["rounds"][0]["candidates"]:
        if c["name"] == "min_ctas=16":
            c["env"] = {"NCCL_MIN_CTAS": "8"}
    with pytest.raises(ChooseError, match="min_ctas=16"):
        load_rounds([("a.json", nvlink_rounds), ("b.json", bad)])


def test_crashed_candidate_is_reported_not_chosen():
    files = synthetic([0.90, 0.91, 0.89])
    x = next(c for c in files[1][1]["rounds"][0]["candidates"] if c["name"] == "x")
    x.clear()
    x.update({"name": "x", "env": {"NCCL_MIN_CTAS": "16"}, "status": "timeout", "detail": "no result after 60 s"})
    ch = choose(files)
    assert ch.chosen == "default"
    assert ch.candidates["x"].verdict.startswith("failed in 1 run(s): sweep1.json round 1: timeout")


def test_batch_mix(p2p_rounds):
    ch = choose(p2p_rounds, batch_mix="1:1")
    assert ch.weights == {1: 1.0}
    with pytest.raises(ChooseError):
        parse_batch_mix("3:1", [1, 2, 4])


def test_tuner_csv_bands_are_ordered_and_disjoint(nvlink_rounds):
    rows = [r.split(",") for r in choose(nvlink_rounds).tuner_rows]
    assert rows
    bands = [(int(r[1]), int(r[2])) for r in rows]
    assert all(lo <= hi for lo, hi in bands)
    assert all(b[0] > a[1] for a, b in zip(bands, bands[1:]))
    assert {r[3] for r in rows} <= {"ring", "tree"} and {r[4] for r in rows} <= {"ll", "ll128", "simple"}


# --- what the engine sends to NCCL ---------------------------------------------------------------------------

def _bytes(tokens: int) -> int:
    return tokens * 7168 * 2


def test_vllm_on_nvswitch_h200_sends_no_decode_size_to_nccl():
    tr = traffic("vllm", "0.16.0", "h200_nvl8", 8)
    names = [p.name for p in tr.paths]
    assert names == ["custom all-reduce", "torch symmetric-memory all-reduce"]
    # custom all-reduce capped at 256 KiB at TP 8 on SM90 while symmetric memory is active; the latter < 64 MiB
    assert tr.paths[0].max_bytes == 256 * 1024 and tr.paths[1].max_bytes == 64 * 1024 * 1024
    assert [tr.reaches_nccl(_bytes(t)) for t in DECODE] == [False] * 9
    assert tr.reaches_nccl(_bytes(8192)) is True  # 117 MB
    assert tr.reaches_nccl(64 * 1024 * 1024 - 2) is False and tr.reaches_nccl(64 * 1024 * 1024) is True
    # from 0.22 the symmetric-memory bound is inclusive
    assert traffic("vllm", "0.33.0", "h200_nvl8", 8).reaches_nccl(64 * 1024 * 1024) is False


def test_vllm_fusion_pass_counts_from_0_17():
    before = traffic("vllm", "0.16.0", "b200_nvl8", 8).paths
    assert "FlashInfer all-reduce+RMSNorm fusion" not in [p.name for p in before]
    fi = [p for p in traffic("vllm", "0.17.0", "b200_nvl8", 8).paths if p.name.startswith("FlashInfer")]
    assert fi and fi[0].max_bytes == 1024 * 1024


def test_pcie_profile_with_custom_all_reduce_off_sends_everything_to_nccl():
    for engine, version in (("vllm", "0.16.0"), ("vllm", "0.33.0"), ("sglang", "0.5.23")):
        tr = traffic(engine, version, "rtx_pro_6000_pcie", 8)
        assert tr.paths == [] and "custom all-reduce off" in tr.label
        assert all(tr.reaches_nccl(_bytes(t)) for t in DECODE + [2048, 8192])


def test_custom_all_reduce_needs_nvlink_above_two_gpus():
    # forced on, on PCIe: vLLM and SGLang still skip it for more than two GPUs, keep it for two
    assert traffic("vllm", "0.16.0", "rtx_pro_6000_pcie", 8, custom_all_reduce=True).paths == []
    two = traffic("vllm", "0.16.0", "rtx_pro_6000_pcie", 2, custom_all_reduce=True).paths
    assert [p.name for p in two] == ["custom all-reduce"] and two[0].max_bytes == 8 * 1024 * 1024


def test_sglang_custom_all_reduce_bound_is_inclusive_and_fusion_makes_large_sizes_unknown():
    tr = traffic("sglang", "0.5.23", "h200_nvl8", 8)
    assert tr.reaches_nccl(8 * 1024 * 1024) is False  # size <= max_size
    assert tr.reaches_nccl(8 * 1024 * 1024 + 16) is None  # FlashInfer fusion, bound not recorded
    old = traffic("sglang", "0.5.1", "h200_nvl8", 8)
    assert old.reaches_nccl(8 * 1024 * 1024 + 16) is True


def test_choice_weights_only_nccl_sizes(p2p_rounds):
    # an engine path taking everything below 1 MiB leaves 128 and 256 tokens (1.8 MB, 3.7 MB) to NCCL
    tr = Traffic("test engine", [AllReducePath("custom all-reduce", 1024 * 1024, False, "test")])
    ch = choose(p2p_rounds, traffic=tr)
    assert set(ch.weights) == {128, 256} and ch.not_nccl == [1, 2, 4, 8, 16, 32, 64]
    # NVSwitch H200 with vLLM: no decode size reaches NCCL, so the default stays, and says why
    ch = choose(p2p_rounds, traffic=traffic("vllm", "0.16.0", "h200_nvl8", 2))
    assert ch.chosen == "default" and ch.weights == {} and "NCCL carries none" in ch.reason


# --- command line and host_vars --------------------------------------------------------------------------------

def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "specdeploy.cli", "nccl", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_choose_json_pools_files_and_prints_chosen(tmp_path):
    paths = []
    for name, data in synthetic([0.90, 0.91, 0.89]):
        (tmp_path / name).write_text(json.dumps(data))
        paths.append(tmp_path / name)
    r = _cli("choose", *paths, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["chosen"] == "x" and out["rounds"] == 3 and len(out["sources"]) == 3
    assert out["candidates"]["x"]["decode_vs_default"]["wins"] == 3
    r = _cli("choose", paths[0], "--json")
    assert json.loads(r.stdout)["chosen"] == "default"


def test_host_vars_choice_names_its_evidence(tmp_path, repo):
    hv = tmp_path / "host_vars" / "gpu-a" / "specdeploy_nccl.yml"
    hv.parent.mkdir(parents=True)
    hv.write_text("---\nother_var: 1\n")
    src = repo / "tests/data/nccl-h200x2-p2p-off-rounds.json"
    r = _cli("choose", src, "--write-host-vars", hv, "--engine", "vllm", "--engine-version", "0.16.0",
             "--hardware", "rtx_pro_6000_pcie")
    assert r.returncode == 0, r.stderr
    text = hv.read_text()
    data = yaml.safe_load(text)
    assert data == {"other_var": 1, "specdeploy_nccl_env": {"NCCL_MIN_CTAS": "16", "NCCL_P2P_DISABLE": "1"}}
    comments = [line for line in text.splitlines() if line.startswith("#")]
    joined = "\n".join(comments)
    assert str(src) in joined and "5 round(s)" in joined
    assert "weighted decode vs default: 0.9" in joined and "faster in 5/5" in joined
    assert "A/A noise floor: ±" in joined and "vllm 0.16.0 on rtx_pro_6000_pcie" in joined


def test_cli_refuses_bad_input_without_traceback(tmp_path, repo):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = _cli("choose", bad)
    assert r.returncode == 2 and "not JSON" in r.stderr and "Traceback" not in r.stderr
    r = _cli("choose", repo / "tests/data/nccl-h200x2-nvlink-rounds.json",
             repo / "tests/data/nccl-h200x2-p2p-off-rounds.json")
    assert r.returncode == 2 and "base_env" in r.stderr and "Traceback" not in r.stderr
    r = _cli("choose", repo / "tests/data/nccl-h200x2-nvlink.json", "--engine", "vllm", "--engine-version", "9.9",
             "--hardware", "h200_nvl8")
    assert r.returncode == 2 and "not supported" in r.stderr and "Traceback" not in r.stderr


# --- tune: rounds, interleaving, A/A ---------------------------------------------------------------------------

def test_tune_runs_every_candidate_every_round_in_shuffled_order(tmp_path, monkeypatch):
    calls = []

    def fake(name, env, *a, **k):
        calls.append((name, env))
        return {"name": name, "env": env, "status": "ok", "graph": {"1": {"median_us": 10.0}}}
    monkeypatch.setattr(tune_mod, "run_candidate", fake)
    out = tmp_path / "r.json"
    cands = {f"c{i}": {"NCCL_MIN_CTAS": str(i)} for i in range(6)}
    res = tune_mod.tune(cands, 2, 7168, out, tokens=(1,), modes=("graph",), rounds=4, seed=3,
                        base_env={"NCCL_P2P_DISABLE": "1"})
    assert json.loads(out.read_text()) == res and res["format"] == 2 and res["seed"] == 3
    orders = [r["order"] for r in res["rounds"]]
    assert len(orders) == 4 and all(sorted(o) == sorted(["default", tune_mod.AA_NAME, *cands]) for o in orders)
    assert len({tuple(o) for o in orders}) == 4  # a fresh order per round
    assert [n for n, _ in calls] == [n for o in orders for n in o]  # run in the recorded order
    assert all(env["NCCL_P2P_DISABLE"] == "1" for _, env in calls)
    # the same seed gives the same orders
    res2 = tune_mod.tune(cands, 2, 7168, tmp_path / "s.json", tokens=(1,), modes=("graph",), rounds=4, seed=3)
    assert [r["order"] for r in res2["rounds"]] == orders


def test_tune_repeats_a_run_that_lost_its_rendezvous_port(monkeypatch):
    seen = []

    def once(name, *a, **k):
        seen.append(name)
        if len(seen) == 1:
            return {"name": name, "env": {}, "status": "crash", "log_tail": "DistNetworkError: EADDRINUSE"}
        return {"name": name, "env": {}, "status": "ok"}
    monkeypatch.setattr(tune_mod, "_run_once", once)
    rec = tune_mod.run_candidate("default", {}, 2, 7168, (1,), ("graph",), 5, 10, 30)
    assert rec["status"] == "ok" and rec["port_retries"] == 1 and len(seen) == 2


# --- topology and rendering -------------------------------------------------------------------------------------

def test_topology_parser_pcie_and_nvlink(repo):
    pcie = parse_topo_matrix((repo / "tests/data/topo-rtx6000-8x.txt").read_text())
    assert len(pcie.gpus) == 8 and pcie.worst_link() == "SYS"
    assert pcie.links[("GPU0", "GPU1")] == "NODE" and pcie.links[("GPU0", "GPU7")] == "SYS"
    notes = explain(pcie, {"0000:40:01.1": True}, iommu_mode("BOOT_IMAGE=/vmlinuz ro quiet"))
    assert any("NCCL_P2P_LEVEL=SYS" in n for n in notes)
    assert any("ACS redirect" in n for n in notes)
    assert any("IOMMU mode is unknown" in n for n in notes)
    nv = parse_topo_matrix((repo / "tests/data/topo-h200-2x.txt").read_text())
    assert nv.nvlink_all and "NVLink" in explain(nv)[0]


def test_acs_and_iommu_parsers():
    lspci = ("00:01.1 PCI bridge: AMD Device 14ab\n\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+\n"
             "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+\n"
             "00:03.1 PCI bridge: AMD Device 14a5\n\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir-\n")
    assert parse_acs(lspci) == {"00:01.1": True, "00:03.1": False}
    assert iommu_mode("quiet amd_iommu=off") == "off"
    assert iommu_mode("quiet iommu=pt") == "passthrough"
    assert iommu_mode("quiet", iommu_groups=12) == "translated"


def test_default_candidates_include_seeds_and_p2p_levels_on_pcie():
    c = default_candidates(pcie=True)
    assert c["default"] == {} and c["seeds"]["NCCL_PROTO"] == "LL"
    assert "p2p_level=SYS" in c and "p2p_level=SYS" not in default_candidates(pcie=False)


def test_chosen_env_reaches_rendered_units(repo, p2p_rounds):
    env = choose(p2p_rounds).env
    _, plans, _ = plan(repo / "inventory/example", extra={"specdeploy_nccl_env": env})
    for _, _, p in plans:
        assert "NCCL_MIN_CTAS=16" in p.files["/etc/specdeploy/specdeploy-vllm.env"]
        assert "NCCL_P2P_LEVEL" not in p.files["/etc/specdeploy/specdeploy-vllm.env"]


def test_choose_reads_engine_and_profile_from_the_inventory(repo, tmp_path):
    src = repo / "tests/data/nccl-h200x2-p2p-off-rounds.json"
    r = _cli("choose", src, "-i", repo / "inventory/example", "--host", "gpu-a", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # example hosts: vLLM on RTX PRO 6000 PCIe, custom all-reduce off by profile: NCCL carries every size
    assert "rtx_pro_6000_pcie" in out["traffic"]["label"] and "custom all-reduce off" in out["traffic"]["label"]
    assert out["traffic"]["decode_sizes_not_on_nccl"] == [] and out["chosen"] == "min_ctas=16"
    r = _cli("choose", src, "-i", repo / "inventory/example", "--host", "nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_flat_candidates_reads_both_formats(recorded, nvlink_rounds):
    from specdeploy.nccl.choose import flat_candidates
    old = flat_candidates(recorded)
    assert old == recorded["candidates"]
    new = {c["name"]: c for c in flat_candidates(nvlink_rounds)}
    per_round = [c["graph"]["8"]["median_us"] for r in nvlink_rounds["rounds"] for c in r["candidates"]
                 if c["name"] == "default"]
    assert new["default"]["graph"]["8"]["median_us"] == sorted(per_round)[2]  # median of 5 rounds
    assert new["default-aa"]["graph"]["8"]["n_rounds"] == 4  # one A/A run crashed
