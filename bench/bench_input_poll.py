"""What an input partition's empty poll costs with the look at a stopped fetcher.

Bytewax calls an input partition again soon after an empty batch, so an idle service pays
this per partition many times a second. The reference is ``next_batch`` as it was
before the look (the stop check and the partition's own read), timed in the same run,
alternating, on a consumer with nothing to read (no broker needed).

    .venv/bin/python bench/bench_input_poll.py [--rounds 7]

Prints each round's ns per call of both and the median of the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from flows.service.connectors.kafka_partition import ObservedPartition, Reading
from flows.service.connectors.stopping import Stop

CALLS = 50_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    config = {"bootstrap.servers": "127.0.0.1:9", "group.id": "bench-poll", "log_level": 0}
    partition = ObservedPartition(config, "t", 0, 5, Reading(batched=True))
    ratios = []

    def without_look() -> list:
        if Stop.asked():
            raise StopIteration
        items = partition._consume()
        return [items] if items else []

    try:
        for i in range(rounds):
            poll = timeit.timeit(partition.next_batch, number=CALLS) / CALLS
            before = timeit.timeit(without_look, number=CALLS) / CALLS
            ratios.append(poll / before)
            ns = f"next_batch {poll * 1e9:.0f} ns, without the look {before * 1e9:.0f} ns"
            print(f"round {i + 1}: {ns}")
    finally:
        partition.close()
    median = statistics.median(ratios)
    print(f"median next_batch / without the look over {rounds} rounds: {median:.2f}")
    print(f"all: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
