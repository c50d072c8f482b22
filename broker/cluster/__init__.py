"""The cluster: etcd client, leases with fencing, membership, vhost leadership.

Imported only when `[cluster]` is configured; the single-node broker never loads it.
"""
