"""Host facts and decisions, on real tool outputs collected from public threads (tests/data/hosts/index.yml)."""
from __future__ import annotations

import json

import pytest
import yaml

from helpers import REPO
from specdeploy.gpuhost import fabric, install, remote, report, versions
from specdeploy.gpuhost import pcie as pcie_topo
from specdeploy.gpuhost import smi as nvsmi
from specdeploy.values.hardware import PROFILES
from specdeploy.hostvars.schema import validate_host

DATA = REPO / "tests/data/hosts"
INDEX = yaml.safe_load((DATA / "index.yml").read_text())


def cases(tool):
    return [pytest.param(name, e, id=name) for name, e in INDEX[tool].items()]


def test_every_sample_has_a_source_and_a_file():
    for tool, entries in INDEX.items():
        assert len(entries) >= 2, tool
        for name, e in entries.items():
            assert e["url"].startswith("https://github.com/") or (e["url"] == "recorded" and e["recorded"]), name
            assert (DATA / tool / name).is_file(), name
            assert e["truth"], name
    hosts = " ".join(e["host"] for entries in INDEX.values() for e in entries.values())
    assert "RTX PRO 6000" in hosts and "8x B200" in hosts


@pytest.mark.parametrize("name,e", cases("smi"))
def test_nvidia_smi(name, e):
    smi = nvsmi.parse_smi((DATA / "smi" / name).read_text())
    t = e["truth"]
    assert smi.driver == t["driver"]
    assert smi.cuda == t["cuda"]
    assert smi.count == t["gpus"]
    for key in ("name", "memory_mib", "persistence", "compute_cap", "fabric_state", "fabric_status"):
        if key in t:
            assert {getattr(g, key) for g in smi.gpus} == {t[key]}, key


def test_nvidia_smi_csv_with_and_without_header():
    body = ("0, NVIDIA B200, 00000000:05:00.0, 580.95.05, 183359, Enabled, 10.0\n"
            "1, NVIDIA B200, 00000000:06:00.0, 580.95.05, 183359, Disabled, 10.0\n")
    bare = nvsmi.parse_smi(body)
    head = nvsmi.parse_smi("index, name, pci.bus_id, driver_version, memory.total [MiB], persistence_mode, "
                        "compute_cap\n" + body)
    for smi in (bare, head):
        assert smi.driver == "580.95.05" and smi.count == 2
        assert [g.persistence for g in smi.gpus] == [True, False]
        assert smi.gpus[1].compute_cap == "10.0" and smi.gpus[0].memory_mib == 183359


@pytest.mark.parametrize("name,e", cases("topo"))
def test_topology(name, e):
    topo = pcie_topo.parse_topo((DATA / "topo" / name).read_text())
    t = e["truth"]
    assert len(topo.gpus) == t["gpus"]
    if "worst" in t:
        assert topo.worst_link() == t["worst"]
    if "nvlink_gaps" in t:
        gaps = pcie_topo.nvlink_gaps(topo)
        for gpu, peers in t["nvlink_gaps"].items():
            assert sorted(gaps[gpu]) == peers
        assert not {g for g in gaps if g not in t["nvlink_gaps"]} - {p for ps in t["nvlink_gaps"].values()
                                                                   for p in ps}


@pytest.mark.parametrize("name,e", cases("acs"))
def test_acs(name, e):
    acs = pcie_topo.parse_acs_state((DATA / "acs" / name).read_text())
    assert acs.checked == e["truth"]["checked"] and len(acs.redirect) == e["truth"]["redirect"]


def test_acs_with_addresses_goes_through_the_nccl_parser():
    text = ("00:01.1 PCI bridge: Advanced Micro Devices [AMD] Starship/Matisse GPP Bridge\n"
            "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
            "00:03.1 PCI bridge: Advanced Micro Devices [AMD] Starship/Matisse GPP Bridge\n"
            "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd+ EgressCtrl- DirectTrans-\n")
    assert pcie_topo.parse_acs_state(text) == pcie_topo.Acs(["00:01.1"], 2)


