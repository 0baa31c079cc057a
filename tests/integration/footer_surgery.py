"""Rewrites a Parquet footer (Thrift compact protocol) to make the files old or buggy writers
left: tests of tensorfs's workarounds write them from good pyarrow files.

A struct is decoded into a dict {field id: (compact type, value)}; lists into (element type,
[values]); everything else is kept as its Python value. `write` re-encodes it."""

import struct

I8, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
BOOL_TRUE, BOOL_FALSE = 1, 2


class _Reader:
    def __init__(self, b: bytes):
        self.b, self.pos = b, 0

    def byte(self) -> int:
        self.pos += 1
        return self.b[self.pos - 1]

    def varint(self) -> int:
        v, shift = 0, 0
        while True:
            c = self.byte()
            v |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return v

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, t):
        if t in (BOOL_TRUE, BOOL_FALSE):
            return t == BOOL_TRUE
        if t == I8:
            return self.byte()
        if t in (I16, I32, I64):
            return self.zigzag()
        if t == DOUBLE:
            self.pos += 8
            return struct.unpack("<d", self.b[self.pos - 8 : self.pos])[0]
        if t == BINARY:
            n = self.varint()
            self.pos += n
            return self.b[self.pos - n : self.pos]
        if t in (LIST, SET):
            h = self.byte()
            n, et = h >> 4, h & 15
            if n == 15:
                n = self.varint()
            if et in (BOOL_TRUE, BOOL_FALSE):
                return (et, [self.byte() == 1 for _ in range(n)])
            return (et, [self.value(et) for _ in range(n)])
        if t == STRUCT:
            out, last = {}, 0
            while True:
                h = self.byte()
                if h == 0:
                    return out
                ft, delta = h & 15, h >> 4
                fid = last + delta if delta else self.zigzag()
                last = fid
                out[fid] = (ft, self.value(ft))
        raise ValueError(f"compact type {t} not handled")


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _write_value(t, v) -> bytes:
    if t in (BOOL_TRUE, BOOL_FALSE):
        return b""
    if t == I8:
        return bytes([v])
    if t in (I16, I32, I64):
        return _zigzag(v)
    if t == DOUBLE:
        return struct.pack("<d", v)
    if t == BINARY:
        return _varint(len(v)) + bytes(v)
    if t in (LIST, SET):
        et, items = v
        head = bytes([(len(items) << 4) | et]) if len(items) < 15 else bytes([0xF0 | et]) + _varint(len(items))
        if et in (BOOL_TRUE, BOOL_FALSE):
            return head + bytes(1 if x else 2 for x in items)
        return head + b"".join(_write_value(et, x) for x in items)
    if t == STRUCT:
        out, last = bytearray(), 0
        for fid in sorted(v):
            ft, fv = v[fid]
            if ft in (BOOL_TRUE, BOOL_FALSE):
                ft = BOOL_TRUE if fv else BOOL_FALSE
            delta = fid - last
            out += bytes([(delta << 4) | ft]) if 0 < delta <= 15 else bytes([ft]) + _zigzag(fid)
            out += _write_value(ft, fv)
            last = fid
        return bytes(out) + b"\x00"
    raise ValueError(f"compact type {t} not handled")


def read_footer(path) -> tuple[bytes, dict]:
    """The file's bytes before the footer, and its FileMetaData."""
    b = open(path, "rb").read()
    n = struct.unpack("<I", b[-8:-4])[0]
    return b[: len(b) - 8 - n], _Reader(b[len(b) - 8 - n : -8]).value(STRUCT)


def write_file(path, body: bytes, md: dict) -> None:
    footer = _write_value(STRUCT, md)
    open(path, "wb").write(body + footer + struct.pack("<I", len(footer)) + b"PAR1")


def column_meta_data(md: dict):
    """Every ColumnMetaData of the file (dicts, changed in place)."""
    for rg in md[4][1][1]:
        for chunk in rg[1][1][1]:
            yield chunk[3][1]
