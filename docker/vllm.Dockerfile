# vLLM engine image: the official OpenAI server image at the pinned version, with the patch set that version
# needs (none from 0.18.0). The engine_image role builds it on the host from a context holding this directory
# and the specdeploy wheelhouse (wheelhouse/); `specdeploy engine image --engine vllm --version 0.16.0` prints
# the tag and the build arguments. BASE_IMAGE is the official image in production; the sandbox passes a local
# stand-in (docker/sandbox-engine.Dockerfile) because it cannot reach Docker Hub.
ARG VLLM_VERSION=0.16.0
ARG BASE_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}
FROM ${BASE_IMAGE}
ARG VLLM_VERSION
ARG PATCH_SET=none
# OFFLINE=1: install from the wheelhouse alone (a build host without a package index, such as the sandbox).
ARG OFFLINE=0
# IMPORT_CHECK=1: import the patched modules (needs the image's torch); 0 byte-compiles them only.
ARG IMPORT_CHECK=1
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

# Patch the installed vllm package in site-packages, then fail the build unless every patch is
# applied or already upstream.
RUN SITE="$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("vllm").submodule_search_locations[0]))')" \
 && python3 -m specdeploy.cli patch apply --engine vllm --root "$SITE" \
 && python3 -m specdeploy.cli patch status --engine vllm --root "$SITE" --json > /opt/specdeploy-patch-status.json \
 && ! grep -q '"needed"\|"drift"' /opt/specdeploy-patch-status.json \
 && python3 -m compileall -q "$SITE/vllm/model_executor/models" "$SITE/vllm/config" "$SITE/vllm/v1/spec_decode" \
 && if [ "$IMPORT_CHECK" = 1 ]; then \
      python3 -c "import vllm.model_executor.models.deepseek_v2, vllm.config.speculative"; fi

LABEL org.opencontainers.image.title="specdeploy vLLM engine" \
      io.specdeploy.engine="vllm" \
      io.specdeploy.engine-version="${VLLM_VERSION}" \
      io.specdeploy.patch-set="${PATCH_SET}" \
      io.specdeploy.source="${SPECDEPLOY_SOURCE}"

ENTRYPOINT ["vllm", "serve"]
