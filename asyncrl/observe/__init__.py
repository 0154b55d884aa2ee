"""What a run shows: per-step metrics (JSONL, TensorBoard, Prometheus, W&B), timelines of busy spans,
profiler ranges."""
