"""One run across several processes, on JAX's own distributed runtime.

Start-up (:func:`initialize`) turns the launch settings of ``titan train`` (``--distributed``,
``--coordinator``, ``--num-processes``, ``--process-id``) into one call of
``jax.distributed.initialize``, before anything touches a JAX device:

- ``--distributed off``: one process, nothing initialised; the explicit flags are refused.
- ``--distributed auto`` (default) with none of the explicit flags: JAX's own cluster detection
  (SLURM, Open MPI, Kubernetes, a Cloud TPU slice: :mod:`titan.parallel.clusters`) decides; a
  detected job of one process and no detected cluster both mean a single process, nothing
  initialised. On a TPU VM, a single host and a detection that fails (no metadata server
  answers) both mean a single process, said in one line on stderr (:func:`one_process_line`).
- Explicit flags override what detection finds; outside a detected cluster all three are needed.

On CPU the processes' collectives go through gloo (``jax_cpu_collectives_implementation``) and
each process gets its share of CPU devices from ``JAX_NUM_CPU_DEVICES`` (``jax_num_cpu_devices``,
which ``titan launch`` sets). An MPMD pipeline moves activations between processes with JAX's
cross-host transfers, which on CPU need ``jax_cross_host_transfer_socket_address``: unless it is
set (``JAX_CROSS_HOST_TRANSFER_SOCKET_ADDRESS``), each process takes a free port on the address
it reaches the coordinator from (:func:`transfer_address`).

Beyond the train step itself the training entry needs three collectives, all here: a value
decided by process 0 (:func:`broadcast_bytes`, the run id and the tokenizer), a barrier
(:func:`barrier`) and the stop agreement (:class:`StopAgreement`). Each spans every device of
every process and is issued from the main thread only (:func:`one_thread`), in an order that
every process derives from the step number (docs/architecture.md, "Several processes").
"""

from __future__ import annotations

import socket
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from titan.errors import TitanError, first_line
from titan.parallel.clusters import Cluster, TpuDetectionFailed, detected_cluster, on_cloud_tpu_vm

if TYPE_CHECKING:
    import jax

DISTRIBUTED_MODES = ("auto", "off")


class InitializeKeywords(TypedDict, total=False):
    """The ``jax.distributed.initialize`` keywords of the flags given (:data:`_FLAGS`)."""

    coordinator_address: str
    num_processes: int
    process_id: int


@dataclass(frozen=True)
class LaunchSettings:
    """How this process joins a run (``titan train``'s launch flags; not a run option: the same
    run may resume on another number of processes).

    Attributes:
        mode: ``auto`` or ``off``.
        coordinator: ``HOST:PORT`` of process 0's coordination service, or None.
        num_processes: processes of the run, or None.
        process_id: this process's index in ``[0, num_processes)``, or None.
    """

    mode: str = "auto"
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    @property
    def explicit(self) -> InitializeKeywords:
        """The explicit flags given, as ``jax.distributed.initialize`` keywords."""
        given = InitializeKeywords()
        if self.coordinator is not None:
            given["coordinator_address"] = self.coordinator
        if self.num_processes is not None:
            given["num_processes"] = self.num_processes
        if self.process_id is not None:
            given["process_id"] = self.process_id
        return given

    def check(self) -> None:
        """Raises TitanError (one line, naming the flag) for settings that cannot start a run."""
        if self.mode not in DISTRIBUTED_MODES:
            raise TitanError(f"--distributed {self.mode}: allowed: auto, off")
        if self.mode == "off" and self.explicit:
            flag = _FLAGS[next(iter(self.explicit))]
            raise TitanError(f"{flag} cannot be given with --distributed off")
        if self.num_processes is not None and self.num_processes < 1:
            raise TitanError(f"--num-processes {self.num_processes}: must be at least 1")
        if self.process_id is not None and self.process_id < 0:
            raise TitanError(f"--process-id {self.process_id}: must be at least 0")
        if (
            self.num_processes is not None
            and self.process_id is not None
            and self.process_id >= self.num_processes
        ):
            raise TitanError(
                f"--process-id {self.process_id} is out of range for --num-processes "
                f"{self.num_processes} (0 to {self.num_processes - 1})"
            )
        if self.coordinator is not None:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit():
                raise TitanError(f"--coordinator {self.coordinator}: expected HOST:PORT")
            if not 1 <= int(port) <= 65535:
                raise TitanError(f"--coordinator {self.coordinator}: port must be 1 to 65535")


