"""Sub-commands of the `mlxspec` CLI (see `mlxspec.cli`)."""
