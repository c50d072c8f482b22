# RoarMQ broker image. tests/broker/test_packaging.py runs the same install and
# --check-config steps, since Docker itself cannot run on the build machines.
FROM python:3.11-slim

WORKDIR /opt/roarmq
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY protocol ./protocol
COPY pipeline ./pipeline
RUN pip install --no-cache-dir . \
    && mkdir -p /etc/roarmq /var/lib/roarmq

COPY config.toml /etc/roarmq/config.toml
# In a container the broker must listen beyond loopback and keep data on a volume;
# like the official RabbitMQ image, guest may log in from outside the container.
RUN sed -i -e 's|^bind = \["127.0.0.1", "::1"\]|bind = ["0.0.0.0"]|' \
           -e 's|^loopback_only = true|loopback_only = false|' \
           -e 's|^bind = "127.0.0.1"|bind = "0.0.0.0"|' \
           -e 's|^data_dir = "./data"|data_dir = "/var/lib/roarmq"|' /etc/roarmq/config.toml \
    && python -m broker --check-config /etc/roarmq/config.toml

VOLUME ["/var/lib/roarmq"]
EXPOSE 5672 15672

HEALTHCHECK --interval=30s --timeout=5s --start-period=5s --retries=3 \
    CMD python -c "import socket; socket.create_connection(('127.0.0.1', 5672), 3).close()"

CMD ["python", "-m", "broker", "--config", "/etc/roarmq/config.toml"]