@pytest.mark.parametrize("name,e", cases("fabricmanager"))
def test_fabric_manager(name, e):
    fm = fabric.parse_fabricmanager((DATA / "fabricmanager" / name).read_text())
    for key, want in e["truth"].items():
        assert getattr(fm, key) == want, key


@pytest.mark.parametrize("name,e", cases("cmdline"))
def test_kernel_command_line(name, e):
    assert pcie_topo.iommu_state((DATA / "cmdline" / name).read_text()) == e["truth"]["iommu"]


def test_open_kernel_module_and_driver_from_nvrm_version():
    open_ = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)\n"
    prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"
    assert pcie_topo.open_kernel_module(open_) is True and pcie_topo.nvrm_driver(open_) == "580.95.05"
    assert pcie_topo.open_kernel_module(prop) is False and pcie_topo.nvrm_driver(prop) == "550.127.05"
    assert pcie_topo.open_kernel_module("cat: /proc/driver/nvidia/version: No such file or directory") is None


def test_image_cuda_from_recorded_release_dockerfiles():
    assert versions.image_cuda("vllm", "0.16.0") == ((12, 9), (12, 9))
    assert versions.image_cuda("vllm", "0.17.1") == ((12, 9), (12, 9))  # both neighbours agree
    assert versions.image_cuda("vllm", "0.19.1") == ((12, 9), (13, 0))  # between 12.9 and 13.0: a range, not a guess
    assert versions.image_cuda("vllm", "0.25.0") == ((13, 0), (13, 0))
    assert versions.image_cuda("sglang", "0.5.23") == (None, None)  # not recorded: unknown


def test_driver_cuda_prefers_what_the_driver_reports():
    assert versions.driver_cuda("580.95.05", "13.0") == (13, 0)
    assert versions.driver_cuda("575.57.08") == (12, 9)
    assert versions.driver_cuda("610.43.02", "13.3") == (13, 3)
    assert versions.driver_cuda("999.1") is None


# ---- decisions on recorded outputs -----------------------------------------------------------------------

def hv(**kw):
    v = {"specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0", "specdeploy_hardware": "b200_nvl8",
         "specdeploy_model_path": "/models/kimi"}
    v.update(kw)
    return validate_host("gpu1", v)


def facts(smi_file=None, **kw):
    f = report.HostFacts(os_id="ubuntu", os_version="24.04", codename="noble", docker=True, persistenced=True)
    if smi_file:
        f.smi = nvsmi.parse_smi((DATA / "smi" / smi_file).read_text())
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def errors(rep, subject):
    return [x for x in rep.findings if x.subject == subject and x.severity == "error"]


def full_b200(driver="580.95.05", cuda="13.0"):
    smi = nvsmi.parse_smi((DATA / "smi" / "b200-8x-580.95.05.txt").read_text())
    g = smi.gpus[0]
    smi.gpus = [nvsmi.Gpu(i, g.name, f"00000000:{i + 5:02x}:00.0", g.memory_mib, True, "10.0") for i in range(8)]
    smi.driver, smi.cuda = driver, cuda
    return smi


def test_too_few_gpus_names_host_and_fix():
    rep = report.check_host("gpu1", hv(specdeploy_hardware="rtx_pro_6000_pcie"), facts("rtx-pro-6000-q-580.105.06.txt"))
    [f] = errors(rep, "GPU count")
    assert f.host == "gpu1" and "4 GPU(s)" in f.message and "expects 8" in f.message and f.fix
    assert "gpu1: GPU count" in f.line()


def test_driver_too_old_for_the_engine_image():
    smi = full_b200("570.172.08", None)  # branch 570: CUDA 12.8
    rep = report.check_host("gpu1", hv(specdeploy_engine_version="0.20.0"),
                        facts(smi=smi, fabric=fabric.FabricManager("running"), packages={"nvlsm": "x"},
                              fm_version="570.172.08"))
    [f] = errors(rep, "driver")
    assert "CUDA 12.8" in f.message and "needs CUDA 13.0" in f.message and "580" in f.fix
    # the same host passes vLLM 0.16's image (CUDA 12.9)? No: 12.8 < 12.9 either
    assert errors(report.check_host("gpu1", hv(), facts(smi=smi, fabric=fabric.FabricManager("running"),
                                                    packages={"nvlsm": "x"}, fm_version="570.172.08")), "driver")
    ok = report.check_host("gpu1", hv(specdeploy_engine_version="0.20.0"),
                       facts(smi=full_b200(), fabric=fabric.FabricManager("running"), packages={"nvlsm": "x"},
                             fm_version="580.95.05"))
    assert ok.ok, [x.line() for x in ok.errors]


