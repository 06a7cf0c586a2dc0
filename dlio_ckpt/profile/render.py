"""A Profile -> the workload YAML text, one comment per value (grade and source), the values it
could not infer listed in the header. Written by hand, not by a YAML library, because the comments
are the point; the text is parsed back with OmegaConf in the tests and before it is written."""

from __future__ import annotations

import json
from collections import OrderedDict

from dlio_ckpt.profile.profile import Profile

SECTIONS = ("dataset", "reader", "train", "checkpoint", "model")


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    return json.dumps(text) if not text.replace("_", "").replace("-", "").replace(".", "").isalnum() else text


def render(profile: Profile, name: str, command: str) -> str:
    sections: OrderedDict[str, list] = OrderedDict((s, []) for s in SECTIONS)
    comments: dict[str, str] = {}
    for v in profile.values:
        if v.key.startswith("_comment."):
            comments[v.key.split(".", 1)[1]] = f"{v.value} ({v.how}, {v.why})"
            continue
        section, key = v.key.split(".", 1)
        sections[section].append(v)
    lines = ["# @package _global_",
             f"# Written by dlio_ckpt-profile from the Darshan logs of a real run: {command}",
             *[f"# {note}" for note in profile.notes],
             "# Grades: measured (counted or timed by Darshan, or read from the file on disk), inferred (derived",
             "# by the rule named), given (command line), assumed (the log cannot show it: documented default).",
             "# Not inferred (left at their defaults, docs/profile.md):"]
    missing = profile.not_inferred
    lines += [f"#   {v.key} = {_scalar(v.value)}: {v.why}" for v in missing] or ["#   (none)"]
    if "read_pattern" in comments:
        lines.append(f"# dataset reads: {comments['read_pattern']}")
    if "checkpoint" in comments:
        lines.append(f"# checkpoints: {comments['checkpoint']}")
    lines += [f"workload: {name}", f"description: profiled from {len(profile.job.logs)} Darshan log(s) by dlio_ckpt-profile"]
    for section, values in sections.items():
        if section == "model" and profile.checkpoint.model_yaml:
            continue
        if not values and section != "checkpoint":
            continue
        lines.append(f"{section}:")
        for v in values:
            lines.append(f"  {v.key.split('.', 1)[1]}: {_scalar(v.value)}    # {v.how}: {v.why}")
        if section == "checkpoint" and any(v.key == "checkpoint.enabled" and v.value for v in values):
            lines.append("  checksum: none    # assumed: a checksum is the program's own computation, not in the log")
    if profile.checkpoint.model_yaml:
        if "model" in comments:
            lines.append(f"# {comments['model']}")
        lines += profile.checkpoint.model_yaml.rstrip("\n").split("\n")
    elif sections["model"]:
        lines.append("  name: profiled")
    return "\n".join(lines) + "\n"
