"""Training: partitioning over a device mesh, optimizers, losses, checkpoints and the train loop."""
