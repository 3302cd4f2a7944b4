"""Versioned fixed-size wire layouts declared as data, for the hand-written hot-path codecs.

A layout is a tuple of (field name, struct code, first version with the field) in wire order;
`compile_fields` keeps the fields a version has and packs them big-endian, as Kafka does.

Invariants: the struct and the names list the same fields in the same order; a field appears
in every version from its first one on (Kafka's non-flexible schemas only ever add fields).
"""

from __future__ import annotations

import struct

Fields = tuple[tuple[str, str, int], ...]

SIZE_AND_CORRELATION = struct.Struct(">ii")  # response frame: size prefix, then header v0
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")


def compile_fields(fields: Fields, version: int) -> tuple[struct.Struct, tuple[str, ...]]:
    present = [f for f in fields if f[2] <= version]
    return struct.Struct(">" + "".join(code for _, code, _ in present)), tuple(name for name, _, _ in present)
