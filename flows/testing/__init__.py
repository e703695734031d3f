"""Helpers for the tests and the benchmarks: a real Kafka broker (``kafka_broker``)."""
