"""How each framework forms its group of workers: ``torch``
(torch.distributed, torchrun's variables) and ``tensorflow`` (tf.distribute,
``TF_CONFIG``). An engine is an `Engine`
that any backend of ``dist_dl.launch.backends`` runs. Horovod, an engine with
launchers of its own, is ``dist_dl.launch.horovod``."""
