"""Large exactly-once error trailers: the worker's subscriber channel reads them intact."""

from __future__ import annotations

from typing import Any, cast

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.pubsub_v1.services.subscriber.transports.grpc import SubscriberGrpcTransport

from emulator import Emulators
from pubsub_worker._support.clients import subscriber_client

pytestmark = pytest.mark.emulator

STALE = 300  # ~80 stale ack ids already overflow gRPC's default 8 KiB metadata limit


def test_a_trailer_listing_hundreds_of_invalid_ack_ids_is_a_clean_error(
    emulators: Emulators, publisher: Any, make_subscription: Any
) -> None:
    handle = make_subscription(exactly_once=True, ack_deadline_seconds=60)
    ours = subscriber_client()
    stock = type(ours)(
        transport=SubscriberGrpcTransport(
            channel=grpc.insecure_channel(cast(str, emulators.pubsub_host))
        )
    )
    try:
        futures = [publisher.publish(handle.topic_path, str(i).encode()) for i in range(STALE)]
        for future in futures:
            future.result()

        def pull(count: int) -> list[str]:
            ids: list[str] = []
            while len(ids) < count:
                response = ours.pull(
                    request={"subscription": handle.subscription_path, "max_messages": 100},
                    timeout=10,
                )
                ids += [m.ack_id for m in response.received_messages]
            return ids

        stale = pull(STALE)
        ours.modify_ack_deadline(
            request={
                "subscription": handle.subscription_path,
                "ack_ids": stale,
                "ack_deadline_seconds": 0,
            }
        )
        pull(STALE)  # redelivered: every id in `stale` is now invalid
        request = {"subscription": handle.subscription_path, "ack_ids": stale}

        # A channel with default limits cannot even read the error.
        with pytest.raises(gexc.GoogleAPICallError) as broken:
            stock.acknowledge(request=request)
        assert not isinstance(broken.value, gexc.InvalidArgument)

        # The worker's channel gets the real answer, with every refused id in it.
        with pytest.raises(gexc.InvalidArgument) as clean:
            ours.acknowledge(request=request)
        details = str(clean.value.details)
        assert "EXACTLY_ONCE_ACKID_FAILURE" in details
        assert details.count("PERMANENT_FAILURE_INVALID_ACK_ID") == STALE
    finally:
        ours.close()
        stock.close()
