# Build a wheel (it carries policies/ and config.example.yaml as package data), then install only it.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md config.example.yaml ./
COPY policies ./policies
COPY proxy ./proxy
RUN pip wheel --no-cache-dir --no-deps -w /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True

COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --create-home --uid 10001 ctxproxy \
    && mkdir -p /data && chown ctxproxy /data
# config.yaml and policies/ from the installed package; mount your own over either to change them.
WORKDIR /app
RUN ctxproxy init /app && sed -i 's|^data_dir: .*|data_dir: /data|' config.yaml

USER ctxproxy
VOLUME ["/data"]
EXPOSE 8787
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2)"
# Inside a container the proxy must listen on all interfaces to be reachable through the port mapping.
CMD ["ctxproxy", "serve", "--config", "/app/config.yaml", "--host", "0.0.0.0"]
