"""The tf.data reader lets go of an epoch's finished iterator off the training loop's thread.

Deleting the iterator (tf.data tearing down its pipeline) took 0.7-1.2 s at each epoch's end of
the emulated keras_tfdata, a stall the program it stands for does not have
(engine/tf_reader.release_in_background). Checked on real TFRecords with TensorFlow: the epoch's
batches are all there, and the iterator is deleted on the release thread, not the caller's."""

from __future__ import annotations

import threading
import weakref

import pytest

from dlio_ckpt.engine import tf_reader


def _records(folder, files: int, per_file: int) -> list[str]:
    tf = pytest.importorskip("tensorflow")
    paths = []
    for f in range(files):
        path = str(folder / f"img_{f}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(per_file):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([i]) * 48])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(path)
    return paths


def test_an_epochs_iterator_is_deleted_on_the_release_thread(tmp_path, monkeypatch):
    paths = _records(tmp_path, files=3, per_file=5)
    pipeline = tf_reader.TFRecordPipeline(batch_size=4, read_threads=1, prefetch_size=2, shuffle_buffer_size=8,
                                          seed=1, drop_last=False)
    deleted_on: list[str] = []
    original = pipeline.prepare

    def watched_prepare(*args):
        original(*args)
        make = pipeline._dataset.as_numpy_iterator

        def iterator():
            it = make()
            weakref.finalize(it, lambda: deleted_on.append(threading.current_thread().name))
            return it
        monkeypatch.setattr(pipeline._dataset, "as_numpy_iterator", iterator, raising=False)

    monkeypatch.setattr(pipeline, "prepare", watched_prepare)
    batches = list(pipeline.batches(paths, [5, 5, 5]))
    assert [b.samples for b in batches] == [4, 4, 4, 3]
    assert sum(b.payload_bytes for b in batches) == 15 * 48
    for thread in threading.enumerate():
        if thread.name == "tf.data iterator release":
            thread.join(timeout=30)
    assert deleted_on == ["tf.data iterator release"]
