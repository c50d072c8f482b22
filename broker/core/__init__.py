"""The broker's model: vhosts, exchanges, queues and what waits in them, messages, policies,
queue arguments, streams, users, and what of them survives a restart (persistence). It may
import routing, store, ops and the cluster seam, never a connection (tests/test_layers.py)."""
