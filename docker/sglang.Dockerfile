# SGLang engine image at the pinned version. No SGLang patches are needed for 0.5.10+ (Kimi-K2.5 EAGLE-3
# support is upstream); the patch step still runs so the image records its status like the vLLM one.
ARG SGLANG_VERSION=0.5.23
FROM lmsysorg/sglang:v${SGLANG_VERSION}
ARG SGLANG_VERSION
ARG PATCH_SET=none

COPY pyproject.toml README.md /opt/specdeploy-src/
COPY src /opt/specdeploy-src/src
COPY templates /opt/specdeploy-src/templates
RUN python3 -m pip install --no-cache-dir --no-deps /opt/specdeploy-src \
 && python3 -m pip install --no-cache-dir "typer>=0.12" "rich>=13" "prometheus-client>=0.20"

RUN SITE="$(python3 -c 'import os, sglang; print(os.path.dirname(os.path.dirname(sglang.__file__)))')" \
 && python3 -m specdeploy.cli patch apply --engine sglang --root "$SITE"

LABEL org.opencontainers.image.title="specdeploy SGLang engine" \
      io.specdeploy.engine="sglang" \
      io.specdeploy.engine-version="${SGLANG_VERSION}" \
      io.specdeploy.patch-set="${PATCH_SET}"

ENTRYPOINT ["python3", "-m", "sglang.launch_server"]
