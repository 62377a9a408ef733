"""The per-worker training loop: code that runs inside each Horovod worker."""
