"""Starting the processes of one run: ``titan launch`` (several local processes; the command is
:mod:`titan.commands.launch`)."""
