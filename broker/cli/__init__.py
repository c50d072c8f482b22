"""Commands beside `roarmq serve` (broker/__main__.py): `roarmq ctl`, rabbitmqctl's everyday
commands over the HTTP API, and `roarmq cluster-demo`. They may import anything."""
