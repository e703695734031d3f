"""The gateway while Kafka is away: no call waits for a connection attempt; one attempt
runs in the background at a time, at most one a cooldown."""

import asyncio
import time

from flows.client import AsyncDecider, ClientSettings, KafkaUnavailableError
from flows.gateway import app
from flows.testing.kafka_broker import free_port


def test_calls_while_the_brokers_are_away_fail_at_once_one_attempt_a_cooldown(monkeypatch):
    attempts = []

    class Counted(AsyncDecider):
        def __init__(self, settings: ClientSettings) -> None:
            attempts.append(time.monotonic())
            super().__init__(settings)

    monkeypatch.setattr(app, "AsyncDecider", Counted)
    monkeypatch.setattr(app, "RECONNECT_COOLDOWN", 1.5)
    settings = ClientSettings(brokers=f"127.0.0.1:{free_port()}", connect_timeout=0.5)

    async def calls(gateway: app.Gateway, n: int) -> list[BaseException]:
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(gateway.decider() for _ in range(n)), return_exceptions=True
        )
        assert time.monotonic() - started < 0.2  # none waited for an attempt
        assert all(isinstance(each, KafkaUnavailableError) for each in outcomes)
        return list(outcomes)

    async def scenario() -> None:
        gateway = app.Gateway(settings)
        first = await calls(gateway, 50)  # an attempt begins in the background
        assert all("connecting to Kafka" in str(each) for each in first)
        await gateway.connect()  # that attempt, waited for: it fails
        assert len(attempts) == 1
        cooling = await calls(gateway, 50)
        assert len(attempts) == 1
        assert all("the next one after 1.5 s" in str(each) for each in cooling)
        await asyncio.sleep(1.5 - (time.monotonic() - attempts[0]) + 0.6)
        await calls(gateway, 50)  # past the cooldown: a second attempt, still none waits
        await gateway.connect()
        assert len(attempts) == 2 and attempts[1] - attempts[0] >= 1.5

    asyncio.run(scenario())
