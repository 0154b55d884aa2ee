"""The built-in torch generation engine: continuous batching, paged KV cache, exact per-token logprobs."""
