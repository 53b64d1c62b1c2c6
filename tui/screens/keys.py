"""Key help: the keys of the screen it was opened over, and what each does."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable


class KeysScreen(ModalScreen[None]):
    """A modal table of the keys that work on ``screen`` (its own and the app's).

    Keys that stock widgets bring (text editing, table cursor) are left out, those the console's
    own widgets declare (History's sort and pages, j/k in tables) are listed; ``tab`` and
    ``shift+tab`` move between fields and are listed. ``Esc`` or ``f1`` closes it (a modal
    screen does not see the app's keys, except priority ones such as ``ctrl+q``).

    Args:
        screen: the screen the help is about.
    """

    CSS_PATH = "keys.tcss"
    BINDINGS = [Binding("escape,f1", "dismiss", "Close")]

    def __init__(self, screen: Screen) -> None:
        super().__init__()
        self._about = screen

    def _key_rows(self) -> list[tuple[str, str]]:
        """``(keys, description)`` rows, keys of the same action joined (``q, ^q  Quit``)."""
        keys_by_description: dict[str, list[str]] = {}
        for active in self._about.active_bindings.values():
            ours = active.node in (self._about, self.app) or _declared_here(active)
            if ours and active.binding.description:
                keys = keys_by_description.setdefault(active.binding.description, [])
                key = self.app.get_key_display(active.binding)
                if key not in keys:  # bound on the screen and the app (n, p, h)
                    keys.append(key)
        return [(", ".join(keys), description) for description, keys in keys_by_description.items()]

    def compose(self) -> ComposeResult:
        with Vertical(id="keys-box") as box:
            box.border_title = "keys"
            box.border_subtitle = "esc or f1 to close"
            table: DataTable[str] = DataTable(show_header=False, cursor_type="none")
            table.add_columns("key", "action")
            table.add_rows(self._key_rows())
            yield table


def _declared_here(active: ActiveBinding) -> bool:
    """Whether a focused widget's binding is one of the console's own (declared by a class of
    :mod:`tui`, such as History's sort and paging keys), not a stock widget's editing or
    cursor key."""
    action = active.binding.action
    return any(
        cls.__module__.startswith("tui.")
        and any(b.action == action for b in cls.__dict__.get("BINDINGS", []))
        for cls in type(active.node).__mro__
    )
