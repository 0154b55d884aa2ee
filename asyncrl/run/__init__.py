"""One run on disk and in time, read from its whole RunConfig: the run directory, a service's life cycle (signals,
logging, the config it starts with), the feeder that fills the hub from the task. The components below it read
only their own configs (tests/test_config_layering.py)."""
