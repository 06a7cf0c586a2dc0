"""A tensor list -> the explicit model section the current schema accepts (pure), and its YAML.

The schema (schema.py ModelConfig, plan/model.py `_explicit_shards`) declares an explicit
model as a list of tensor element counts at one model element size (`layer_parameters` x
`model_dtype_bytes`), a list of optimizer tensors at one optimizer element size
(`optimization_groups` x `optimizer_dtype_bytes`, one state each) and a byte blob
(`model_size_bytes`), with each listed tensor's name and shape (`layer_names`,
`optimization_group_names`, `layer_shapes`, `optimization_group_shapes`: what the checkpoint's
container records beside the bytes, so the emulated container is the program's byte for byte). So:

- the element size holding most of a role's bytes becomes that role's dtype size;
- every tensor of that size is one entry (its element count), in the checkpoint's order; tensors
  of other types (BatchNorm's int64 `num_batches_tracked`, an optimizer's int64 step counter) are
  layer entries too, model tensors in their places, optimizer ones after them, their types in
  `layer_dtypes`;
- where a type has no schema name, tensors of another size are added, byte for byte, to
  `model_size_bytes`;
- each entry carries its name, shape and dtype as a YAML comment as well.

Bytes are exact (the sum of the section equals the sum of the tensors).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from dlio_ckpt.schema import TENSOR_DTYPES
from dlio_ckpt.describe.readers import Tensor, TensorList

_SIZES = (1, 2, 4, 8)  # the element sizes model_dtype_bytes / optimizer_dtype_bytes accept


def dominant_size(tensors: list[Tensor], default: int = 4) -> int:
    weights = Counter()
    for t in tensors:
        if t.itemsize in _SIZES:
            weights[t.itemsize] += t.nbytes
    return max(weights, key=lambda size: (weights[size], size)) if weights else default


def model_section(listing: TensorList, name: str) -> dict:
    """The `model:` mapping plus, under '_notes', what each entry stands for (for the YAML comments)."""
    model = [t for t in listing.tensors if t.role == "model" and t.numel]
    optimizer = [t for t in listing.tensors if t.role == "optimizer" and t.numel]
    mdt, odt = dominant_size(model), dominant_size(optimizer)
    # model tensors of several element types keep their places and types (model.layer_dtypes), so
    # the checkpoint holds as many tensors as the program's (a container per tensor under DCP)
    # optimizer tensors of another element size (Adam's or Keras's int64 step) too, after the model's,
    # each in its own name, type and shape, where every one of those types is one the schema knows
    odd = [t for t in optimizer if t.itemsize != odt]
    typed = (any(t.itemsize != mdt for t in model) or bool(odd)) and all(t.dtype in TENSOR_DTYPES for t in model + odd)
    layers = model + odd if typed else [t for t in model if t.itemsize == mdt]
    groups = [t for t in optimizer if t.itemsize == odt]
    folded = [] if typed else [t for t in model if t.itemsize != mdt] + odd
    return {
        "name": name,
        "kind": "explicit",
        "model_size_bytes": sum(t.nbytes for t in folded),
        "model_dtype_bytes": mdt,
        "layer_parameters": [t.numel for t in layers],
        "layer_dtypes": [t.dtype for t in layers] if typed else [],
        "optimizer_dtype_bytes": odt,
        "optimizer_states": 1,
        "optimization_groups": [t.numel for t in groups],
        "layer_names": [t.name for t in layers],
        "optimization_group_names": [t.name for t in groups],
        "layer_shapes": [list(t.shape) for t in layers],
        "optimization_group_shapes": [list(t.shape) for t in groups],
        "extra_state": [{"name": e.name, "bytes": e.blob} if e.blob >= 0 else {"name": e.name, "value": e.value}
                        for e in listing.entries],
        "write_order": _write_order(listing, [t.name for t in layers + groups] + [e.name for e in listing.entries]),
        "_notes": {"layer_parameters": layers, "optimization_groups": groups, "model_size_bytes": folded},
    }


def _write_order(listing: TensorList, planned: list[str]) -> list[str]:
    """The listed names in the order the checkpoint's data file holds them (model.write_order), when
    it records one and it is not the order the emulation writes them by default (layers, optimizer
    groups, extra_state): TensorFlow's SaveV2 appends in its object graph's order."""
    known = set(planned)
    order = [name for name in listing.write_order if name in known]
    return [] if order == planned[:len(order)] and len(order) == len(planned) else order


def section_bytes(section: dict) -> int:
    """The bytes the section declares (what the emulation writes per full checkpoint)."""
    if section.get("layer_dtypes"):
        layers = sum(n * TENSOR_DTYPES[d] for n, d in zip(section["layer_parameters"], section["layer_dtypes"]))
    else:
        layers = section["model_dtype_bytes"] * sum(section["layer_parameters"])
    return (section["model_size_bytes"] + layers
            + section["optimizer_dtype_bytes"] * section["optimizer_states"] * sum(section["optimization_groups"]))


def _describe(t: Tensor) -> str:
    return f"{t.name} {list(t.shape)} {t.dtype}"


def to_yaml(listing: TensorList, section: dict, file_bytes: int | None) -> str:
    notes = section["_notes"]
    by_dtype = Counter()
    for t in listing.tensors:
        by_dtype[t.dtype] += t.nbytes
    total = sum(t.nbytes for t in listing.tensors)
    on_disk = f", {file_bytes:,} bytes on disk" if file_bytes is not None else ""
    lines = [
        f"# Written by dlio_ckpt-describe-model from {Path(listing.path).name} ({listing.format}{on_disk}).",
        f"# {len(listing.tensors)} tensors, {total:,} bytes: "
        + ", ".join(f"{dtype} {nbytes:,} B" for dtype, nbytes in by_dtype.most_common())
        + (f"; {listing.other_entries} non-tensor entries (model.extra_state)" if listing.other_entries else "") + ".",
        "# Tensors of several element types are listed with model.layer_dtypes (an optimizer's of another type",
        "# after the model's), each with its name and shape (model.layer_names, layer_shapes, ...).",
        "model:",
        f"  name: {section['name']}",
        "  kind: explicit",
    ]
    folded = notes["model_size_bytes"]
    if folded:
        lines.append("  # model_size_bytes holds these tensors of another element size:")
        lines += [f"  #   {_describe(t)}: {t.nbytes} B" for t in folded]
    lines.append(f"  model_size_bytes: {section['model_size_bytes']}")
    lines.append(f"  model_dtype_bytes: {section['model_dtype_bytes']}")
    lines += _list("layer_parameters", section["layer_parameters"], notes["layer_parameters"])
    if section["layer_dtypes"]:
        lines += ["  layer_dtypes:   # one per layer_parameters entry, in the same order"]
        lines += [f"    - {d}" for d in section["layer_dtypes"]]
    lines.append(f"  optimizer_dtype_bytes: {section['optimizer_dtype_bytes']}")
    lines.append("  optimizer_states: 1   # each optimizer tensor below is its own group")
    lines += _list("optimization_groups", section["optimization_groups"], notes["optimization_groups"])
    lines += _names("layer_names", section["layer_names"])
    lines += _names("optimization_group_names", section["optimization_group_names"])
    lines += _shapes("layer_shapes", section["layer_shapes"])
    lines += _shapes("optimization_group_shapes", section["optimization_group_shapes"])
    lines += _entries(section["extra_state"])
    if section["write_order"]:
        lines += ["  write_order:   # the data file's order (the framework's, as its index's offsets record it)"]
        lines += [f"    - {json.dumps(n)}" for n in section["write_order"]]
    lines.append(f"# declared bytes: {section_bytes(section):,} (= the tensors' {total:,})")
    return "\n".join(lines) + "\n"


def _list(key: str, values: list[int], tensors: list[Tensor]) -> list[str]:
    if not values:
        return [f"  {key}: []"]
    width = max(len(str(v)) for v in values)
    return [f"  {key}:"] + [f"    - {v:<{width}}   # {_describe(t)}" for v, t in zip(values, tensors)]


def _names(key: str, names: list[str]) -> list[str]:
    """The state dict's keys, in the entries' order: the names the checkpoint's container records."""
    if not names:
        return []
    return [f"  {key}:   # the checkpoint's own names, in the order above"] + [f"    - {json.dumps(n)}" for n in names]


def _shapes(key: str, shapes: list[list[int]]) -> list[str]:
    """The tensors' shapes, in the entries' order: what the container records beside each name."""
    if not shapes:
        return []
    return [f"  {key}:   # the tensors' own shapes, in the order above"] + [f"    - {json.dumps(s)}" for s in shapes]


def _entries(entries: list[dict]) -> list[str]:
    """model.extra_state, one flow mapping per entry (JSON's syntax, which YAML reads, but floats
    always with a '.' before an exponent: YAML 1.1 reads 1e-05 as a string)."""
    if not entries:
        return []
    lines = ["  extra_state:   # the non-tensor entries, as the format serializes them (docs/fidelity.md)"]
    for entry in entries:
        body = ", ".join(f"{key}: {_flow(value)}" for key, value in entry.items())
        lines.append(f"    - {{{body}}}")
    return lines


def _flow(value) -> str:
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)