_FLAGS = {
    "coordinator_address": "--coordinator",
    "num_processes": "--num-processes",
    "process_id": "--process-id",
}


def _coordinator_port_free(coordinator: str) -> None:
    """Process 0 serves the coordination service on the coordinator's port of every local
    address: refuse a port that is taken now (gRPC would crash the process on it).

    Raises:
        TitanError: the port is in use on this host.
    """
    port = int(coordinator.rpartition(":")[2])
    try:
        probe = socket.socket(socket.AF_INET6)  # dual stack: IPv4 users of the port count too
    except OSError:  # no IPv6 on this host
        probe = socket.socket(socket.AF_INET)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as err:
            raise TitanError(
                f"--coordinator {coordinator}: port {port} is in use on this host, where "
                f"process 0 serves the coordination service ({err.strerror or err})"
            ) from None


def initialize(settings: LaunchSettings) -> int:
    """Join the run's processes per ``settings`` (a no-op for one process). Must run before
    anything touches a JAX device. Returns the number of processes.

    Raises:
        TitanError: inconsistent or incomplete settings (names the missing flag).
    """
    settings.check()
    if settings.mode == "off":
        return 1
    explicit = settings.explicit
    failure = None
    try:
        cluster = detected_cluster(JOIN_TIMEOUT_S) if len(explicit) < len(_FLAGS) else None
    except TpuDetectionFailed as err:
        cluster, failure = None, err
    alone = not explicit or explicit.get("num_processes") == 1
    if (cluster is None or cluster.processes == 1) and alone and on_cloud_tpu_vm():
        print(one_process_line(cluster, failure), file=sys.stderr, flush=True)
    if cluster is None:
        missing = [flag for key, flag in _FLAGS.items() if key not in explicit]
        if alone:
            return 1
        if missing:
            given = ", ".join(_FLAGS[key] for key in explicit)
            raise TitanError(
                f"{given} given without {', '.join(missing)} (no SLURM, Open MPI, Kubernetes "
                "or TPU slice detected to fill them in)"
            )
    elif cluster.processes == 1 and "num_processes" not in explicit:
        return 1
    if cluster is not None and cluster.coordinator is not None and cluster.process_id is not None:
        # a TPU slice, read here: JAX need not ask the metadata server again
        explicit.setdefault("coordinator_address", cluster.coordinator)
        explicit.setdefault("num_processes", cluster.processes)
        explicit.setdefault("process_id", cluster.process_id)
    import jax

    # gloo carries the CPU collectives between processes (ignored by GPU clients).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if not jax.config.read("jax_cross_host_transfer_socket_address"):
        address = transfer_address(explicit.get("coordinator_address"))
        jax.config.update("jax_cross_host_transfer_socket_address", address)
    if explicit.get("process_id") == 0 and "coordinator_address" in explicit:
        _coordinator_port_free(explicit["coordinator_address"])
    print(_joining_line(explicit, cluster), file=sys.stderr, flush=True)
    _join(explicit)
    return jax.process_count()


def _join(explicit: InitializeKeywords) -> None:
    """``jax.distributed.initialize`` in a helper thread while the main thread waits in short
    slices: its native wait for the other processes would otherwise hold the main thread, so
    that no signal handler ran (SIGTERM, Ctrl-C: :mod:`titan.stopping` stops the start-up at
    once) until JAX ends the process after :data:`JOIN_TIMEOUT_S` with a C++ stack trace.

    Raises:
        TitanError: JAX refused the settings, or not every process joined within
            :data:`JOIN_TIMEOUT_S` less a second (before JAX's own abort).
    """
    import jax

    failures: list[BaseException] = []

    def run() -> None:
        try:
            jax.distributed.initialize(**explicit, initialization_timeout=JOIN_TIMEOUT_S)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            failures.append(err)

    joining = threading.Thread(target=run, name="titan-join", daemon=True)
    joining.start()
    joining.join(JOIN_TIMEOUT_S - 1)  # a signal's handler runs on the main thread meanwhile
    if joining.is_alive():
        raise TitanError(
            f"not every process joined within {JOIN_TIMEOUT_S} s (a process that did not "
            "start, another --coordinator, or a --process-id given twice)"
        )
    if failures:
        err = failures[0]
        if isinstance(err, ValueError | RuntimeError):
            raise TitanError(f"jax.distributed.initialize: {first_line(err)}") from None
        raise err