def test_sm120_needs_cuda_12_8():
    smi = nvsmi.parse_smi((DATA / "smi" / "geforce-510.47.03.txt").read_text())
    rep = report.check_host("ws", hv(specdeploy_hardware="rtx_pro_6000_pcie", specdeploy_runtime="venv"),
                        facts(smi=smi))
    assert any("SM120 needs CUDA >= 12.8" in f.message for f in errors(rep, "driver"))


@pytest.mark.parametrize("name", ["mismatch-550-akash632.txt", "mismatch-580-590-gpudriver735.txt",
                                  "mismatch-530-gpuoperator544.txt"])
def test_fabric_manager_not_matching_the_driver(name):
    fm = fabric.parse_fabricmanager((DATA / "fabricmanager" / name).read_text())
    rep = report.check_host("hgx1", hv(specdeploy_hardware="h200_nvl8"),
                        facts(smi=full_b200(fm.driver_version), fabric=fm))
    [f] = errors(rep, "fabric manager")
    assert f.host == "hgx1" and fm.fm_version in f.message and fm.driver_version in f.message
    assert f"nvidia-fabricmanager={fm.driver_version}-*" in f.fix


def test_fabric_manager_failed_and_nvlsm_missing_on_b200():
    fm = fabric.parse_fabricmanager((DATA / "fabricmanager" / "no-nvswitch-4090-cubestudio29.txt").read_text())
    rep = report.check_host("b200", hv(), facts(smi=full_b200(), fabric=fm, fm_version="580.95.05"))
    assert "NV_WARN_NOTHING_TO_DO" in errors(rep, "fabric manager")[0].message
    assert errors(rep, "nvlsm")
    # H200 (NVLink 4) needs no NVLSM
    assert not errors(report.check_host("h200", hv(specdeploy_hardware="h200_nvl8"),
                                    facts(smi=full_b200(), fabric=fm, fm_version="580.95.05")), "nvlsm")


def test_missing_nvlink_on_an_nvswitch_host():
    topo = pcie_topo.parse_topo((DATA / "topo" / "b200-gpu2-without-nvlink-vllm16336.txt").read_text())
    rep = report.check_host("b200", hv(), facts(smi=full_b200(), topo=topo, fabric=fabric.FabricManager("running"),
                                            packages={"nvlsm": "1"}, fm_version="580.95.05"))
    [f] = errors(rep, "NVLink")
    assert f.message.startswith("GPU0 reaches GPU2 without NVLink") and "GPU2 reaches GPU0, GPU1" in f.message


def rtx_facts(**kw):
    smi = full_b200()
    for g in smi.gpus:
        g.name, g.compute_cap = "NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"
    return facts(smi=smi, **kw)


def test_acs_on_with_p2p_on_is_an_error_unless_disabled_or_p2p_off():
    acs = pcie_topo.parse_acs_state((DATA / "acs" / "mixed-nccl523.txt").read_text())
    pcie = hv(specdeploy_hardware="rtx_pro_6000_pcie")
    rep = report.check_host("rtx1", pcie, rtx_facts(acs=acs, iommu="passthrough"))
    [f] = errors(rep, "ACS")
    assert "5 bridge(s)" in f.message and "gpu_host_acs_disable" in f.fix
    assert not errors(report.check_host("rtx1", pcie, rtx_facts(acs=acs, iommu="passthrough"), acs_disable=True), "ACS")
    p2p_off = hv(specdeploy_hardware="rtx_pro_6000_pcie", specdeploy_nccl_env={"NCCL_P2P_DISABLE": "1"})
    assert report.check_host("rtx1", p2p_off, rtx_facts(acs=acs, iommu="translated")).ok
    clean = pcie_topo.parse_acs_state((DATA / "acs" / "all-off-nccl1405.txt").read_text())
    assert report.check_host("rtx1", pcie, rtx_facts(acs=clean, iommu="passthrough")).ok


