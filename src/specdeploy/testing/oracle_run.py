"""Runs the real engine over oracle cases in one process; run by the real-engine venv's Python, never imported by
the controller (``specdeploy.testing.oracle`` drives it). stdin: ``{"target", "dtype", "k", "prompts",
"max_tokens", "cases": [{"id", "drafter"}]}``; one line ``SPECDEPLOY-ORACLE {json}`` per case on stdout.

Each case is a fresh engine (``LLM`` with the EAGLE-3 speculative config, the engine core in this process),
greedy generation of every prompt, and the engine's own speculative-decoding counters (drafts, draft tokens,
accepted tokens per draft position) from ``LLM.get_metrics()``; the engine is then torn down. A case whose engine
does not start or serve reports the error and ends the process (the engine's state after a failed start is not
trusted): the controller starts a new one for the cases left.

vLLM 0.16.0's CPU model runner refuses speculative decoding (``assert self.speculative_config is None``); its GPU
runner's EAGLE code runs on the CPU once four things are given to it (``enable_016``): the runner without that
assertion, loading the drafter and setting the target's aux layers as the GPU runner's ``load_model`` does (with
the runner's own ``_get_eagle3_aux_layers_from_config``), its three CUDA-stream copies done in place, and torch
versions of the Triton kernels of the greedy path (rejection sampling, EAGLE's padded input preparation). Which
aux layers are captured, what the drafter is fed and how its tokens are verified stay the engine's own code.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

MARK = "SPECDEPLOY-ORACLE "


class _Launch:
    """``kernel[grid](...)`` for a function: the grid is ignored (the loops run over every request)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def _greedy(out, cu, draft, argmax, bonus, is_greedy, max_spec_len):
    start = 0
    for r in range(out.shape[0]):
        end = int(cu[r])
        if is_greedy is None or bool(is_greedy[r]):
            rejected = False
            for p in range(end - start):
                out[r, p] = argmax[start + p]
                if int(draft[start + p]) != int(argmax[start + p]):
                    rejected = True
                    break
            if not rejected:
                out[r, end - start] = bonus[r]
        start = end


def _prepare_inputs_padded(cu, valid, qsl, out_idx, out_rejected, num_reqs):
    for r in range(num_reqs):
        n = int(cu[r]) - (int(cu[r - 1]) if r else 0)
        rejected = n + 1 - int(valid[r]) if n > 0 else 0
        out_idx[r] = int(qsl[r + 1]) - 1 - rejected
        out_rejected[r] = rejected


def _prepare_next_padded(sampled, discard, backup, out_next, out_valid, vocab, per_req, num_reqs, stride,
                         BLOCK_SIZE_TOKENS=None):
    for r in range(num_reqs):
        if bool(discard[r]):
            out_next[r], out_valid[r] = backup[r], 0
            continue
        row = sampled[r, :per_req]
        ok = (row != -1) & (row < vocab)
        n = int(ok.sum())
        out_next[r] = row[ok.nonzero()[-1, 0]] if n else backup[r]
        out_valid[r] = n


