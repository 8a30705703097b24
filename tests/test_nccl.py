import json

import pytest

from specdeploy.nccl import default_candidates
from specdeploy.nccl.choose import ChooseError, choose, parse_batch_mix
from specdeploy.nccl.topo import explain, iommu_mode, parse_acs, parse_topo_matrix
from specdeploy.plan import plan


@pytest.fixture
def recorded(repo):
    return json.loads((repo / "tests/data/nccl-h200x2-nvlink.json").read_text())


def test_choice_on_recorded_h200_results(recorded):
    ch = choose(recorded)
    # the seeds' set is rejected: prefill-size all-reduces are much slower than the default
    assert "seeds" in ch.rejected and "prefill" in ch.rejected["seeds"]
    assert ch.chosen == "min_ctas=16" and ch.env == {"NCCL_MIN_CTAS": "16"}
    assert ch.weighted_us[ch.chosen] < ch.weighted_us["default"]
    assert ch.prefill_ratio[ch.chosen] <= 1.03
    # the per-size oracle is never worse than any single global environment
    assert ch.per_size_weighted_us <= min(ch.weighted_us.values()) + 1e-9


def test_batch_mix_changes_the_choice(recorded):
    # weighting only the 1-token size: the choice is the fastest feasible env at 1 token
    ch = choose(recorded, batch_mix="1:1")
    lat1 = {c["name"]: c["graph"]["1"]["median_us"] for c in recorded["candidates"]}
    feasible = [n for n in lat1 if n not in ch.rejected]
    assert ch.chosen == min(feasible, key=lat1.get)
    with pytest.raises(ChooseError):
        parse_batch_mix("3:1", [1, 2, 4])


def test_tuner_csv_bands_are_ordered_and_disjoint(recorded):
    rows = [r.split(",") for r in choose(recorded).tuner_rows]
    assert rows
    bands = [(int(r[1]), int(r[2])) for r in rows]
    assert all(lo <= hi for lo, hi in bands)
    assert all(b[0] > a[1] for a, b in zip(bands, bands[1:]))
    assert {r[3] for r in rows} <= {"ring", "tree"} and {r[4] for r in rows} <= {"ll", "ll128", "simple"}


def test_crashed_candidate_is_reported_not_chosen(recorded):
    data = json.loads(json.dumps(recorded))
    for c in data["candidates"]:
        if c["name"] == "min_ctas=16":
            c.clear()
            c.update({"name": "min_ctas=16", "env": {}, "status": "timeout", "detail": "no result after 120 s"})
    ch = choose(data)
    assert ch.chosen != "min_ctas=16"
    assert ch.rejected["min_ctas=16"].startswith("timeout")


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


def test_chosen_env_reaches_rendered_units(repo, recorded):
    env = choose(recorded).env
    _, plans, _ = plan(repo / "inventory/example", extra={"specdeploy_nccl_env": env})
    for _, _, p in plans:
        assert "NCCL_MIN_CTAS=16" in p.files["/etc/specdeploy/specdeploy-vllm.env"]
        assert "NCCL_P2P_LEVEL" not in p.files["/etc/specdeploy/specdeploy-vllm.env"]
