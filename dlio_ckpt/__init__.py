"""dlio_ckpt: emulate the storage I/O of deep-learning training and checkpointing.

The package is layered one way (see docs/architecture.md): config -> plan -> engine ->
storage -> metrics/trace. Only engine/ and storage/ touch files.
"""

__version__ = "0.1.0"
