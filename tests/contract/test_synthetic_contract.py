"""Contract: the synthetic rejection method (engines/synthetic.py) as each release's source defines it, for every
release the adapters render it for: the keys or environment variables that switch it on, how the release turns an
acceptance length into per-position rates (the release's own function, run here), its validation, the platforms
whose builds refuse it and the text they print, and the releases before the span that lack it."""
from __future__ import annotations

import ast
import re

import pytest

from specdeploy.engines import get, get_adapter, synthetic, upstream
from specdeploy.hostvars.schema import validate_host

from .spans import endpoints
from .upstream_facts import vllm_spec_keys

pytestmark = pytest.mark.contract

VLLM = get("vllm").synthetic_facts
SGLANG = get("sglang").synthetic_facts
GRID = [(al, k) for k in (1, 2, 3, 4, 7) for al in (1.0, 1.25, 1.5, 2.0, 2.4, 2.999, 3.0, k + 1.0) if al <= k + 1]


def _vllm_versions() -> list[str]:
    spans = [VLLM.span] + [s for s, _ in VLLM.settings] + [r.span for r in VLLM.refusals]
    return sorted(set(endpoints("vllm", spans)) | {p.version for p in get("vllm").pins})


def _speculative(root) -> str:
    return (root / "vllm" / "config" / "speculative.py").read_text()


def _static(src: str, cls: str, name: str):
    """A static method of ``cls`` in ``src``, compiled alone (it is plain Python)."""
    tree = ast.parse(src)
    klass = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    ns: dict = {}
    exec(compile(ast.Module([fn], []), f"<{cls}.{name}>", "exec"), ns)  # noqa: S102 - the release's own code
    return ns[name]


@pytest.mark.parametrize("version", _vllm_versions())
def test_vllm_takes_the_keys_specdeploy_renders_and_resolves_the_length_as_specdeploy_does(version):
    root = upstream.source("vllm", version)
    src = _speculative(root)
    method = re.search(r"RejectionSampleMethod = Literal\[([^\]]*)\]", src)
    assert method and '"synthetic"' in method.group(1)
    a = get_adapter("vllm", version)
    run = synthetic.plan(a, 2.5, 3)
    keys = run.overrides["specdeploy_spec_config_extra"]
    assert keys == {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}
    assert set(keys) | {"synthetic_acceptance_rates"} <= vllm_spec_keys(root)
    # the release's own resolution of a length into per-position unconditional rates
    to_rates = _static(src, "SpeculativeConfig", "_acceptance_length_to_rates")
    for al, k in GRID:
        assert to_rates(al, k) == pytest.approx(synthetic.rates(al, k)), (al, k)
    resolve = _static(src, "SpeculativeConfig", "_resolve_synthetic_acceptance_rates")
    ns = resolve.__globals__
    ns["SpeculativeConfig"] = type("SpeculativeConfig", (), {"_acceptance_length_to_rates": staticmethod(to_rates)})
    assert resolve(3, None, 2.5) == synthetic.rates(2.5, 3)
    for bad in (0.99, 4.01):  # a length outside [1, k + 1] is refused, as synthetic.rates refuses it
        with pytest.raises(ValueError, match="synthetic_acceptance_length must be in"):
            resolve(3, None, bad)
        with pytest.raises(ValueError):
            synthetic.rates(bad, 3)
    with pytest.raises(ValueError, match="exactly one of"):
        resolve(3, [1.0, 0.5, 0.0], 2.5)
    # the config's validator resolves the length only for the synthetic method and refuses the keys with any other
    verify = ast.unparse(next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)
                              and n.name == "_verify_args"))
    assert "if self.rejection_sample_method == 'synthetic':" in verify
    assert "self._resolve_synthetic_acceptance_rates(self.num_speculative_tokens" in verify.replace("\n", "")
    assert "are only valid with rejection_sample_method='synthetic'" in verify
    # what the adapter renders for a host passes the adapter's own key check for this release
    hv = validate_host("contract", {
        "specdeploy_engine": "vllm", "specdeploy_engine_version": version, "specdeploy_hardware": "h200_nvl8",
        "specdeploy_model_path": "/models/t", "specdeploy_spec_enabled": True, "specdeploy_spec_method": "eagle3",
        "specdeploy_drafter_path": "/models/d", "specdeploy_spec_num_tokens": 3, **run.overrides})
    assert a.spec_config(hv, "/models/d")["synthetic_acceptance_length"] == 2.5
    assert a.spec_config_problems(hv, "contract") == []
    # the GPU rejection kernels run it (greedy and random paths)
    sampler = (root / "vllm" / "v1" / "sample" / "rejection_sampler.py").read_text()
    assert len(re.findall(r"SYNTHETIC_MODE=synthetic_(?:mode|conditional_rates is not None)", sampler)) >= 2


