"""Weight push from the learner to the generators: one implementation for every engine.

    bucket.py     (name, tensor) stream <-> flat one-dtype buckets + layout (asyncrl.engine.bucket_layout: the
                  format an engine that receives buckets itself checks too; validated before any transfer)
    group.py      standalone per-generator process group from a TCP rendezvous (gloo / NCCL)
    transport.py  WeightTransport Protocol (the data path) + BroadcastTransport; DirectReceiver hook
    cuda_ipc.py   IpcTransport: same-GPU generators read the learner's buffer by CUDA IPC
    inbox.py      the gate for inbound control frames: bounded sockets, decode, type check, `Rejections`
    member.py     one generator as the sender sees it; check_join, take_ack
    link.py       start_link: the learner's side of a joining generator's link (IPC, or a group built on a thread)
    report.py     PushReport
    sender.py     WeightSender (learner rank 0): joins, push() with a window of buckets in flight, serve_joins()
    receiver.py   WeightReceiver (generator): poll() runs pause -> begin -> post/load buckets -> end -> resume
"""

from asyncrl.engine.bucket_layout import BucketLayout, unflatten
from asyncrl.weights.bucket import DEFAULT_BUCKET_BYTES, drain, flatten, iter_buckets
from asyncrl.weights.receiver import UpdateResult, WeightReceiver
from asyncrl.weights.sender import PushReport, WeightSender
from asyncrl.weights.transport import DirectReceiver, WeightTransport

__all__ = [
    "DEFAULT_BUCKET_BYTES", "BucketLayout", "DirectReceiver", "PushReport", "UpdateResult", "WeightReceiver",
    "WeightSender", "WeightTransport", "drain", "flatten", "iter_buckets", "unflatten",
]
