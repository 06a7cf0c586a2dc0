"""The optional C extensions only; everything else is declared in pyproject.toml.

dlio_ckpt.storage._trace_c does the traced POSIX handle's hot paths in C (storage/traced.py);
Linux only: elsewhere time.perf_counter reads another clock. dlio_ckpt.codec._lossy_c does the
LC-Checkpoint codec's per-element loops in C (codec/lossy_kernels.py). `optional=True`: without a
compiler or Python's headers the install still succeeds, the tracer records in pure Python and
the codec writes the same containers with numpy (slower). dlio_ckpt.checkpoint._torch_stream_c is
the stream torch.save writes the `torch` format through (checkpoint/torch_stream.py); without it the
Python classes it stands for issue the same calls, spending more of the save's time in Python.
"""

import sys

from setuptools import Extension, setup

TRACE_C = Extension("dlio_ckpt.storage._trace_c", ["dlio_ckpt/storage/_trace_c.c"], optional=True,
                    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])

LOSSY_C = Extension("dlio_ckpt.codec._lossy_c", ["dlio_ckpt/codec/_lossy_c.c"], optional=True,
                    extra_compile_args=["-O3", "-Wall", "-Wextra", "-Wno-unused-parameter"])

TORCH_STREAM_C = Extension("dlio_ckpt.checkpoint._torch_stream_c", ["dlio_ckpt/checkpoint/_torch_stream_c.c"],
                           optional=True, extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])

setup(ext_modules=[TRACE_C, LOSSY_C, TORCH_STREAM_C] if sys.platform.startswith("linux") else [LOSSY_C, TORCH_STREAM_C])
