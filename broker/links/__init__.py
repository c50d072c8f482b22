"""Links to other brokers, the broker acting as an AMQP 0-9-1 client: the URIs they
connect to (`uri`), the client connection (`client`, on protocol/'s codec), the runtime
parameters of shovels and federation, checked as RabbitMQ checks them (`validation`,
`shovel_definition`, `federation_definition`), and a shovel at work (`shovel`)."""
