"""The console over real SSH, and its exit on signals: an asyncssh server on 127.0.0.1 runs
``titan-console`` on a pseudo-terminal for one login and then stops; OpenSSH's client logs in
from a tmux pane of 80x24, where ``send-keys`` launches a tiny run, stops it from the monitor
and quits; a dropped connection ends the console by itself, with or without the kernel's
SIGHUP; SIGTERM and SIGHUP end a console in a tmux pane with its terminal restored."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import shlex
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import asyncssh
import psutil
import pytest
from console_helpers import LAUNCH_TIMEOUT_S, tiny_form_texts
from test_console_tmux import (
    FIRST_FLAG,
    SESSION,
    _screen,
    _send,
    _tmux,
    _wait_for,
    type_launch_form,
)

from titan.analysis.liveness import read_launch
from titan.exit_codes import EXIT_STOPPED
from titan.telemetry.records import read_events

SSH = Path("/usr/bin/ssh")
CONSOLE = Path(sys.executable).parent / "titan-console"
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
needs_ssh = pytest.mark.skipif(not SSH.exists(), reason="no OpenSSH client at /usr/bin/ssh")
STEPS = 100_000  # the run trains until it is stopped
# A console whose terminal went away exits within this many seconds (it blinks the cursor of
# the launch form every 0.5 s: its first write to the lost terminal ends it), and one that is
# sent SIGTERM or SIGHUP; both take about a second (more on a loaded machine).
EXIT_S = 10.0
EMPTY_LIST = ("press n to launch one", "q Quit")  # the run list of an empty runs root
# What tmux reports of a pane whose program left the terminal as it found it.
RESTORED = {"alternate_on": "0", "mouse_any_flag": "0", "mouse_sgr_flag": "0", "wrap_flag": "1"}


class ConsoleServer:
    """An SSH server on 127.0.0.1 (a free port, in a thread of its own) that, for one login, runs
    ``titan-console ARGS`` on a pseudo-terminal of the size the client asked for, relays the
    session both ways, and then stops. A dropped connection closes the terminal as sshd does
    and gives the console :data:`EXIT_S` to exit, then kills it (SIGKILL).

    Args:
        folder: where the host key and the client key (the only way in, no password) are made.
        args: titan-console's arguments.
        leads_session: the console leads its terminal's session, as under sshd (a dropped
            connection reaches it as the kernel's SIGHUP); False: it has no controlling
            terminal, and finds only that writes to it fail (EIO).

    Attributes:
        client_key: the client's private key file (for ``ssh -i``).
        port: the port it listens on (set once the server is up).
        terminal_size: the (columns, lines) the client asked for.
        returncode: the console's exit status (negative: killed by that signal), once it exited.
    """

    def __init__(self, folder: Path, args: list[str], *, leads_session: bool = True) -> None:
        self._args = args
        self._leads_session = leads_session
        self._host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = folder / "id_ed25519"
        client_key.write_private_key(self.client_key)
        self.client_key.chmod(0o600)  # ssh refuses a key others can read
        self._authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
        self.port = 0
        self.terminal_size: tuple[int, int] | None = None
        self.returncode: int | None = None
        self._console_pid: int | None = None
        self._up = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    def __enter__(self) -> ConsoleServer:
        self._thread.start()
        if not self._up.wait(30):
            raise AssertionError("the SSH server did not start in 30 s")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server (it stops by itself after its login) and kill a console left."""
        if self.wait_stopped(1.0):
            return
        if self._console_pid is not None and self.returncode is None:
            os.kill(self._console_pid, signal.SIGKILL)
        self._loop.call_soon_threadsafe(self._over.set)
        self._thread.join(30)

    def wait_stopped(self, timeout_s: float) -> bool:
        """Whether the server has stopped (its login over), waiting up to ``timeout_s``."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._over = asyncio.Event()
        server = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_host_keys=[self._host_key],
            authorized_client_keys=self._authorized,
            process_factory=self._session,
            encoding=None,  # bytes both ways: the terminal's, as they are
            line_editor=False,  # the console reads raw keys; asyncssh would echo and edit lines
        )
        self.port = server.get_port()
        self._up.set()
        try:
            await self._over.wait()
        finally:
            server.close()
            await server.wait_closed()

    async def _session(self, process: asyncssh.SSHServerProcess) -> None:
        try:
            await self._run_console(process)
        finally:
            self._over.set()

    async def _run_console(self, process: asyncssh.SSHServerProcess) -> None:
        columns, lines, _, _ = process.get_terminal_size()
        self.terminal_size = (columns, lines)
        controller, terminal = pty.openpty()
        termios.tcsetwinsize(terminal, (lines, columns))
        console = await asyncio.create_subprocess_exec(
            CONSOLE,
            *self._args,
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
            env={**os.environ, "TERM": process.get_terminal_type() or "xterm-256color"},
            start_new_session=True,
            preexec_fn=_take_terminal if self._leads_session else None,
        )
        os.close(terminal)
        self._console_pid = console.pid
        loop = asyncio.get_running_loop()
        drained = asyncio.Event()

        def relay_output() -> None:
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                data = b""
            if data:
                process.stdout.write(data)
            else:
                loop.remove_reader(controller)
                drained.set()

        loop.add_reader(controller, relay_output)
        typing = asyncio.create_task(_relay_input(process, controller))
        exited = asyncio.create_task(console.wait())
        await asyncio.wait({typing, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited.done():  # the console quit: its last output, then its status, to the client
            await asyncio.wait_for(drained.wait(), 10)
            os.close(controller)
            self.returncode = exited.result()
            if self.returncode >= 0:
                process.exit(self.returncode)
            else:
                process.exit_with_signal(signal.Signals(-self.returncode).name[3:])
        else:  # the client went away: close the terminal, as sshd does
            loop.remove_reader(controller)
            os.close(controller)
            done, _ = await asyncio.wait({exited}, timeout=EXIT_S)
            if not done:
                console.kill()
            self.returncode = await exited
        typing.cancel()


def _take_terminal() -> None:
    """In the console's process, after its setsid: make its stdin its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _relay_input(process: asyncssh.SSHServerProcess, controller: int) -> None:
    """Copy the client's keys to the console's terminal, and its size changes, until the client
    closes its input or the connection is lost."""
    while True:
        try:
            data = await process.stdin.read(4096)
        except asyncssh.TerminalSizeChanged as change:
            termios.tcsetwinsize(controller, (change.height, change.width))
            continue
        except asyncssh.DisconnectError:
            return
        if not data:
            return
        os.write(controller, data)


