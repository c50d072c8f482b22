"""Offline traffic analysis of RoarMQ's archive with PySpark: report and what-if.

Routing reuses broker/routing/ (one matching algorithm); `python -m roarmq.pipeline --help` is the entry.
"""
