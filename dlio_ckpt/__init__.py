"""dlio_ckpt: emulate the storage I/O of deep-learning training and checkpointing.

The package is layered one way (docs/architecture.md, "Layers"; tests/test_architecture.py):
commands -> config loader -> engine -> checkpoint -> codec, state -> plan -> formats -> metrics,
trace -> storage -> the RunConfig and errors. Only engine/ and storage/ touch files.
"""

__version__ = "0.1.0"
