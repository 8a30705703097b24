"""The output rule lets specdeploy write its own state directory on a host (the drafter role's
`drafter convert --out /var/lib/specdeploy/drafter/store/...`), and nothing else under /var but /var/tmp."""
from specdeploy.values.hostpaths import host_path
from specdeploy.values.outputs import forbidden


def test_the_state_directory_is_specdeploys_own():
    assert forbidden(host_path("drafter_conversion", "vllm", "0.32.0", "abc")) is None
    for other in ("/var/lib/dpkg/x", "/var/lib/specdeploy-other/x", "/var/log/x", "/var"):
        assert "system directory /var" in forbidden(other)
