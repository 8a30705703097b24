# vLLM engine image: the official OpenAI server image at the pinned version, with the patch set that version
# needs (none from 0.18.0). Build (the engine_image role does this):
#   docker build -f docker/vllm.Dockerfile --build-arg VLLM_VERSION=0.16.0 \
#     --build-arg PATCH_SET=$(specdeploy engine image --engine vllm --version 0.16.0 --field patch_set) \
#     -t $(specdeploy engine image --engine vllm --version 0.16.0 --field tag) .
ARG VLLM_VERSION=0.16.0
FROM vllm/vllm-openai:v${VLLM_VERSION}
ARG VLLM_VERSION
ARG PATCH_SET=none

COPY pyproject.toml README.md /opt/specdeploy-src/
COPY src /opt/specdeploy-src/src
COPY templates /opt/specdeploy-src/templates
# specdeploy's patch and exporter commands need only these; --no-deps keeps the image's own pins intact.
RUN python3 -m pip install --no-cache-dir --no-deps /opt/specdeploy-src \
 && python3 -m pip install --no-cache-dir "typer>=0.12" "rich>=13" "prometheus-client>=0.20"

# Patch the installed vllm package in site-packages, then fail the build unless every patch is
# applied or already upstream.
RUN SITE="$(python3 -c 'import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))')" \
 && python3 -m specdeploy.cli patch apply --engine vllm --root "$SITE" \
 && python3 -m specdeploy.cli patch status --engine vllm --root "$SITE" --json > /opt/specdeploy-patch-status.json \
 && ! grep -q '"needed"\|"drift"' /opt/specdeploy-patch-status.json \
 && python3 -c "import vllm.model_executor.models.deepseek_v2, vllm.config.speculative"

LABEL org.opencontainers.image.title="specdeploy vLLM engine" \
      io.specdeploy.engine="vllm" \
      io.specdeploy.engine-version="${VLLM_VERSION}" \
      io.specdeploy.patch-set="${PATCH_SET}"

ENTRYPOINT ["vllm", "serve"]
