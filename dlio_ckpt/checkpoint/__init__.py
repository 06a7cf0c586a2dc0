"""Checkpoints: strategies, formats, the commit, retention and restore (docs/architecture.md).

The engine a run uses comes from factory.make_checkpoint_engine; this package's __init__ imports
nothing, so a module read for names (registry.py, encoded.py) costs only itself.
"""
