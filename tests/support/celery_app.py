"""A Celery app for tests/clients/test_celery.py: its worker runs in its own process as
`celery -A support.celery_app worker` (tests/ on PYTHONPATH), the test sends it tasks.

The broker's URL comes from ROARMQ_CELERY_BROKER and the file the tasks write to from
ROARMQ_CELERY_OUT, both in the environment, so the test and its worker share this one
module. `record` writes one JSON line when it runs: its name, its due time (the ETA the
sender computed from the countdown) and the time it ran, both read in the worker."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime

from celery import Celery

app = Celery("roarmq_test", broker=os.environ.get("ROARMQ_CELERY_BROKER", "amqp://"))
app.conf.update(
    # The worker's prefetch is concurrency x multiplier = 1, so every countdown task after
    # the first reaches it only through the basic.qos raise it sends for each (the
    # default multiplier, 4, would take three in without any raise). bench/celery_eta.py
    # sets another through ROARMQ_CELERY_PREFETCH_MULTIPLIER.
    worker_prefetch_multiplier=int(os.environ.get("ROARMQ_CELERY_PREFETCH_MULTIPLIER", "1")),
    # A broker that is not there fails the worker at once instead of being retried.
    broker_connection_retry_on_startup=False,
)
# ROARMQ_CELERY_QUEUE_TYPE=quorum: the task queue is a quorum queue, so Celery (5.5+) delays
# countdown and ETA tasks on the broker ("native delayed delivery": kombu's 28 levels of
# TTL'd quorum queues dead-lettering into each other at least once), not in the worker.
# Its task exchange must not be direct (Celery's rule: its delays are routed by topic).
if os.environ.get("ROARMQ_CELERY_QUEUE_TYPE"):
    app.conf.task_default_queue_type = os.environ["ROARMQ_CELERY_QUEUE_TYPE"]
    app.conf.task_default_exchange_type = "topic"


@app.task(bind=True, name="record")
def record(self, name: str) -> None:
    ran = time.time()
    eta = self.request.eta  # ISO 8601 with its zone, as the sender put it in the message
    due = None if eta is None else datetime.fromisoformat(str(eta)).timestamp()
    with open(os.environ["ROARMQ_CELERY_OUT"], "a") as out:
        out.write(json.dumps({"name": name, "due": due, "ran": ran}) + "\n")
