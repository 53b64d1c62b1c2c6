"""Typed keys applied one at a time, in the order typed.

Textual hands each key the terminal sends to the widget focused *when the key is read*, and the
key's effect (a binding that moves the focus, opens a screen) comes later, when the key has gone
up through the widgets to the app. Keys read in one burst (typed ahead, or a packet of an SSH
session) are therefore all handed to the first field: ``Tab Tab 9`` types ``9`` into the field
the two tabs were meant to leave. :class:`KeyQueue` holds each key until the one before it is
handled, and until the screen then shown has handled what it had queued (a screen just opened
composes its fields and focuses the first one first), so that every key reaches the widget that
has the focus once the keys before it have acted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextvars import Context
from typing import Any

from textual import events
from textual.app import App
from textual.timer import Timer

# A key not seen handled in this time (the widget it was handed to was removed before reading
# it) lets the next one through: a lost key never holds the keys after it for longer.
KEY_LOST_S = 1.0


class TypedKey(events.Key):
    """A key as the console hands it on: it tells ``handled`` when a widget stops it (it took the
    key) and the app tells it when the key has gone up to the app's bindings.

    Args:
        key: the key's name (Textual's, ``tab``, ``9``, ``ctrl+r``).
        character: its character, or None.
        handled: called with the key when a widget stops it.
    """

    __slots__ = ["_handled"]

    def __init__(self, key: str, character: str | None, handled: Callable[[TypedKey], None]):
        super().__init__(key, character)
        self._handled = handled

    def stop(self, stop: bool = True) -> TypedKey:
        """Stop the key (Textual's ``Message.stop``), and tell the queue it was handled."""
        super().stop(stop)
        if stop:
            self._handled(self)
        return self


# Keys that act within the focused field: they need no other field to be there.
FIELD_KEYS = frozenset({"backspace", "delete", "left", "right", "home", "end"})


def _within_field(key: events.Key) -> bool:
    """Whether ``key`` acts within the focused field (a character, :data:`FIELD_KEYS`)."""
    return key.is_printable or key.key in FIELD_KEYS


# Widgets handle it as the key it is (Textual names a message's handler after its class).
TypedKey.handler_name = events.Key.handler_name


class KeyQueue:
    """The keys read and not yet applied. One key is in flight at a time: :meth:`read` queues a
    key, :meth:`handled` ends the flight of the key in flight; the next one is then posted to
    the app through the queue of the screen shown (after what that screen had queued).

    Args:
        app: the app the keys are posted to (its ``on_event`` hands a :class:`TypedKey` on).
    """

    def __init__(self, app: App[Any]) -> None:
        self._app = app
        self._waiting: deque[TypedKey] = deque()
        self._in_flight: TypedKey | None = None
        self._lost_timer: Timer | None = None
        self._holders: set[object] = set()

    def read(self, event: events.Key) -> None:
        """Queue a key the terminal sent (posted once the screen shown has handled what it had
        queued, when no key is in flight)."""
        # Made outside the app's context, as the driver makes a key: with no sender, as Textual
        # stops a message going up to the widget that sent it.
        key = Context().run(TypedKey, event.key, event.character, self.handled)
        self._waiting.append(key)
        if self._in_flight is None:
            self._after_screen(self._post_next)

    def handled(self, key: TypedKey) -> None:
        """``key`` has been handled (stopped, or gone up to the app): the next may go."""
        if key is not self._in_flight:
            return
        self._in_flight = None
        if self._lost_timer is not None:
            self._lost_timer.stop()
            self._lost_timer = None
        if self._waiting:
            # After the app has handled the message it is on (the key's bindings act then).
            self._app.call_later(self._after_screen, self._post_next)

    def hold(self, holder: object) -> None:
        """Hold the keys read from now on that could act beyond the focused field (a tab, a
        binding) until ``holder`` releases them (a form mounting its fields in parts: such a key
        typed meanwhile acts once every field is there); characters and the keys that edit
        within a field go on (:func:`_within_field`), until a held key is ahead of them."""
        self._holders.add(holder)

    def release(self, holder: object) -> None:
        """End ``holder``'s hold; the keys held go once no other holds them."""
        self._holders.discard(holder)
        if not self._holders:
            self._after_screen(self._post_next)

    def _after_screen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the screen shown has handled the messages it has queued (a
        screen just opened composes its fields and focuses the first one)."""
        if not self._app.screen.call_later(callback):  # a screen closing: at once
            callback()

    def _post_next(self) -> None:
        if self._in_flight is not None or not self._waiting:
            return
        if self._holders and not _within_field(self._waiting[0]):
            return
        key = self._in_flight = self._waiting.popleft()
        self._lost_timer = self._app.set_timer(KEY_LOST_S, lambda: self.handled(key))
        self._app.post_message(key)
