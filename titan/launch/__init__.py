"""Starting the processes of one run: ``titan launch`` (several local processes)."""
