"""The federation layer: the message protocol, aggregation, tracking, checkpoints, the Grid wrapper, the watchdog
and the secure-sum engine."""
