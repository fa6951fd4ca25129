# syntax=docker/dockerfile:1
# The appliance in a container: one supervisor (PID 1) and its workers.
#
#   docker build -t appliance .
#   docker run -d --name appliance -p 9092:9092 --shm-size=1g \
#       -v appliance-data:/var/lib/appliance \
#       -e APPLIANCE_SERVER__ADVERTISED_LISTENER=broker.example.com:9092 appliance
#
# --shm-size: the rings and state pages live in /dev/shm, which Docker limits to 64 MiB by default;
#   each frontend -> writer pair has an 8 MiB produce ring (shm.produce_ring_bytes).
# APPLIANCE_SERVER__ADVERTISED_LISTENER: the HOST:PORT clients are told to connect to; left unset,
#   clients are sent 127.0.0.1:9092, which is right only for clients on the docker host itself.
# Any other key: -e APPLIANCE_<SECTION>__<KEY>=value, or mount a file and add
#   `run --config /etc/appliance/config.toml` after the image name.
# docker stop: give it more than supervisor.shutdown_timeout_ms (30 s): docker stop -t 40.
# Prometheus metrics: -e APPLIANCE_METRICS__LISTEN=0.0.0.0:9404 -p 9404:9404 (GET /metrics).
#
# TLS and SASL: mount the certificates read-only at /etc/appliance/tls and name them; the SCRAM
# credentials live in the data volume (/var/lib/appliance/credentials.json, written by the
# supervisor); add the first user before the first start with the same volume:
#   docker run --rm -i -v appliance-data:/var/lib/appliance appliance \
#       users add admin --mechanism SCRAM-SHA-512 --password-stdin < admin.password
#   docker run -d --name appliance -p 9093:9093 --shm-size=1g \
#       -v appliance-data:/var/lib/appliance -v /srv/appliance/tls:/etc/appliance/tls:ro \
#       -e APPLIANCE_SERVER__LISTEN= \
#       -e APPLIANCE_SERVER__LISTENERS=SASL_SSL://0.0.0.0:9093 \
#       -e APPLIANCE_SERVER__ADVERTISED_LISTENERS=SASL_SSL://broker.example.com:9093 \
#       -e APPLIANCE_TLS__CERT_FILE=/etc/appliance/tls/broker.pem \
#       -e APPLIANCE_TLS__KEY_FILE=/etc/appliance/tls/broker.key appliance
#   (APPLIANCE_SERVER__LISTEN= empties this image's default listen, which may not be set together
#   with listeners.) Renewed certificates: docker kill --signal=HUP appliance.

ARG PYTHON_VERSION=3.11

# ---- builder: a venv with the dependencies, then the project -----------------------------------
FROM python:${PYTHON_VERSION}-slim AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# A C compiler for the one extension (setup.py: the per-record walk of produced batches); the final
# stage copies the built venv, not the compiler.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && python -m venv /opt/appliance/.venv
WORKDIR /src
# Dependencies first, from pyproject.toml alone, so a source change does not reinstall them.
# (Every dependency has manylinux wheels for x86_64; kio needs glibc >= 2.28, which slim has.)
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && /opt/appliance/.venv/bin/pip install -r requirements.txt
COPY . .
RUN /opt/appliance/.venv/bin/pip install --no-deps . \
 && /opt/appliance/.venv/bin/python -c "import appliance.protocol._recwalk" \
 && /opt/appliance/.venv/bin/appliance check-config > /dev/null

# ---- final: python slim + the venv, as a non-root user -----------------------------------------
FROM python:${PYTHON_VERSION}-slim
ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/appliance/.venv/bin:$PATH \
    APPLIANCE_SERVER__LISTEN=0.0.0.0:9092 \
    APPLIANCE_SERVER__DATA_DIR=/var/lib/appliance
RUN groupadd --system --gid 10001 appliance \
 && useradd --system --uid 10001 --gid appliance --home-dir /var/lib/appliance \
        --shell /usr/sbin/nologin appliance \
 && install -d -o appliance -g appliance -m 0750 /var/lib/appliance
COPY --from=builder /opt/appliance/.venv /opt/appliance/.venv
USER appliance
WORKDIR /var/lib/appliance
VOLUME /var/lib/appliance
EXPOSE 9092
# The supervisor drains its workers on SIGTERM.
STOPSIGNAL SIGTERM
# TCP connect to the first listener's port (the socket is bound before the partition logs are
# recovered, so this says "the process is up", not "recovery is over": start-period covers
# recovery). A plain connect works on TLS and SASL listeners too.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, socket; l = os.environ.get('APPLIANCE_SERVER__LISTENERS') or 'X://' + (os.environ.get('APPLIANCE_SERVER__LISTEN') or '0.0.0.0:9092'); h, _, p = l.split(',')[0].split('://', 1)[1].rpartition(':'); socket.create_connection(('127.0.0.1' if h in ('', '0.0.0.0', '::', '[::]') else h.strip('[]'), int(p)), 3).close()"]
ENTRYPOINT ["/opt/appliance/.venv/bin/appliance"]
CMD ["run"]
