"""The gateway while Kafka is away: one connection attempt per cooldown, the calls in
between answered at once."""

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
        outcomes = await asyncio.gather(
            *(gateway.decider() for _ in range(n)), return_exceptions=True
        )
        return list(outcomes)

    async def scenario() -> None:
        gateway = app.Gateway(settings)
        started = time.monotonic()
        first = await calls(gateway, 50)  # one attempt; the others wait for it, then fail
        assert all(isinstance(each, KafkaUnavailableError) for each in first)
        assert len(attempts) == 1 and time.monotonic() - started < 3
        started = time.monotonic()
        cooling = await calls(gateway, 50)
        assert time.monotonic() - started < 0.2 and len(attempts) == 1
        assert all("the next one after 1.5 s" in str(each) for each in cooling)
        await asyncio.sleep(1.5 - (time.monotonic() - attempts[0]) + 0.6)
        again = await calls(gateway, 50)
        assert all(isinstance(each, KafkaUnavailableError) for each in again)
        assert len(attempts) == 2 and attempts[1] - attempts[0] >= 1.5

    asyncio.run(scenario())
