# Sandbox only: stands in for the official engine image (vllm/vllm-openai, lmsysorg/sglang) on hosts that have
# neither GPUs nor Docker Hub. BASE_IMAGE is the sandbox rootfs imported into Docker; engine-src/ holds the
# engine's real Python sources (the vLLM sdist's tree), so docker/vllm.Dockerfile's patch step runs on them.
# The engine's entry points run specdeploy's engine simulator, which takes the same command line.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG ENGINE
ARG ENGINE_VERSION
COPY engine-src/ /usr/local/lib/python3.11/dist-packages/
# The single-quoted printf formats are the scripts' text: "$@" and $1 belong to the scripts, not to this RUN.
# hadolint ignore=SC2016
RUN printf '#!/bin/sh\nexec python3 -m specdeploy.cli simulate --engine vllm --version %s -- vllm "$@"\n' \
      "$ENGINE_VERSION" > /usr/local/bin/vllm \
 && printf '#!/bin/sh\nif [ "$1 $2" = "-m sglang.launch_server" ]; then\n  exec python3 -m specdeploy.cli simulate --engine sglang --version %s -- python "$@"\nfi\nexec python3 "$@"\n' \
      "$ENGINE_VERSION" > /usr/local/bin/python \
 && chmod 0755 /usr/local/bin/vllm /usr/local/bin/python
LABEL io.specdeploy.sandbox-standin="${ENGINE} ${ENGINE_VERSION}"
