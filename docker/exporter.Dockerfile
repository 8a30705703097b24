# The speculative-decoding exporter alone (no engine, no GPU).
FROM python:3.11-slim
COPY pyproject.toml README.md /opt/specdeploy-src/
COPY src /opt/specdeploy-src/src
COPY templates /opt/specdeploy-src/templates
RUN python3 -m pip install --no-cache-dir /opt/specdeploy-src
USER 65534:65534
EXPOSE 9450
LABEL org.opencontainers.image.title="specdeploy spec-decode exporter"
ENTRYPOINT ["specdeploy", "exporter"]
CMD ["--help"]
