# RoarMQ broker image. tests/cli/test_config_cli.py (test_dockerfile_*) runs the same install,
# config and health-check steps, since Docker itself cannot run on the build machines.
#
# Two stages: the first builds a wheel with the message path compiled (setup.py; Cython and a
# C compiler, which the slim image lacks), the second installs that wheel without them.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY roarmq ./roarmq
COPY broker ./broker
COPY protocol ./protocol
COPY pipeline ./pipeline
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --user-group --home-dir /var/lib/roarmq roarmq \
    && mkdir -p /etc/roarmq /var/lib/roarmq \
    && chown roarmq:roarmq /var/lib/roarmq

COPY config.toml /etc/roarmq/config.toml
# Listen beyond loopback; everything stateful (messages, definitions, archive) under the one
# volume. guest stays loopback-only: set ROARMQ_DEFAULT_USER and ROARMQ_DEFAULT_PASS for a
# user that may log in over the network (as RABBITMQ_DEFAULT_USER/_PASS in RabbitMQ's image).
RUN sed -i -e 's|^bind = \["127.0.0.1", "::1"\]|bind = ["0.0.0.0"]|' \
           -e 's|^bind = "127.0.0.1"|bind = "0.0.0.0"|' \
           -e 's|^data_dir = "./data"|data_dir = "/var/lib/roarmq"|' \
           -e 's|^dir = "./data/archive"|dir = "/var/lib/roarmq/archive"|' /etc/roarmq/config.toml \
    && python -m roarmq --check-config /etc/roarmq/config.toml

USER roarmq
VOLUME ["/var/lib/roarmq"]
EXPOSE 5672 15672

# Healthy when the broker answers the AMQP handshake, not merely when the port accepts.
HEALTHCHECK --interval=30s --timeout=5s --start-period=5s --retries=3 \
    CMD ["roarmq", "ping", "--port", "5672"]

CMD ["python", "-m", "roarmq", "--config", "/etc/roarmq/config.toml"]
