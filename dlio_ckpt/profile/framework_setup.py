"""The CPU a TensorFlow save spends before its first byte, measured on the checkpoint it left.

A Darshan log dates a save by its first file operation. CheckpointManager.save() does its work
before that: it walks the program's trackable object graph, serialises it into the
`_CHECKPOINTABLE_OBJECT_GRAPH` proto and reads every variable out of the runtime; only then does
SaveV2 create the data file. In the log that work lies inside the epoch before the save, so the
compute per step took it (keras_tfdata.py: 11-17 ms a save, 5-8 % of a tiny epoch's compute),
and the emulated run then spent it twice: in its steps, and in its own save as
`checkpoint.framework_cpu_s`.

The log cannot show it, but the checkpoint can: its object graph is saved in it. This rebuilds
a stand-in with the same nodes, the same child names and a variable of each saved shape and type
at each variable node, saves it the way the program did (tf.train.Checkpoint.write, which is what
CheckpointManager.save calls), and takes that save's CPU on the saving thread less the CPU of the
byte work the emulation does for real on the same tensors (SaveV2 and MergeV2Checkpoints). The
stand-in's nodes are plain tf.Module objects, not the program's Keras layers and optimizer, whose
own walk can cost more: measured against keras_tfdata.py's own saves (benchmarks/realapps/
framework_cpu.py) the stand-in's figure is docs/profile.md's "save setup" row.

The only files it writes are the stand-in's checkpoints, in a temporary folder removed on return.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from dlio_ckpt.optional import available
from dlio_ckpt.profile.values import MEASURED, Value, assumed

WARMUP_SAVES = 2  # TensorFlow traces its save functions on the first calls: not a steady save's work
TIMED_SAVES = 5


@dataclass(frozen=True)
class SaveSetup:
    """Seconds of CPU a save spends outside its byte work, and what the stand-in held."""

    nodes: int
    variables: int
    save_cpu_s: float  # the stand-in's whole save, median
    bytes_cpu_s: float  # SaveV2 + MergeV2Checkpoints of the same tensors, median
    first_cpu_s: float  # the stand-in's first save in this process

    @property
    def cpu_s(self) -> float:
        """Every save's: the stand-in's save less its byte work."""
        return max(0.0, self.save_cpu_s - self.bytes_cpu_s)

    @property
    def first_extra_s(self) -> float:
        """The first save's more: its first save less a later one."""
        return max(0.0, self.first_cpu_s - self.save_cpu_s)


def setup_values(fmt: str, on_disk: str | None) -> tuple[list[Value], tuple[float, float]]:
    """`checkpoint.framework_cpu_s` and `framework_first_cpu_s` for the workload, and the seconds
    before a save's first write that the compute per step must leave out: (every save's, the first
    save's more)."""
    setup = tensorflow_save_setup(on_disk) if fmt == "tensorflow" and on_disk else None
    if setup is None:
        why = ("the checkpoint is not on disk here (or TensorFlow is missing)" if fmt == "tensorflow" else
               f"measured for TensorFlow checkpoints only ({fmt} here)")
        return [assumed("checkpoint.framework_cpu_s", 0.0, f"{why}: the save's work before its first write "
                        "(walking the program's objects) is not in the log, and is counted in compute per step")], (0.0, 0.0)
    stand_in = f"a stand-in of {os.path.basename(on_disk)}'s object graph ({setup.nodes} nodes, {setup.variables} variables)"
    how = (f"on disk: saves of {stand_in}, CPU {1e3 * setup.save_cpu_s:.1f} ms less SaveV2 + "
           f"MergeV2Checkpoints' {1e3 * setup.bytes_cpu_s:.1f} ms of the same tensors (medians of {TIMED_SAVES}); "
           "taken out of the epoch before each save, where the log counts it")
    first = (f"on disk: the first save of {stand_in} in a process, {1e3 * setup.first_cpu_s:.1f} ms of CPU, "
             f"less a later one's; taken out of the epoch before the first save")
    return [Value("checkpoint.framework_cpu_s", round(setup.cpu_s, 4), MEASURED, how),
            Value("checkpoint.framework_first_cpu_s", round(setup.first_extra_s, 4), MEASURED, first)], \
        (setup.cpu_s, setup.first_extra_s)


def tensorflow_save_setup(prefix: str) -> SaveSetup | None:
    """The setup of a save like the one that wrote `prefix` (a TensorFlow checkpoint's `ckpt-N`),
    or None when TensorFlow is missing or the checkpoint has no object graph (a name-based save).
    The byte work is timed first, so that the stand-in's first save finds SaveV2 warm: what its first
    save costs beyond a later one is then the framework's first-time work alone (the emulation's own
    first SaveV2 pays the kernels' warm-up for real)."""
    if not available("tensorflow") or not os.path.exists(prefix + ".index"):
        return None
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(prefix)
    if not reader.has_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"):
        return None
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    root, variables = _stand_in(tf, graph, reader)
    if root is None or not variables:
        return None
    names = sorted(reader.get_variable_to_shape_map())
    tensors = [reader.get_tensor(name) for name in names]
    with tempfile.TemporaryDirectory(prefix="dlio_ckpt-save-setup-") as scratch:
        def byte_work(k: int) -> None:
            target = os.path.join(scratch, f"bytes-{k}")
            tf.raw_ops.SaveV2(prefix=target + "_temp/part", tensor_names=names, shape_and_slices=[""] * len(names),
                              tensors=tensors)
            tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[target + "_temp/part"], destination_prefix=target,
                                          delete_old_dirs=True)

        def whole(k: int) -> None:
            root.write(os.path.join(scratch, f"standin-{k}"))

        _, bytes_cpu = _cpu(byte_work)
        first_cpu, save_cpu = _cpu(whole)
    return SaveSetup(len(graph.nodes), variables, save_cpu, bytes_cpu, first_cpu)


def _cpu(save) -> tuple[float, float]:
    """The saving thread's CPU seconds of the first call, and the median of the timed calls after the
    warm-up ones (CPU, not wall: a busy machine stretches the wall far more)."""
    spent = []
    for k in range(WARMUP_SAVES + TIMED_SAVES):
        began = time.thread_time()
        save(k)
        spent.append(time.thread_time() - began)
    return spent[0], statistics.median(spent[WARMUP_SAVES:])


def _stand_in(tf, graph, reader):
    """A tf.train.Checkpoint whose object graph has the saved one's nodes and names: a tf.Variable
    holding the saved value at each variable node, a tf.Module at every other; the root's
    `save_counter` is the Checkpoint's own. Returns (checkpoint, variables)."""
    built: dict[int, object] = {}
    count = 0

    def build(index: int):
        nonlocal count
        if index in built:
            return built[index]
        node = graph.nodes[index]
        value = [a for a in node.attributes if a.name == "VARIABLE_VALUE"]
        if value:
            built[index] = tf.Variable(reader.get_tensor(value[0].checkpoint_key))
            count += 1
            return built[index]
        module = tf.Module()
        built[index] = module
        for child in node.children:
            setattr(module, child.local_name, build(child.node_id))
        return module

    children = {c.local_name: build(c.node_id) for c in graph.nodes[0].children if c.local_name != "save_counter"}
    if not children:
        return None, 0
    checkpoint = tf.train.Checkpoint(**children)
    counter = checkpoint.save_counter  # made now, as CheckpointManager.save() makes it before its first write
    key = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"
    if reader.has_tensor(key):
        counter.assign(reader.get_tensor(key))
    return checkpoint, count + 1
