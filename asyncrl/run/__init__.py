"""One run on disk and in time: the run directory, a service's life cycle (signals, logging), the feeder
that fills the hub from the task, durable writes."""
