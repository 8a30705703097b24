"""A request the engine refused with a client error is not why the engine ended (lines of the real vLLM 0.32.0 CPU
build: a chat completion for a model it does not serve, then SIGTERM)."""
from __future__ import annotations

from specdeploy.triage import triage_lines

REFUSED = ("(APIServer pid=21177) ERROR 12-02 00:38:40 [serving.py:274] Error with model error=ErrorInfo(message='The "
           "model `nope` does not exist. Valid aliases: tiny.', type='NotFoundError', param='model', code=404)")
STOP = [
    'INFO:     127.0.0.1:52384 - "POST /v1/chat/completions HTTP/1.1" 404 Not Found',
    "(APIServer pid=21177) INFO 12-02 00:38:42 [launcher.py:254] [shutdown] API server: shutdown triggered",
    "(EngineCore pid=21244) INFO 12-02 00:38:42 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM",
    "INFO:     Shutting down",
    "INFO:     Waiting for application shutdown.",
    "INFO:     Application shutdown complete.",
]


def test_a_refused_request_before_a_stop_is_a_clean_shutdown():
    res = triage_lines(["INFO:     Application startup complete.", REFUSED] + STOP)
    assert res.outcome == "clean-shutdown" and res.root_cause is None


def test_a_server_error_on_a_request_still_counts():
    five = REFUSED.replace("code=404", "code=500").replace("NotFoundError", "InternalServerError")
    res = triage_lines(["INFO:     Application startup complete.", five] + STOP)
    assert res.outcome == "failed" and "code=500" in res.root_cause


def test_vllm_kernels_that_did_not_load_are_named():
    """The real vLLM 0.32 CPU build on a host without libnuma: torch.ops._C lacks every op, the first call fails."""
    log = [
        "(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010] EngineCore failed to start.",
        "(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010] Traceback (most recent call last):",
        '(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010]   File "/v/lib/python3.11/site-packages/vllm/'
        'platforms/cpu.py", line 390, in init_memory_env',
        "(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010]     torch.ops._C.init_cpu_memory_env()",
        '(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010]   File "/v/lib/python3.11/site-packages/torch/'
        '_ops.py", line 1392, in __getattr__',
        "(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010]     raise AttributeError(",
        "(EngineCore pid=81) ERROR 12-02 02:30:11 [core.py:1010] AttributeError: '_OpNamespace' '_C' object has no "
        "attribute 'init_cpu_memory_env'",
    ]
    res = triage_lines(log)
    assert res.outcome == "failed" and res.signature == "vllm-kernels-not-loaded", res
    assert res.confidence == "medium" and "libnuma" in res.fix
