"""dlio_ckpt-profile's measure of a TensorFlow save's work before its first write
(profile/framework_setup.py): a stand-in rebuilt from the checkpoint's own object graph, checked
against the checkpoint by TensorFlow's reader; the figures it gives, and the YAML values."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dlio_ckpt.profile.framework_setup import _stand_in, setup_values, tensorflow_save_setup



@pytest.fixture(scope="module")
def tf():
    """TensorFlow, imported by the tests that use it rather than at collection, where every pytest
    worker would pay its ~4 s of import whether or not it runs them."""
    return pytest.importorskip("tensorflow")


def _net(tf):
    """Nested modules, a list of layers and an optimizer-like holder of slot lists, as a Keras
    program's graph nests them (names with digits, underscores, several levels)."""
    net = tf.Module()
    net.layers = [tf.Module(), tf.Module()]
    net.layers[0].kernel = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4))
    net.layers[1].bias = tf.Variable(np.ones(5, np.float64))
    net._slots = {"m": tf.Variable(np.zeros((2, 2), np.float16))}
    return net


def _program_checkpoint(tf, folder) -> str:
    ckpt = tf.train.Checkpoint(step=tf.Variable(7, dtype=tf.int64), net=_net(tf))
    manager = tf.train.CheckpointManager(ckpt, str(folder), max_to_keep=2)
    manager.save()
    return manager.save()  # ckpt-2, as a program's later save


def _graph(tf, prefix: str):
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return graph


def test_the_stand_in_saves_the_programs_object_graph_and_tensors(tf, tmp_path):
    prefix = _program_checkpoint(tf, tmp_path / "program")
    reader = tf.train.load_checkpoint(prefix)
    root, variables = _stand_in(tf, _graph(tf, prefix), reader)
    written = root.write(str(tmp_path / "standin" / "x"))
    again = tf.train.load_checkpoint(written)
    # the same keys (every variable at the same place in the graph), shapes, types and values
    assert again.get_variable_to_shape_map() == reader.get_variable_to_shape_map()
    assert again.get_variable_to_dtype_map() == reader.get_variable_to_dtype_map()
    for key in reader.get_variable_to_shape_map():
        if key != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_array_equal(again.get_tensor(key), reader.get_tensor(key))
    assert len(_graph(tf, written).nodes) == len(_graph(tf, prefix).nodes)
    # step, save_counter, the kernel, the bias and the slot: 5 variables
    assert variables == 5


def test_the_setup_is_the_stand_ins_save_less_its_byte_work(tf, tmp_path):
    prefix = _program_checkpoint(tf, tmp_path / "program")
    setup = tensorflow_save_setup(prefix)
    assert setup.nodes == len(_graph(tf, prefix).nodes) and setup.variables == 5
    # the save's walk of its object graph costs CPU beyond SaveV2 + MergeV2Checkpoints of the same
    # tensors (CPU, not wall: medians of 5 on the saving thread: 5-6 ms against 1.2-2.0 ms here). A
    # first save costs more only in a process that has not saved before (this test's program saved)
    assert setup.bytes_cpu_s > 0 and setup.save_cpu_s > setup.bytes_cpu_s
    assert setup.cpu_s == setup.save_cpu_s - setup.bytes_cpu_s > 0
    # it writes only in its own temporary folder: the program's checkpoint folder is as it was
    assert sorted(os.listdir(tmp_path / "program")) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index",
                                                        "ckpt-2.data-00000-of-00001", "ckpt-2.index"]


def test_the_values_name_what_was_measured_and_what_was_not(tf, tmp_path):
    prefix = _program_checkpoint(tf, tmp_path / "program")
    values, (every, first) = setup_values("tensorflow", prefix)
    by_key = {v.key: v for v in values}
    assert by_key["checkpoint.framework_cpu_s"].how == "measured" and by_key["checkpoint.framework_cpu_s"].value >= 0
    assert "stand-in of ckpt-2's object graph" in by_key["checkpoint.framework_cpu_s"].why
    assert by_key["checkpoint.framework_first_cpu_s"].how == "measured"
    assert every == pytest.approx(by_key["checkpoint.framework_cpu_s"].value, abs=1e-4)
    assert first == pytest.approx(by_key["checkpoint.framework_first_cpu_s"].value, abs=1e-4)
    # gone from disk, or another framework's: 0, said to be assumed, nothing taken out of the epochs
    for fmt, path in (("tensorflow", str(tmp_path / "gone" / "ckpt-1")), ("torch", prefix)):
        values, setup = setup_values(fmt, path)
        assert setup == (0.0, 0.0)
        assert [(v.key, v.value, v.how) for v in values] == [("checkpoint.framework_cpu_s", 0.0, "assumed")]