def enable_016():
    import types

    import torch
    import vllm.v1.sample.rejection_sampler as rs
    import vllm.v1.spec_decode.eagle as eagle
    import vllm.v1.worker.cpu_model_runner as cmr
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    rs.rejection_greedy_sample_kernel = _Launch(_greedy)
    eagle.eagle_prepare_inputs_padded_kernel = _Launch(_prepare_inputs_padded)
    eagle.eagle_prepare_next_token_padded_kernel = _Launch(_prepare_next_padded)
    eagle.triton = types.SimpleNamespace(next_power_of_2=lambda n: 1 << max(0, int(n) - 1).bit_length(),
                                         cdiv=lambda a, b: -(-a // b))
    runner = cmr.CPUModelRunner
    load = runner.load_model

    def __init__(self, vllm_config, device):
        with cmr._torch_cuda_wrapper():
            GPUModelRunner.__init__(self, vllm_config, device)
        self.use_cuda_graph = False
        self.cascade_attn_enabled = False
        self._postprocess_tensors()

    def load_model(self, *a, **k):
        load(self, *a, **k)
        if hasattr(self, "drafter"):
            self.drafter.load_model(self.model)
        if self.use_aux_hidden_state_outputs:
            if not supports_eagle3(self.get_model()):
                raise RuntimeError("Model does not support EAGLE3 interface but aux_hidden_state_outputs was "
                                   "requested")
            aux = self._get_eagle3_aux_layers_from_config() or self.model.get_eagle3_aux_hidden_state_layers()
            self.model.set_aux_hidden_state_layers(aux)

    def copy_draft(self, scheduler_output, zeros_only=False):
        if self.use_async_scheduling and not (scheduler_output.has_structured_output_requests
                                              or self.input_batch.sampling_metadata.output_token_ids):
            return
        self._draft_token_req_ids = self.input_batch.req_ids.copy()
        d = self._draft_token_ids
        if not torch.is_tensor(d):
            return
        if zeros_only:
            self.draft_token_ids_cpu[:d.shape[0]] = 0
        else:
            self.draft_token_ids_cpu[:d.shape[0]].copy_(d)

    def get_draft(self):
        if isinstance(self._draft_token_ids, list):
            return self._draft_token_ids, self.input_batch.req_ids
        ids = self._draft_token_req_ids
        if ids is None:
            return [], []
        return self.draft_token_ids_cpu[: len(ids)].tolist(), ids

    def copy_valid(self, next_token_ids, counts):
        if self.valid_sampled_token_count_event is None:
            return
        self.valid_sampled_token_count_cpu[: counts.shape[0]].copy_(counts)
        self.input_batch.prev_sampled_token_ids = next_token_ids.unsqueeze(1)

    runner.__init__ = __init__
    runner.load_model = load_model
    runner._copy_draft_token_ids_to_cpu = copy_draft
    runner._get_draft_token_ids_cpu = get_draft
    runner._copy_valid_sampled_token_count = copy_valid


def _metrics(llm) -> dict:
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            out["drafts"] += int(m.value)
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] += int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = [int(x) for x in m.values]
            out["per_pos"] = [a + b for a, b in zip(vals, out["per_pos"] + [0] * len(vals))]
    return out


def _close(llm):
    """Tear the engine down: its core, the distributed state, the memory (a deleted LLM keeps its KV cache)."""
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 (an engine that failed half-way has less to shut down)
        pass
    try:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel
        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception:  # noqa: BLE001
        pass


def _rss_mib() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def main():
    job = json.loads(sys.stdin.read())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm
    from vllm import LLM, SamplingParams
    if vllm.__version__.startswith("0.16."):
        enable_016()
    params = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
    for case in job["cases"]:
        t0 = time.time()
        res = {"id": case["id"], "version": vllm.__version__}
        llm = None
        try:
            llm = LLM(model=job["target"], dtype=job["dtype"], max_model_len=512, enforce_eager=True,
                      max_num_seqs=len(prompts), seed=0, disable_log_stats=False,
                      speculative_config={"method": "eagle3", "model": case["drafter"],
                                          "num_speculative_tokens": job["k"]})
            t1 = time.time()
            outs = llm.generate(prompts, params, use_tqdm=False)
            res.update(_metrics(llm), ok=True, start_s=round(t1 - t0, 2), run_s=round(time.time() - t1, 2),
                       outputs=[list(o.outputs[0].token_ids) for o in outs])
        except Exception as exc:  # the engine's own refusal: reported, and this process ends
            res.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000],
                       where="".join(traceback.format_exc().splitlines(True)[-6:])[-1500:])
        if llm is not None:
            _close(llm)
        del llm
        gc.collect()
        res["rss_mib"] = _rss_mib()
        print(MARK + json.dumps(res), flush=True)
        if not res["ok"] or res["rss_mib"] > job.get("max_rss_mib", 6144):
            sys.exit(3 if not res["ok"] else 0)


if __name__ == "__main__":
    main()