def test_translated_iommu_fails_with_p2p_on():
    clean = pcie_topo.parse_acs_state((DATA / "acs" / "all-off-nccl1405.txt").read_text())
    mode = pcie_topo.iommu_state((DATA / "cmdline" / "intel-iommu-on-i915sriov389.txt").read_text())
    rep = report.check_host("rtx1", hv(specdeploy_hardware="rtx_pro_6000_pcie"), rtx_facts(acs=clean, iommu=mode))
    [f] = errors(rep, "IOMMU")
    assert "iommu=pt" in f.fix


def test_blackwell_refuses_the_proprietary_module():
    rep = report.check_host("b200", hv(), facts(smi=full_b200(), open_modules=False,
                                                fabric=fabric.FabricManager("running"),
                                                packages={"nvlsm": "1"}, fm_version="580.95.05"))
    assert errors(rep, "kernel module")


def test_sandbox_host_reports_no_gpu():
    rep = report.check_host("sbx", hv(specdeploy_sandbox=True, specdeploy_runtime="venv"), facts())
    assert rep.ok and any(f.subject == "GPU" and "no GPU" in f.message for f in rep.findings)
    real = report.check_host("gpu1", hv(), facts())
    assert errors(real, "GPU") and "580" in errors(real, "GPU")[0].fix


def test_gather_sections_round_trip():
    out = ("@@begin os\nubuntu 24.04 noble\nx86_64\n@@end os 0\n@@begin smi\nsh: nvidia-smi: not found\n@@end smi 127\n"
           "@@begin cmdline\nBOOT_IMAGE=/vmlinuz ro iommu=pt\n@@end cmdline 0\n"
           "@@begin fm\nLoadState=not-found\nActiveState=inactive\n@@end fm 0\n")
    f = report.facts_from_sections(report.split_sections(out))
    assert (f.os_id, f.os_version, f.codename, f.arch) == ("ubuntu", "24.04", "noble", "x86_64")
    assert f.smi is None and f.iommu == "passthrough" and f.fabric.state == "absent"
    assert set(report.split_sections(out)) == {"os", "smi", "cmdline", "fm"}
    assert all(f"@@begin {k}" in report.gather_script() for k in report.GATHER)


def test_install_plan_per_profile():
    b200 = install.install_plan(PROFILES["b200_nvl8"], "ubuntu", "24.04", "noble", "x86_64", "580.95.05")
    assert b200["cuda_keyring"] == ("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
                                    "cuda-keyring_1.1-1_all.deb")
    assert b200["driver_packages"] == ["nvidia-driver-pinning-580", "nvidia-open"]
    assert b200["fabric_manager_packages"] == ["nvidia-fabricmanager=580.95.05-*", "nvlsm"]
    h200 = install.install_plan(PROFILES["h200_nvl8"], "debian", "12", "bookworm", "x86_64", "570.172.08")
    assert h200["fabric_manager_packages"] == ["nvidia-fabricmanager-570=570.172.08-*"]
    assert h200["docker_repo"] == "https://download.docker.com/linux/debian"
    rtx = install.install_plan(PROFILES["rtx_pro_6000_pcie"], "ubuntu", "22.04", "jammy")
    assert rtx["fabric_manager_packages"] == [] and "ubuntu2204" in rtx["cuda_repo"]
    assert not install.install_plan(PROFILES["rtx_pro_6000_pcie"], "ubuntu", "20.04", "focal")["supported"]


def test_daemon_json_merges_and_is_stable():
    first = install.docker_daemon_config(None)
    assert first["differs"] and json.loads(first["content"])["runtimes"]["nvidia"]["path"] == \
        "nvidia-container-runtime"
    again = install.docker_daemon_config(first["content"])
    assert not again["differs"]
    # the user's keys stay; a reformatted but equal file is not rewritten
    user = json.dumps({"log-driver": "json-file", **json.loads(first["content"])})
    assert not install.docker_daemon_config(user)["differs"]
    mine = install.docker_daemon_config('{"data-root": "/data/docker"}')
    assert mine["differs"] and json.loads(mine["content"])["data-root"] == "/data/docker"
    assert install.docker_daemon_config("{not json")["error"].startswith("/etc/docker/daemon.json is not JSON")
    # a host without GPUs gets no raised ulimits: a daemon whose own hard limits are lower starts no container
    nogpu = json.loads(install.docker_daemon_config('{"log-level": "warn"}', gpus=False)["content"])
    assert "default-ulimits" not in nogpu and nogpu["log-level"] == "warn" and "nvidia" in nogpu["runtimes"]


