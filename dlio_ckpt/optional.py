"""Import optional dependencies with an install hint instead of a traceback."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from dlio_ckpt.errors import MissingDependency

# module name -> (pip extra of this project, what needs it)
_EXTRAS = {
    "tensorflow": ("tensorflow", "reader=tensorflow and the TensorFlow checkpoint format"),
    "darshan": ("darshan", "Darshan log analysis (PyDarshan)"),
    "matplotlib": ("darshan", "plots in the analysis reports"),
    "pandas": ("darshan", "Darshan log analysis (PyDarshan)"),
    "torch": (None, "the torch.save checkpoint format"),
    "sklearn": ("advisor", "dlio_ckpt-advise (its surrogate models)"),
    "pyarrow": ("parquet", "dataset.format=parquet (MLPerf Storage's flux)"),
}


def missing(module: str, reason: str) -> MissingDependency:
    """The error for a missing optional library: what needs it and the pip command that installs it."""
    extra, purpose = _EXTRAS.get(module, (None, "this feature"))
    hint = f"pip install 'dlio_ckpt[{extra}]'" if extra else f"pip install {module}"
    return MissingDependency(f"{module} is needed for {purpose} but is not installed ({reason}); install it with: {hint}")


def require(module: str) -> ModuleType:
    """Import `module` or raise MissingDependency naming the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, str(exc)) from exc


def available(module: str) -> bool:
    """True when `module` is installed (found without importing it: TensorFlow takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_installed(module: str) -> None:
    """Raise MissingDependency with the install hint when `module` is not installed."""
    if not available(module):
        raise missing(module, f"no module named '{module}'")
