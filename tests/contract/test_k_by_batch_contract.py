"""Contract: the speculation length per load band the vLLM adapter renders means in each release's real source what
specdeploy means by it. Where the adapter says the release takes one, the engine's own schedule builder (its
SpeculativeConfig field and the scheduler's dense lookup, run from that release's source) gives every batch size up
to max_num_seqs the k of the band it falls in; where the adapter says it does not, the release has no such field."""
from __future__ import annotations

import importlib.util
import random
import re

import pytest

from specdeploy.engines import get_adapter, upstream
from specdeploy.engines.vllm import k_schedule
from specdeploy.hostvars.schema import KBand

from .spans import endpoints

pytestmark = pytest.mark.contract

FIELD = re.compile(r"^\s+num_speculative_tokens_per_batch_size\s*:", re.M)
SCHED = re.compile(r"build_dynamic_sd_schedule_lookup\(\s*[^)]*?vllm_max_batch_size\s*=\s*self\.scheduler_config"
                   r"\.max_num_seqs", re.S)


def _builder(root):
    path = root / "vllm" / "v1" / "spec_decode" / "dynamic" / "utils.py"
    spec = importlib.util.spec_from_file_location(f"_vllm_dynamic_sd_{abs(hash(str(root)))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the module is plain Python: no vLLM import behind it
    return mod.build_dynamic_sd_schedule_lookup


def _generated(rng: random.Random, k_max: int) -> list[KBand]:
    starts = sorted({1, *rng.sample(range(2, 300), rng.randint(0, 4))})
    return [KBand(from_batch=s, k=rng.randint(0, k_max)) for s in starts]


@pytest.mark.parametrize("version", endpoints("vllm"))
def test_the_rendered_schedule_gives_each_batch_size_its_bands_k(version):
    root = upstream.source("vllm", version)
    has_field = bool(FIELD.search((root / "vllm" / "config" / "speculative.py").read_text()))
    adapter = get_adapter("vllm", version)
    assert adapter.takes_k_by_batch() == has_field, version
    if not has_field:
        return
    sched = (root / "vllm" / "v1" / "core" / "sched" / "scheduler.py").read_text()
    assert SCHED.search(sched), f"vLLM {version}: the scheduler no longer sizes the lookup by max_num_seqs"
    build = _builder(root)
    rng = random.Random(version)
    for _ in range(200):
        k = rng.randint(1, 6)
        bands = _generated(rng, k)
        max_seqs = rng.choice([1, 4, 16, 64, 256, 512])
        dense = build(k_schedule(bands), max_seqs, k)
        for batch in range(1, max_seqs + 1):
            want = [b.k for b in bands if b.from_batch <= batch][-1]
            assert dense[batch] == want, (version, bands, max_seqs, batch)


def _sglang_releases() -> list[str]:
    """The ends of the adaptive span and the release just before it (where the slots must be absent)."""
    from packaging.version import Version

    from specdeploy.engines import get
    from specdeploy.engines.sglang import CAPABILITIES
    versions = sorted(get("sglang").versions, key=Version)
    since = versions.index(CAPABILITIES["adaptive_spec_per_batch"].since)
    return sorted({versions[since - 1], *endpoints("sglang", [CAPABILITIES["adaptive_spec_per_batch"]])}, key=Version)


@pytest.mark.parametrize("version", _sglang_releases())
def test_sglang_per_batch_steps_exist_only_as_adaptive_slots_which_are_refused(version):
    """SGLang has no fixed speculation length per batch size; from the adaptive span on, its adaptive speculation
    reads batch-size slots of candidate steps. The adapter knows where those slots are and still renders none."""
    root = upstream.source("sglang", version) / "sglang" / "srt"
    params = root / "speculative" / "adaptive_spec_params.py"
    slots = params.exists() and "key.isdigit()" in params.read_text()
    sg = get_adapter("sglang", version)
    assert sg.has("adaptive_spec_per_batch") == slots, version
    assert sg.takes_k_by_batch() is False
