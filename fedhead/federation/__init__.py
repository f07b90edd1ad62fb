"""Federation layer: job config, message protocol, aggregation, tracking, checkpoints, deadlines, message grid."""
