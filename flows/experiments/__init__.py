"""Experiments as versioned resources: the pure model (``model``), their Kafka topics
(``store``), and the follower that keeps a running service's registry in step
(``follow``)."""
