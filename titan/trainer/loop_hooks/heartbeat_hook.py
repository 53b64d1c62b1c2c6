"""The run's liveness as a hook: this process's heartbeat (:class:`titan.trainer.processes.
Heartbeat`), beaten at each step read, and the watch of the other processes' heartbeats
(:class:`titan.trainer.peers.PeerWatch`)."""

from __future__ import annotations

from titan.telemetry.events import Step
from titan.trainer.hooks import Hook, Reading
from titan.trainer.peers import PeerWatch
from titan.trainer.processes import Heartbeat


class HeartbeatHook(Hook):
    """Beats ``heartbeat`` after each step and watches the other processes through ``peers``
    (both background threads, for the run's length)."""

    def __init__(self, heartbeat: Heartbeat, peers: PeerWatch) -> None:
        self.heartbeat = heartbeat
        self.peers = peers

    def on_start(self) -> None:
        self.heartbeat.start()
        self.peers.start()

    def on_metrics(self, event: Step, reading: Reading) -> None:
        self.heartbeat.beat(reading.step)

    def close(self) -> None:
        self.peers.stop()
        self.heartbeat.stop()
