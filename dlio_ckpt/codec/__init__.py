"""Checkpoint encodings (`checkpoint.encoding=`): what of the state reaches storage, and how."""
