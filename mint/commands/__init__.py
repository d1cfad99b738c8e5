"""Command groups of the ``mint`` CLI, one module per area, registered in ``mint.cli``."""