def test_preflight_hosts_reads_each_engine_host(example_inv):
    """The inventory's hosts, probed through a stand-in for SSH that returns a recorded RTX PRO 6000 host."""
    seen = []

    def probe(name, variables):
        seen.append((name, variables["ansible_host"]))
        if name == "gpu-b":
            return None, "Connection refused"
        return facts("rtx-pro-6000-q-580.105.06.txt"), None

    reps = remote.preflight_hosts(str(example_inv), probe_fn=probe)
    assert sorted(n for n, _ in seen) == ["gpu-a", "gpu-b"]
    assert [f.subject for f in reps["gpu-a"].errors] == ["GPU count"]
    [ssh] = reps["gpu-b"].errors
    assert ssh.subject == "ssh" and "Connection refused" in ssh.message and ssh.host == "gpu-b"


def test_host_decisions_turn_p2p_off_when_acs_stays_on():
    out = ("@@begin os\nubuntu 24.04 noble\nx86_64\n@@end os 0\n"
           "@@begin smi\n" + "".join(f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, 00000000:{i + 1:02x}:00.0, "
                                     "580.105.06, 97887, Enabled, 12.0\n" for i in range(8)) + "@@end smi 0\n"
           "@@begin lspci\n" + (DATA / "acs" / "mixed-nccl629.txt").read_text() + "@@end lspci 0\n"
           "@@begin cmdline\n" + (DATA / "cmdline" / "iommu-pt-rccl1129.txt").read_text() + "@@end cmdline 0\n"
           "@@begin docker\n/usr/bin/dockerd\n@@end docker 0\n")
    pcie = hv(specdeploy_hardware="rtx_pro_6000_pcie")
    d = report.host_decisions("rtx1", pcie, out)
    assert d["p2p_off_reason"].startswith("ACS redirect is on at 4 PCIe bridge(s)")
    assert d["nccl_env"] == {"NCCL_P2P_LEVEL": "SYS", "NCCL_P2P_DISABLE": "1"}
    assert d["blocking"] == [] and not d["install_driver"] and not d["ok"]
    on = report.host_decisions("rtx1", pcie, out, acs_disable=True)
    assert on["acs_disable"] and on["p2p_off_reason"] is None and on["blocking"] == []


def test_recorded_h200_host_end_to_end():
    """The gather sections of a real 2x H200 machine: facts, then the checks against the 8-GPU H200 profile."""
    def sec(name, path):
        return f"@@begin {name}\n" + (DATA / path).read_text() + f"@@end {name} 0\n"
    out = ("@@begin os\nubuntu 24.04 noble\nx86_64\n@@end os 0\n"
           + sec("smi", "smi/h200-2x-csv-580.159.04-recorded.txt")
           + sec("smi_table", "smi/h200-2x-580.159.04-recorded.txt")
           + sec("smi_q", "smi/h200-2x-q-580.159.04-recorded.txt")
           + sec("topo", "topo/h200-2x-nv18-recorded.txt")
           + "@@begin nvrm\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
           "@@end nvrm 0\n")
    f = report.facts_from_sections(report.split_sections(out))
    assert f.smi.cuda == "13.0" and f.open_modules is True and pcie_topo.nvlink_gaps(f.topo) == {}
    assert {g.fabric_state for g in f.smi.gpus} == {"Completed"}
    rep = report.check_host("h200", hv(specdeploy_hardware="h200_nvl8", specdeploy_engine_version="0.20.0"), f)
    assert [x.subject for x in rep.errors] == ["GPU count", "fabric manager"]  # 2 of 8 GPUs; no fabric manager seen
