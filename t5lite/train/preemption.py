"""SIGTERM and SIGINT stop training at a step boundary, with a checkpoint, instead of killing it.

A preempted TPU VM gets SIGTERM; Ctrl-C is SIGINT. Either asks the loop to finish the current
step, save it and exit normally; a second SIGINT aborts at once. On one host the signal sets a
flag. On several hosts every host must save the same step, so the decision is JAX's preemption
sync point (through orbax's `CheckpointManager.reached_preemption`): JAX's coordination
service catches SIGTERM on any host and all hosts reach the same step; SIGINT is forwarded to it
as SIGTERM.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

import jax

log = logging.getLogger("t5lite")


class StopSignals:
    """While active (a context manager), `requested(step, ckpt)` says whether to stop after `step`."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}
        self._multihost = jax.process_count() > 1

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self  # Python delivers signals to the main thread only
        # With several hosts, JAX's preemption service owns SIGTERM (see the module docstring);
        # without that service, Ctrl-C keeps its default (abort), as one host can't stop alone.
        signals = (signal.SIGINT, signal.SIGTERM)
        if self._multihost:
            signals = (signal.SIGINT,) if _preemption_service_running() else ()
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt("second interrupt: stopping at once, without a checkpoint")
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: finishing the current step and saving a checkpoint (Ctrl-C again to abort "
                    "at once)", self.signal_name)
        if self._multihost:
            os.kill(os.getpid(), signal.SIGTERM)  # so every host stops at the same step

    def requested(self, step: int, checkpointer) -> bool:
        if self._multihost and checkpointer.reached_preemption(step):
            self.signal_name = self.signal_name or "SIGTERM"
            return True
        return not self._multihost and self.signal_name is not None


def _preemption_service_running() -> bool:
    from jax._src import distributed
    return distributed.global_state.preemption_sync_manager is not None
