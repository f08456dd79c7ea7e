"""Training: the Lightning module, callbacks, optimizer, tracking and the CLI."""
