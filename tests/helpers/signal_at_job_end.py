"""A Hydra callback that sends this process SIGTERM as the first job of a multirun ends: a signal
that comes after the job's last stop check (during its final validation, say), deterministically."""

import os
import signal
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SignalAtFirstJobEnd(Callback):
    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.job.num == 0:
            os.kill(os.getpid(), signal.SIGTERM)
