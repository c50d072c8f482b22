"""The replicated log: a leader streams (offset, payload) records to followers, which append,
fsync and ack; epochs, the in-sync set's arithmetic and diverged tails (KIP-101/279). It
knows nothing of vhosts, etcd or AMQP: it imports only the segment log, the record tags and
ops/tasks.py (tests/test_layers.py); broker/cluster/ drives it."""