def _open_pane(command: list[str], status_file: Path) -> None:
    """Run ``command`` in tmux session :data:`SESSION`, 80x24, under a shell that then writes
    its exit status to ``status_file``, in a pane that stays after it (to read the terminal it
    left). tmux's own ``pane_dead_status`` is not read: tmux 3.3a may leave an exited program
    unreaped, with no status. A new-session that reaches a tmux server whose last session was
    just killed fails ("server exited unexpectedly"), so it is tried again."""
    part = shlex.quote(f"{status_file}.part")
    shell = f"{shlex.join(command)}; echo $? > {part} && mv {part} {shlex.quote(str(status_file))}"
    for attempt in range(5):
        try:
            _tmux(
                *("new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", shell),
                *(";", "set-option", "-t", SESSION, "remain-on-exit", "on"),
            )
            return
        except subprocess.CalledProcessError as error:
            if "server exited unexpectedly" not in error.stderr or attempt == 4:
                raise
            time.sleep(0.5)


def _pane(*names: str) -> dict[str, str]:
    """tmux's format variables ``names`` of the pane."""
    values = _tmux("display-message", "-p", "-t", SESSION, "\t".join(f"#{{{n}}}" for n in names))
    return dict(zip(names, values.rstrip("\n").split("\t"), strict=True))


def _program() -> psutil.Process:
    """The process of the command :func:`_open_pane` runs (the pane's shell's child)."""
    shell = psutil.Process(int(_pane("pane_pid")["pane_pid"]))
    deadline = time.monotonic() + 10
    while not (children := shell.children()):
        if time.monotonic() > deadline:
            raise AssertionError("the pane's shell started nothing in 10 s")
        time.sleep(0.1)
    return children[0]


def _exit_status(status_file: Path, timeout_s: float) -> int | None:
    """The exit status of the pane's command (128 + N: killed by signal N), once it exits
    within ``timeout_s`` (else None)."""
    deadline = time.monotonic() + timeout_s
    while not status_file.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    return int(status_file.read_text())


