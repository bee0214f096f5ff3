FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 10001 ctxproxy \
    && mkdir -p /data && chown ctxproxy /data
COPY policies ./policies
COPY config.example.yaml ./config.yaml
RUN sed -i 's|^data_dir: .*|data_dir: /data|; s|^policies_dir: .*|policies_dir: /app/policies|' config.yaml

USER ctxproxy
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2)"
# Inside a container the proxy must listen on all interfaces to be reachable through the port mapping.
CMD ["ctxproxy", "serve", "--config", "/app/config.yaml", "--host", "0.0.0.0"]