@pytest.mark.parametrize("version", _vllm_versions())
def test_vllm_cpu_builds_refuse_it_with_the_recorded_text(version):
    cpu = upstream.source("vllm", version) / "vllm" / "utils" / "cpu_triton_utils.py"
    text = cpu.read_text() if cpu.is_file() else ""
    for r in VLLM.refusals:
        assert r.platform == "cpu" and r.where == "vllm/utils/cpu_triton_utils.py"
        if r.span.contains(version):
            for fn in ("_rejection_greedy_sample_kernel_impl", "_rejection_random_sample_kernel_impl"):
                body = text.split(f"def {fn}(", 1)[1].split("\ndef ", 1)[0]
                assert f'assert not SYNTHETIC_MODE, "{r.text}"' in body, fn
        else:
            assert r.text not in text


def test_vllm_before_the_span_has_no_synthetic_length():
    before = "0.19.0"
    assert not VLLM.span.contains(before)
    src = _speculative(upstream.source("vllm", before))
    assert "synthetic_acceptance_length" not in src and "synthetic_acceptance_rates" not in src
    assert synthetic.unavailable(get_adapter("vllm", before)).endswith("(it takes one from vLLM "
                                                                                        "0.20.0)")


def _sglang_versions() -> list[str]:
    spans = [SGLANG.span] + [s for s, _ in SGLANG.settings]
    return sorted(set(endpoints("sglang", spans)) | set(SGLANG.read))


@pytest.mark.parametrize("version", _sglang_versions())
def test_sglang_reads_the_environment_specdeploy_sets(version):
    root = upstream.source("sglang", version)
    spec = root / "sglang" / "srt" / "speculative"
    run = synthetic.plan(get_adapter("sglang", version), 2.5, 3)
    env = run.overrides["specdeploy_engine_env"]
    length, method = list(env)
    assert env[method] == "match-expected" and env[length] == "2.5"
    sources = "\n".join(f.read_text() for f in spec.glob("*.py"))
    environ = (root / "sglang" / "srt" / "environ.py")
    environ = environ.read_text() if environ.is_file() else ""
    if length.startswith("SGLANG_"):
        assert re.search(rf"\b{length} = EnvFloat\(-1\)", environ)
        assert re.search(rf"\b{method} = EnvStr\(", environ)
        assert f"envs.{length}.get()" in sources and f"envs.{method}.get()" in sources
    else:
        assert f'os.environ.get("{length}")' in sources
        assert re.search(rf'os\.environ\.get\("{method}"', sources)
    # the draw: match-expected gives floor or ceil of the length with it as the expectation, and the accepted
    # indices are the first `length` positions (the bonus token included)
    m = re.search(r'== "match-expected":(.*?)else:\s*\n\s*raise ValueError', sources, re.S)
    assert m and "lower = int(" in m.group(1) and "weight_upper =" in m.group(1), version
    assert re.search(r"sim_accept_index\[:, :simulate_acc_len\]", sources)


def test_sglang_switches_to_its_prefixed_names_at_the_recorded_release():
    (old_span, old), (new_span, new) = SGLANG.settings
    assert old_span.until == new_span.since == "0.5.3"
    last_old = upstream.source("sglang", "0.5.2") / "sglang" / "srt" / "speculative" / "eagle_utils.py"
    assert 'os.environ.get("SIMULATE_ACC_LEN")' in last_old.read_text()
    first_new = upstream.source("sglang", "0.5.3") / "sglang" / "srt" / "environ.py"
    assert "SGLANG_SIMULATE_ACC_LEN" in first_new.read_text()
    assert set(old) == {"SIMULATE_ACC_LEN", "SIMULATE_ACC_METHOD"}
    assert set(new) == {"SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD"}
