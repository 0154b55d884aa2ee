"""The learner: advantages, losses, packed logprobs, the FSDP2 Trainer, checkpoints and export.

Import the pieces from their modules (this package stays import-light, since `asyncrl.learner.config`
is read by every process):

    from asyncrl.learner.trainer import Trainer
    from asyncrl.learner.checkpoint import latest_checkpoint
"""
