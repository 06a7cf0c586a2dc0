"""Import optional dependencies with an install hint instead of a traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

from dlio_ckpt.errors import MissingDependency

# module name -> (pip extra of this project, what needs it)
_EXTRAS = {
    "tensorflow": ("tensorflow", "reader=tensorflow and the TensorFlow checkpoint format"),
    "darshan": ("darshan", "Darshan log analysis (PyDarshan)"),
    "matplotlib": ("darshan", "plots in the analysis reports"),
    "pandas": ("darshan", "Darshan log analysis (PyDarshan)"),
    "torch": (None, "the torch.save checkpoint format"),
}


def require(module: str) -> ModuleType:
    """Import `module` or raise MissingDependency naming the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra, purpose = _EXTRAS.get(module, (None, "this feature"))
        hint = f"pip install 'dlio_ckpt[{extra}]'" if extra else f"pip install {module}"
        raise MissingDependency(
            f"{module} is needed for {purpose} but is not installed ({exc}); install it with: {hint}"
        ) from exc


def available(module: str) -> bool:
    """True when `module` imports."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
