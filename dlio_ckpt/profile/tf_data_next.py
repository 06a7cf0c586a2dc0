"""What a training loop pays in each next() on a tf.data iterator whose batch is ready, measured here.

A tf.data program's loop calls next() every step. With the batch already in the prefetch buffer
the call still costs the iterator's GetNext and the wrapping of the output tensors: keras_tfdata.py's
loop spent 0.27-0.40 ms a step there (its clock's data wait after each epoch's first batch), 7-9 %
of its 4 ms step. Nothing is read then, so the log cannot show it: the profile, which ends each
epoch's loop where its save starts, would count it as compute, and the emulated run, whose own
tf.data pipeline pays it again each step, would pay it twice.

So it is measured on a stand-in, as framework_setup.py measures a save's setup: an in-memory
pipeline of the profiled record size and batch, mapped in parallel, batched and prefetched as a
program's is (AUTOTUNE), iterated with the loop sleeping between calls (compute that leaves the
cores to the pipeline's threads, as a framework's kernels release the interpreter), the median call
over the epochs after a first one, each epoch's first call left out (the pipeline starting).
Measured this way on this machine: 0.20-0.30 ms (the program's own, under its real compute, is a
little more). Nothing is written.
"""

from __future__ import annotations

import os
import statistics
import time

from dlio_ckpt.optional import available

STEPS = 32  # batches an epoch of the stand-in
EPOCHS = 3  # the first warms the pipeline (tracing its functions) and is not timed
LOOP_COMPUTE_S = 0.002  # the stand-in loop's compute between calls: its prefetch buffer refills
# The call hands over a batch the pipeline's threads already assembled, whatever its size: the
# stand-in's batches hold at most this much (a 140 MB unet3d record x 4 would not fit in memory)
BATCH_BYTES_CAP = 1 << 20


def stand_in_record_bytes(record_bytes: int, batch: int) -> int:
    """The stand-in's record: the profiled one, cut so that a batch holds at most BATCH_BYTES_CAP."""
    return max(1, min(record_bytes, BATCH_BYTES_CAP // max(1, batch)))


def ready_batch_next_s(record_bytes: int, batch: int) -> float | None:
    """Median seconds of a next() that finds its batch ready; None without TensorFlow."""
    if not available("tensorflow"):
        return None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    batch = max(1, batch)
    records = np.zeros((STEPS * batch, stand_in_record_bytes(record_bytes, batch)), dtype=np.uint8)
    dataset = (tf.data.Dataset.from_tensor_slices((records, np.arange(len(records))))
               .map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y % 10), num_parallel_calls=tf.data.AUTOTUNE)
               .batch(batch)
               .prefetch(tf.data.AUTOTUNE))
    calls: list[float] = []
    for epoch in range(EPOCHS):
        iterator = iter(dataset)
        for step in range(STEPS):
            began = time.perf_counter()
            next(iterator)
            if epoch and step:
                calls.append(time.perf_counter() - began)
            time.sleep(LOOP_COMPUTE_S)
    return statistics.median(calls)
