"""RabbitMQ's stream protocol (port 5552): connections, publishers and subscriptions over the
same vhosts, users and streams AMQP 0-9-1 serves. Imports ops/, core/, store/, the seam."""
