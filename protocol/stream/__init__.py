"""RabbitMQ's stream protocol (port 5552), sans-IO: its frames (`codec.py`) and the AMQP 1.0
message format its messages are written in (`amqp10.py`). Imports nothing of the broker."""