def _screen_when(condition: Callable[[str], bool], what: str, timeout_s: float) -> str:
    """The screen once ``condition`` holds on it; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition(screen := _screen()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not on screen after {timeout_s:.0f} s:\n{screen}")
        time.sleep(0.3)
    return screen


def _showing(*texts: str) -> Callable[[str], bool]:
    """A :func:`_screen_when` condition: every one of ``texts`` is on the screen."""
    return lambda screen: all(text in screen for text in texts)


def _ssh_command(server: ConsoleServer) -> list[str]:
    """OpenSSH's client, logging in to ``server`` with its key."""
    return [
        *(str(SSH), "-tt", "-F", "/dev/null", "-p", str(server.port)),
        *("-i", str(server.client_key), "-o", "StrictHostKeyChecking=no"),
        *("-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "127.0.0.1"),
    ]


def _kill_runs(runs: Path) -> None:
    """SIGKILL the process group of each run in ``runs`` whose launched process still runs."""
    for run_dir in runs.glob("*"):
        trainer = read_launch(run_dir)
        if trainer is not None and trainer.gone() is None:
            os.killpg(trainer.pgid, signal.SIGKILL)


def _status_line(screen: str) -> str:
    """The monitor's status row (``status    running   process  running (pid 42)``)."""
    return next((line for line in screen.splitlines() if line.startswith(" status ")), "")


def _stepping(screen: str) -> bool:
    """The monitor shows the run running, past its first step."""
    step = re.search(rf"step +(\d+) / {STEPS}", screen)
    return step is not None and int(step[1]) >= 1 and " running " in _status_line(screen)


def _consoles_and_trainers() -> list[str]:
    """Command lines of the processes under this one that run a console or a trainer."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "titan-console" in command or "titan.cli" in command:
            found.append(command)
    return found


@pytest.mark.slow
@needs_ssh
def test_over_ssh_a_run_is_launched_watched_stopped_and_the_console_quits(
    tmp_path: Path, corpus_dir: Path
):
    runs = tmp_path / "runs"
    texts = tiny_form_texts(corpus_dir) | {"steps": str(STEPS), "checkpoint_every": str(STEPS)}
    with ConsoleServer(tmp_path, ["--runs-root", str(runs)]) as server:
        _open_pane(_ssh_command(server), tmp_path / "ssh-status")
        ssh_pid = _program().pid
        try:
            listed = _screen_when(_showing(*EMPTY_LIST), "the empty run list", 60)
            _send("n")
            type_launch_form(texts)
            _send("C-r")
            running = _screen_when(_stepping, "a step of the run, running", LAUNCH_TIMEOUT_S)
            _send("s")
            asked = _wait_for("Stop the run?", 30)
            _send("y")
            stopped = _screen_when(
                lambda s: " stopped " in _status_line(s) and f"exited rc {EXIT_STOPPED}" in s,
                "the run stopped and its process exited",
                120,
            )
            _send("q")
            ssh_status = _exit_status(tmp_path / "ssh-status", 20)
            left = _pane(*RESTORED)
            after = _screen()
        finally:
            _tmux("kill-session", "-t", SESSION)
            _kill_runs(runs)  # when the test failed before the stop
        stopped_by_itself = server.wait_stopped(10)
    (run_dir,) = runs.iterdir()
    events = read_events(run_dir)
    trainer = read_launch(run_dir)
    assert server.terminal_size == (80, 24)
    assert "Titan console — runs in" in listed
    assert f"/ {STEPS}" in running and run_dir.name in running
    assert "SIGTERM: it checkpoints" in asked
    assert "R Resume" in stopped and "Stop the run?" not in stopped
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "stopped"
    assert ssh_status == 0, f"ssh has not ended 20 s after q:\n{after}"
    assert server.returncode == 0 and stopped_by_itself
    assert left == RESTORED and "Titan console" not in after
    assert trainer is not None and trainer.gone() is not None
    assert not psutil.pid_exists(ssh_pid) and _consoles_and_trainers() == []


@pytest.mark.slow
@needs_ssh
@pytest.mark.parametrize("leads_session", [True, False], ids=["sighup", "no-sighup-only-eio"])
def test_a_dropped_ssh_connection_ends_the_console_by_itself(tmp_path: Path, leads_session: bool):
    runs = tmp_path / "runs"
    server = ConsoleServer(tmp_path, ["--runs-root", str(runs)], leads_session=leads_session)
    with server:
        _open_pane(_ssh_command(server), tmp_path / "ssh-status")
        try:
            _screen_when(_showing(*EMPTY_LIST), "the empty run list", 60)
            _send("n")
            _wait_for(f"{FIRST_FLAG}: ", 60)
            _program().kill()  # the ssh client
            stopped_by_itself = server.wait_stopped(EXIT_S + 10)
        finally:
            _tmux("kill-session", "-t", SESSION)
    assert stopped_by_itself
    assert server.returncode == 0, f"the console was killed {EXIT_S:.0f} s after the drop"
    assert _consoles_and_trainers() == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_ends_the_console_like_q_and_restores_the_terminal(
    tmp_path: Path, signum: signal.Signals
):
    status_file = tmp_path / "console-status"
    _open_pane([str(CONSOLE), "--runs-root", str(tmp_path / "runs")], status_file)
    try:
        fresh = _pane(*RESTORED)
        _screen_when(_showing(*EMPTY_LIST), "the empty run list", 60)
        drawing = _pane(*RESTORED)
        _program().send_signal(signum)
        status = _exit_status(status_file, EXIT_S)
        left = _pane(*RESTORED)
        after = _screen()
    finally:
        _tmux("kill-session", "-t", SESSION)
    assert fresh == RESTORED and drawing != RESTORED
    assert status == 0, f"no exit {EXIT_S:.0f} s after {signum.name}:\n{after}"
    assert left == RESTORED and "Titan console" not in after
