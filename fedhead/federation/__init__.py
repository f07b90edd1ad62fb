"""The federation layer: the message protocol, aggregation, tracking, checkpoints, the Grid wrapper and the watchdog."""
