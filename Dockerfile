# omnigate's container image: `docker build -t omnigate:0.1.0 .` (or `podman build --format docker …`: the
# OCI format has no HEALTHCHECK). Config and policy are mounted files (config/k8s/gateway.yaml mounts both);
# the defaults baked in at /etc/omnigate are the repository's examples, overridden by the mount.
#
#   docker run -p 8080:8080 -e OMNIGATE_ADMIN_TOKEN=… \
#     -v $PWD/config/gateway.yaml:/etc/omnigate/gateway.yaml:ro \
#     -v $PWD/policies:/etc/omnigate/policies:ro omnigate:0.1.0
#
# PYTHON_IMAGE: any Debian-based image with python3 ≥ 3.11 and its venv module (the default is Docker's).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/omnigate
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY omnigate ./omnigate
COPY loadtest ./loadtest
# EXTRAS: the optional features built in (otel: OpenTelemetry traces; "" for none)
ARG EXTRAS=otel
RUN /opt/omnigate/bin/pip install ".${EXTRAS:+[$EXTRAS]}" && /opt/omnigate/bin/pip uninstall -y pip

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/omnigate --create-home omnigate
COPY --from=build /opt/omnigate /opt/omnigate
COPY config/gateway.yaml /etc/omnigate/gateway.yaml
COPY policies/default.yaml /etc/omnigate/policies/default.yaml
# Listen on every interface inside the container; the SQLite store's var/ lands in the user's home.
ENV PATH=/opt/omnigate/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMNIGATE_LISTEN__HOST=0.0.0.0
WORKDIR /var/lib/omnigate
USER omnigate
EXPOSE 8080
# Ready: every pool has a backend up and no drain is under way (503 from the drain's first moment). The
# port: the config's 8080, or OMNIGATE_LISTEN__PORT when the run sets it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 CMD ["python3", "-c", \
    "import os, urllib.request; port = os.environ.get('OMNIGATE_LISTEN__PORT', '8080'); \
urllib.request.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=2)"]
# Exec form, no shell: the server is PID 1 and gets SIGTERM itself, which starts its drain
# (shutdown.drain_s). With `--workers N`, run the container with --init so that orphans are reaped.
STOPSIGNAL SIGTERM
ENTRYPOINT ["omnigate", "serve"]
CMD ["--config", "/etc/omnigate/gateway.yaml"]
