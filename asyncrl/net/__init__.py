"""How processes reach each other: the hub peer (ZeroMQ DEALER), ZAP authentication and the run's
credentials, binding endpoints, heartbeats, torch.distributed rendezvous stores, the NCCL environment."""
