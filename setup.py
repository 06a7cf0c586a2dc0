"""The optional C extension only; everything else is declared in pyproject.toml.

dlio_ckpt.storage._trace_c does the traced POSIX handle's hot paths in C (storage/traced.py).
`optional=True`: without a compiler or Python's headers the install still succeeds, and the
tracer records in pure Python. Linux only: elsewhere time.perf_counter reads another clock.
"""

import sys

from setuptools import Extension, setup

TRACE_C = Extension("dlio_ckpt.storage._trace_c", ["dlio_ckpt/storage/_trace_c.c"], optional=True,
                    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])

setup(ext_modules=[TRACE_C] if sys.platform.startswith("linux") else [])
