"""A coordinator in its own process, for the freeze (SIGSTOP) test: follows one vhost and
prints a JSON line per event (ready, won, lost, fenced, may_confirm answers).

    python node_proc.py ETCD_URL NODE VHOST TTL
"""

from __future__ import annotations

import asyncio
import json
import sys

from roarmq.broker.cluster.coordination import Coordinator
from roarmq.broker.cluster.etcd import EtcdClient


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(url: str, node: str, vhost: str, ttl: int) -> None:
    client = EtcdClient([url], timeout=1.0)
    coord = Coordinator(client, node=node, lease_ttl=ttl, campaign_grace=0)
    coord.on_won.append(lambda v, e: say(event="won", vhost=v, epoch=e))
    coord.on_lost.append(
        lambda v, e, why: say(
            event="lost",
            vhost=v,
            epoch=e,
            reason=why,
            may_confirm=coord.may_confirm(v, e),
            seen=coord.leader(v),
        )
    )
    coord.on_fenced.append(lambda: say(event="fenced"))
    await coord.start()
    await coord.place_vhost(vhost)
    coord.follow(vhost)
    say(event="ready")
    while True:  # the test reads these to see what the node believes after waking
        await asyncio.sleep(0.2)
        epoch = coord.leading.get(vhost, 0)
        say(
            event="tick",
            epoch=epoch,
            may_confirm=coord.may_confirm(vhost, epoch),
            leader=coord.leader(vhost),
        )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