JOIN_TIMEOUT_S = 300
"""How long ``jax.distributed.initialize`` waits for every process to join before it ends the
process (its ``initialization_timeout`` default, jax/_src/distributed.py)."""


def one_process_line(cluster: Cluster | None, failure: TpuDetectionFailed | None) -> str:
    """The line that says a run on a TPU VM is one process, and why: a slice of one host, no
    slice detected, or a detection that failed (``failure``: no metadata server answered)."""
    if failure is not None:
        why = f"its TPU slice could not be detected ({failure})"
    elif cluster is not None:
        why = f"a single-host TPU slice ({cluster.name})"
    else:
        why = "no multi-host TPU slice detected"
    return f"titan: one process on this TPU VM: {why}"


def _joining_line(explicit: InitializeKeywords, cluster: Cluster | None) -> str:
    """What this process waits for while the others join, in one line (JAX says nothing until
    it gives up after :data:`JOIN_TIMEOUT_S`)."""
    where = explicit.get("coordinator_address") or "the coordinator"
    count = explicit.get("num_processes") or (cluster.processes if cluster else "the")
    source = f" ({cluster.name})" if cluster else ""
    index = explicit.get("process_id")
    me = f"process {index}" if index is not None else "this process"
    return (
        f"titan: {me} joining {count} processes at {where}{source}; waiting up to "
        f"{JOIN_TIMEOUT_S} s for all of them"
    )


def transfer_address(coordinator: str | None) -> str:
    """``HOST:PORT`` for this process's cross-host transfer server: the local address of the
    route to the coordinator (``HOST:PORT``; 127.0.0.1 when it is on this host), or this host's
    name's address when the coordinator comes from cluster detection (None); and a port free now.

    JAX needs an explicit port (port 0 is published as 0 and transfers then hang), so one is
    taken from the kernel and released just before JAX binds it.
    """
    if coordinator:
        host = coordinator.rpartition(":")[0].strip("[]")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((host, 9))  # sends nothing
            except OSError as err:  # gaierror: the host does not resolve
                raise TitanError(
                    f"--coordinator {coordinator}: cannot reach {host}: {err.strerror or err}"
                ) from None
            local = probe.getsockname()[0]
    else:
        local = socket.gethostbyname(socket.gethostname())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as free:
        free.bind((local, 0))
        port = free.getsockname()[1]
    return f"{local}:{port}"


def process_index() -> int:
    import jax

    return jax.process_index()


def process_count() -> int:
    import jax

    return jax.process_count()


def barrier(name: str) -> None:
    """Wait until every process has reached the barrier ``name`` (no-op for one process)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        one_thread(f"barrier {name}")
        multihost_utils.sync_global_devices(name)


def on_every_process(flag: bool) -> bool:
    """Whether ``flag`` holds on every process: an all-gather of one flag, so that every
    process waits for all, as at a barrier (``flag`` itself for one process)."""
    return not processes_without(flag)


def processes_without(flag: bool) -> list[int]:
    """The indices of the processes where ``flag`` does not hold: an all-gather of one flag,
    so that every process waits for all, as at a barrier (``[]`` or ``[0]`` for one
    process)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return [] if flag else [0]
    one_thread("an agreement of every process")
    flags = np.asarray(multihost_utils.process_allgather(np.array(flag))).reshape(-1)
    return [int(i) for i in np.flatnonzero(~flags.astype(bool))]


def broadcast_bytes(data: bytes | None) -> bytes:
    """Process 0's ``data`` on every process (others pass anything, e.g. None)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return data or b""
    one_thread("a broadcast from process 0")
    first = jax.process_index() == 0
    sent = (data or b"") if first else b""  # process 0's data: None sends nothing
    size = multihost_utils.broadcast_one_to_all(np.int32(len(sent)))
    buffer = np.frombuffer(sent, np.uint8) if first else np.zeros(int(size), np.uint8)
    return bytes(np.asarray(multihost_utils.broadcast_one_to_all(buffer)))


def broadcast_text(text: str | None) -> str:
    """Process 0's ``text`` on every process."""
    return broadcast_bytes(text.encode() if text is not None else None).decode()


