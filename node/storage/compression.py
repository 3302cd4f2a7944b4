"""Record-batch codecs, for topics whose compression.type makes the node recompress what producers send.

Kafka's codecs by the batch attribute's low 3 bits: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd; all through
cramjam (one well-kept library for the four). Formats are what Kafka's clients read:
- gzip: a gzip member; zstd: a zstd frame;
- snappy: written raw (librdkafka's and Java's readers take raw snappy as well as the xerial framing Java
  writes); read in either form;
- lz4: an LZ4 frame of independent blocks (Kafka's Java reader decompresses each block on its own, so
  linked blocks, the LZ4 library's default, would not do), with xxhash checksums, which every reader checks
  or skips.

Invariants: `decompress` raises CodecError (and nothing else) on data that does not decode, or whose header
claims more than MAX_DECOMPRESSED_BYTES (the codecs allocate what a header claims: a mutated snappy length or
zstd content size made one fuzzed batch allocate 23 GB); `compress` returns bytes that `decompress` turns back
into the input.
"""

from __future__ import annotations

import struct

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODECS = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}
# Java's snappy framing (xerial SnappyOutputStream): magic, version, compatible version, then
# (length, block) pairs, big-endian lengths.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_BYTES = 16
XERIAL_BLOCK_LENGTH = struct.Struct(">i")


MAX_DECOMPRESSED_BYTES = 1 << 30  # far above any batch Kafka's clients write (max.message.bytes ~1 MiB)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
LZ4_MAGIC = b"\x04\x22\x4d\x18"


class CodecError(ValueError):
    """Compressed data that does not decode."""


def compress(codec: int, data) -> bytes:
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(data if isinstance(data, bytes) else bytes(data))  # it takes bytes only
        return bytes(compressor.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CodecError(f"unknown codec {codec}")


def _claimed_size(codec: int, data: bytes) -> int:
    """The uncompressed size a header states (0 when it states none): snappy's varint, zstd's and LZ4 frames'
    content size fields."""
    if codec == SNAPPY and not data.startswith(XERIAL_MAGIC):
        size = shift = 0
        for byte in data[:10]:
            size |= (byte & 0x7F) << shift
            if byte < 0x80:
                return size
            shift += 7
        raise CodecError("snappy: bad length")
    if codec == ZSTD and data[:4] == ZSTD_MAGIC and len(data) >= 6:
        descriptor = data[4]
        fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
        field = (0, 2, 4, 8)[fcs_flag] if fcs_flag or not single_segment else 1
        start = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
        if not field:
            return 0
        if start + field > len(data):
            raise CodecError("zstd: truncated frame header")
        size = int.from_bytes(data[start:start + field], "little")
        return size + 256 if field == 2 else size
    if codec == LZ4 and data[:4] == LZ4_MAGIC and len(data) >= 14 and data[4] & 0x08:
        return int.from_bytes(data[6:14], "little")
    return 0


def decompress(codec: int, data) -> bytes:
    if codec in (SNAPPY, ZSTD, LZ4):
        data = bytes(data)
        claimed = _claimed_size(codec, data)
        if claimed > MAX_DECOMPRESSED_BYTES:
            raise CodecError(f"codec {codec}: claims {claimed} bytes uncompressed, over {MAX_DECOMPRESSED_BYTES}")
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == SNAPPY:
            return _snappy(bytes(data))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except CodecError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError, ValueError, ...
        raise CodecError(f"codec {codec}: {exc}") from None
    raise CodecError(f"unknown codec {codec}")


def _snappy(data: bytes) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = bytearray()
    position = XERIAL_HEADER_BYTES
    while position < len(data):
        if position + XERIAL_BLOCK_LENGTH.size > len(data):
            raise CodecError("snappy: truncated xerial block length")
        (length,) = XERIAL_BLOCK_LENGTH.unpack_from(data, position)
        position += XERIAL_BLOCK_LENGTH.size
        if length < 0 or position + length > len(data):
            raise CodecError("snappy: xerial block past the end")
        out += cramjam.snappy.decompress_raw(data[position:position + length])
        position += length
    return bytes(out)
