"""The model state a rank checkpoints, evolving between checkpoints (`checkpoint.update=`)."""
