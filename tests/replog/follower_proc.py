"""A replication follower in its own process, for the kill -9 test.

    python follower_proc.py HOST PORT DATA_DIR NODE VHOST EPOCH

Prints "ready" once connected, then runs until killed."""

from __future__ import annotations

import asyncio
import sys

from roarmq.broker.replog.records import SegmentRecordStore
from roarmq.broker.replog.replication import ReplicationFollower


async def main(host: str, port: int, data_dir: str, node: str, vhost: str, epoch: int) -> None:
    store = SegmentRecordStore(data_dir)
    follower = ReplicationFollower(vhost, (host, port), node, store, epoch=epoch)
    follower.start()
    await follower.connected.wait()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    host, port, data_dir, node, vhost, epoch = sys.argv[1:7]
    asyncio.run(main(host, int(port), data_dir, node, vhost, int(epoch)))
