"""The cases of tests/integration/test_train.py that need no Spark, no training
and no worker process."""
from __future__ import annotations

import cloudpickle
import pytest
import train_hooks
import workers


cloudpickle.register_pickle_by_value(train_hooks)
cloudpickle.register_pickle_by_value(workers)


@pytest.mark.timeout(30)
def test_ranks_read_before_horovod_init_are_checked_after_it():
    from dist_dl.train.engines.horovod import _check_ranks

    _check_ranks((3, 1), (3, 1))
    with pytest.raises(RuntimeError, match=r"environment gave rank 3 and local rank 1 .* "
                                           r"hvd.init\(\) gave rank 1 and local rank 0"):
        _check_ranks((3, 1), (1, 0))