def largest_over_processes(value: int) -> int:
    """The largest ``value`` (a byte count, >= -1) of every process: ``value`` itself for one
    process; over several, each rounded up to whole MiB (gathered as int32, JAX's default)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return value
    one_thread("a maximum over processes")
    mib = -(-value // 2**20)
    return int(np.max(multihost_utils.process_allgather(np.int32(mib)))) * 2**20


AXES = ("processes", "local_devices")  # the axes of all_devices_mesh


def all_devices_mesh() -> jax.sharding.Mesh:
    """A mesh of every device of every process, shape (processes, devices per process), axes
    :data:`AXES`: the mesh of JAX's own ``multihost_utils`` barriers and broadcasts, and of the
    stop agreement (the same number of devices in every process, as JAX requires there)."""
    import jax

    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    return jax.sharding.Mesh(devices, AXES)


def one_thread(what: str) -> None:
    """Refuse a cross-process collective issued off the main thread: every process issues its
    collectives from the thread that runs the loop, in the order the step numbers give, so that
    they pair up (a second thread's would meet the step's in another order on another process).

    Raises:
        RuntimeError: called from another thread while several processes run.
    """
    if process_count() > 1 and threading.current_thread() is not threading.main_thread():
        name = threading.current_thread().name
        raise RuntimeError(f"{what} is a cross-process collective, issued from thread {name}")


class StopAgreement:
    """Whether any process has asked to stop, agreed by all processes at the same step.

    After each step every process dispatches a max-reduce of its own stop flag over every
    device of every process (:meth:`contribute`, the mesh of :func:`all_devices_mesh`); nobody
    waits for it then. Before dispatching step ``n + 1`` the loop reads the reduce of step
    ``n - 1`` (:meth:`stop_before`), which has already finished, since step ``n - 1``'s metrics
    were read one step late. Every process reads the same value at the same point, so all stop
    after the same step, at most two steps after the signal. Cost: one all-reduce of one int32
    per device per step, dispatched asynchronously (a few ms over gloo on CPU, microseconds
    over NCCL); the host never blocks on it.

    The reduce spans all devices so that it runs after the step, never beside it: the CPU
    runtime runs a program that has one device in this process as soon as its inputs are ready,
    while programs of several devices here (the step's) run one at a time in dispatch order. A
    reduce over one device per process would share a gloo pair with the step's collectives over
    those devices (FSDP's, with fsdp across processes) and could meet them mid-step (gloo then
    aborts the process: ``op.preamble.length <= op.nbytes``).

    With one process the local flag is the agreement (stop after the step in flight).
    """

    def __init__(self, requested: Callable[[], bool]) -> None:
        import jax

        self._requested = requested
        self._pending: deque[tuple[int, jax.Array]] = deque()  # (step, reduced flag)
        self._reduce = None
        if jax.process_count() > 1:
            mesh = all_devices_mesh()
            self._sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*AXES))
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            self._reduce = jax.jit(lambda flags: flags.max(), out_shardings=replicated)
        self._agreed = False

    @property
    def agreed(self) -> bool:
        """Whether the run is stopping (with one process: whether a stop was requested)."""
        return self._agreed or (self._reduce is None and bool(self._requested()))

    def contribute(self, step: int) -> None:
        """Dispatch the reduce of this process's flag after ``step`` (asynchronous)."""
        if self._reduce is None:
            return
        import jax

        one_thread("the stop agreement")
        shape = self._sharding.mesh.devices.shape  # (processes, devices per process)
        local = np.full((1, shape[1]), int(self._requested()), np.int32)
        flags = jax.make_array_from_process_local_data(self._sharding, local, shape)
        self._pending.append((step, self._reduce(flags)))

    def stop_before(self, step: int) -> bool:
        """Whether to stop before dispatching step ``step + 1`` (every process answers alike)."""
        while self._pending and self._pending[0][0] <= step - 1:
            _, flag = self._pending.popleft()
            self._agreed = self._agreed or bool(np.asarray(flag))
        return self.agreed
