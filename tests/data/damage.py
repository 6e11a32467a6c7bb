"""Realistic damage to real JPEG bytes, for planting bad files that pass or fail given checks."""

from __future__ import annotations

import random


def _segments(data: bytes):
    """(marker, start, length) of each header segment from SOI up to and including SOS."""
    pos = 2
    while True:
        marker, length = data[pos + 1], int.from_bytes(data[pos + 2 : pos + 4], "big")
        yield marker, pos, length
        if marker == 0xDA:
            return
        pos += 2 + length


def damage_huffman_table(data: bytes) -> bytes:
    """Overwrite the code counts of the first Huffman table (DHT), keeping every segment length:
    the header walk of the startup check passes, while libjpeg (DALI, PIL) stops with "Bogus
    Huffman table definition"."""
    out = bytearray(data)
    _, pos, _ = next(s for s in _segments(data) if s[0] == 0xC4)
    out[pos + 5 : pos + 21] = b"\xff" * 16  # 16 counts of codes per bit length: far over 256 codes
    return bytes(out)


def damage_scan_data(data: bytes, seed: int, hits: int = 8) -> bytes:
    """Overwrite `hits` runs of 4 random bytes inside the entropy-coded scan data (after the
    first quarter of it), as a bad disk sector or a bit-rotting copy would: headers and the
    end-of-image marker stay intact."""
    _, sos, length = next(s for s in _segments(data) if s[0] == 0xDA)
    start, end = sos + 2 + length, len(data) - 2
    rng, out = random.Random(seed), bytearray(data)
    for _ in range(hits):
        pos = rng.randrange(start + (end - start) // 4, end - 16)
        out[pos : pos + 4] = bytes(rng.randrange(256) for _ in range(4))
    return bytes(out)


def enlarge_frame(data: bytes, width: int, height: int) -> bytes:
    """Write another image size into the frame header (SOF), as a corrupt or hostile file may
    claim: PIL refuses sizes beyond its decompression-bomb limit before decoding."""
    out = bytearray(data)
    _, pos, _ = next(s for s in _segments(data) if 0xC0 <= s[0] <= 0xCF and s[0] not in (0xC4, 0xC8, 0xCC))
    out[pos + 5 : pos + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(out)
