# SGLang engine image at the pinned version. No SGLang patches are needed for 0.5.10+ (Kimi-K2.5 EAGLE-3
# support is upstream); the patch step still runs so the image records its status like the vLLM one.
# Built like docker/vllm.Dockerfile (same context and build arguments).
ARG SGLANG_VERSION=0.5.23
ARG BASE_IMAGE=lmsysorg/sglang:v${SGLANG_VERSION}
FROM ${BASE_IMAGE}
ARG SGLANG_VERSION
ARG PATCH_SET=none
ARG OFFLINE=0
ARG SPECDEPLOY_SOURCE=unknown
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1

COPY wheelhouse /opt/specdeploy-wheels
# specdeploy's own wheel with --no-deps keeps the image's pins intact; its patch and exporter commands need only
# the wheelhouse's requirements-image.txt (typer, rich, prometheus-client). Offline, the wheelhouse's host
# requirements are installed from the wheelhouse alone instead.
RUN python3 -m pip install -q --no-cache-dir --no-index --no-deps /opt/specdeploy-wheels/specdeploy-*.whl \
 && if [ "$OFFLINE" = 1 ]; then \
      python3 -m pip install -q --no-cache-dir --no-index --find-links /opt/specdeploy-wheels \
        -r /opt/specdeploy-wheels/requirements-host.txt; \
    else \
      python3 -m pip install -q --no-cache-dir --find-links /opt/specdeploy-wheels \
        -r /opt/specdeploy-wheels/requirements-image.txt; \
    fi

RUN SITE="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("sglang").submodule_search_locations[0]))')" \
 && python3 -m specdeploy.cli patch apply --engine sglang --root "$SITE"

LABEL org.opencontainers.image.title="specdeploy SGLang engine" \
      io.specdeploy.engine="sglang" \
      io.specdeploy.engine-version="${SGLANG_VERSION}" \
      io.specdeploy.patch-set="${PATCH_SET}" \
      io.specdeploy.source="${SPECDEPLOY_SOURCE}"

ENTRYPOINT ["python3", "-m", "sglang.launch_server"]
