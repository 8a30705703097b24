"""Static checks of the Dockerfiles (no Docker engine runs on these machines)."""
import re

from specdeploy.images import image_tag
from specdeploy.patches import patch_set_id


def parse(path):
    """Dockerfile -> list of (instruction, argument) with continuation lines joined."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            ins, _, arg = buf.strip().partition(" ")
            out.append((ins.upper(), arg.strip()))
            buf = ""
    return out


def test_vllm_dockerfile_pins_patches_and_labels(repo):
    steps = parse(repo / "docker/vllm.Dockerfile")
    args = [a for i, a in steps if i == "ARG"]
    assert "VLLM_VERSION=0.16.0" in args
    frm = [a for i, a in steps if i == "FROM"]
    assert frm == ["vllm/vllm-openai:v${VLLM_VERSION}"]
    runs = " ".join(a for i, a in steps if i == "RUN")
    assert "patch apply --engine vllm --root \"$SITE\"" in runs
    assert "grep -q '\"needed\"\\|\"drift\"'" in runs  # the build fails on an incomplete patch set
    labels = " ".join(a for i, a in steps if i == "LABEL")
    for key in ("io.specdeploy.engine=\"vllm\"", "io.specdeploy.engine-version=\"${VLLM_VERSION}\"",
                "io.specdeploy.patch-set=\"${PATCH_SET}\""):
        assert key in labels
    # ARG before FROM is re-declared after it so LABEL can use it
    from_idx = next(k for k, (i, _) in enumerate(steps) if i == "FROM")
    assert any(i == "ARG" and a == "VLLM_VERSION" for i, a in steps[from_idx:])


def test_sglang_and_exporter_dockerfiles(repo):
    s = parse(repo / "docker/sglang.Dockerfile")
    assert [a for i, a in s if i == "FROM"] == ["lmsysorg/sglang:v${SGLANG_VERSION}"]
    assert "SGLANG_VERSION=0.5.23" in [a for i, a in s if i == "ARG"]
    assert any("io.specdeploy.engine-version" in a for i, a in s if i == "LABEL")
    e = parse(repo / "docker/exporter.Dockerfile")
    assert ("ENTRYPOINT", '["specdeploy", "exporter"]') in e
    assert any(i == "USER" for i, _ in e)


def test_image_tags_carry_version_and_patch_hash():
    t16 = image_tag("vllm", "0.16.0")
    assert re.fullmatch(r"specdeploy/vllm:0\.16\.0-p[0-9a-f]{10}", t16)
    assert image_tag("vllm", "0.17.1").endswith(patch_set_id("vllm", "0.17.1"))
    assert image_tag("vllm", "0.18.0") == "specdeploy/vllm:0.18.0-none"
    assert image_tag("vllm", "0.16.0", "none") == "specdeploy/vllm:0.16.0-none"
