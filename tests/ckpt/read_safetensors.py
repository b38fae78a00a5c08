#!/usr/bin/env python3
"""An independent safetensors reader, standard library only (struct, json, array).

The `safetensors` Python package is not installed on these machines and cannot
be installed, so this script reads the format from its public description:
8-byte little-endian header length N, N bytes of UTF-8 JSON
{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the data section, offsets relative to its start.

    read_safetensors.py FILE                    print every tensor (first values)
    read_safetensors.py FILE --expect EXP.json  compare with EXP.json:
        {"tensors": {"name": {"dtype": "F32", "shape": [..], "values": [..]}},
         "metadata": {"key": "value"}}            (metadata optional)
        values flattened, compared exactly; every tensor of the file must be
        expected and every expected tensor present.

Besides the values it checks what the safetensors library checks: the header
is a JSON object, known dtypes, shape x dtype size == byte range, tensors
contiguous from offset 0 to the end of the file with no gap or overlap; and
what zero promises on top: the data section starts at a multiple of 8.
Exit status: 0 all checks pass, 1 a check failed, 2 bad usage.
"""
import array
import json
import math
import struct
import sys

# dtype -> (element size, array typecode or None)
DTYPES = {
    "F64": (8, "d"), "F32": (4, "f"), "F16": (2, None), "BF16": (2, None),
    "I64": (8, "q"), "I32": (4, "i"), "I16": (2, "h"), "I8": (1, "b"),
    "U8": (1, "B"), "BOOL": (1, "B"),
}


class FormatError(Exception):
    pass


def decode(dtype, raw):
    size, code = DTYPES[dtype]
    n = len(raw) // size
    if dtype == "F16":
        return list(struct.unpack("<%de" % n, raw))
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    a = array.array(code)
    if a.itemsize != size:  # platform sizes differ: fall back to struct
        fmt = {"q": "q", "i": "i", "h": "h", "b": "b", "B": "B", "d": "d", "f": "f"}[code]
        vals = list(struct.unpack("<%d%s" % (n, fmt), raw))
    else:
        a.frombytes(raw)
        if sys.byteorder == "big":
            a.byteswap()
        vals = a.tolist()
    if dtype == "BOOL":
        if any(v not in (0, 1) for v in vals):
            raise FormatError("BOOL tensor holds bytes other than 0 and 1")
        vals = [bool(v) for v in vals]
    return vals


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise FormatError("%s: %d bytes, shorter than the 8-byte header length" % (path, len(data)))
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise FormatError("%s: header length %d exceeds the file (%d bytes)" % (path, n, len(data)))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise FormatError("%s: header is not a JSON object" % path)
    start = 8 + n
    if start % 8 != 0:
        raise FormatError("%s: data starts at byte %d, not a multiple of 8" % (path, start))
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError("%s: __metadata__ is not a string-to-string object" % path)
    tensors = {}
    spans = []
    for name, info in header.items():
        dtype = info["dtype"]
        if dtype not in DTYPES:
            raise FormatError("%s: tensor %r has unknown dtype %r" % (path, name, dtype))
        shape = info["shape"]
        begin, end = info["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPES[dtype][0] != end - begin:
            raise FormatError("%s: tensor %r: shape %r of %s does not match %d bytes" %
                              (path, name, shape, dtype, end - begin))
        spans.append((begin, end, name))
        tensors[name] = (dtype, shape, decode(dtype, data[start + begin:start + end]))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise FormatError("%s: tensor %r starts at %d, expected %d (gap or overlap)" % (path, name, begin, pos))
        pos = end
    if start + pos != len(data):
        raise FormatError("%s: tensors end at data byte %d, the data section has %d bytes" %
                          (path, pos, len(data) - start))
    return tensors, metadata


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(tensors, metadata, expected):
    errors = []
    want = expected["tensors"]
    for name in sorted(set(tensors) - set(want)):
        errors.append("unexpected tensor %r" % name)
    for name, exp in sorted(want.items()):
        if name not in tensors:
            errors.append("missing tensor %r" % name)
            continue
        dtype, shape, values = tensors[name]
        if dtype != exp["dtype"]:
            errors.append("%r: dtype %s, expected %s" % (name, dtype, exp["dtype"]))
        if list(shape) != list(exp["shape"]):
            errors.append("%r: shape %r, expected %r" % (name, shape, exp["shape"]))
        ev = exp["values"]
        if len(values) != len(ev):
            errors.append("%r: %d values, expected %d" % (name, len(values), len(ev)))
            continue
        bad = [i for i, (x, y) in enumerate(zip(values, ev)) if not same(x, y)]
        if bad:
            i = bad[0]
            errors.append("%r: %d values differ, first at %d: %r, expected %r" % (name, len(bad), i, values[i], ev[i]))
    for key, value in expected.get("metadata", {}).items():
        if metadata.get(key) != value:
            errors.append("metadata %r is %r, expected %r" % (key, metadata.get(key), value))
    return errors


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--expect"):
        sys.stderr.write("usage: read_safetensors.py FILE [--expect EXPECTED.json]\n")
        return 2
    try:
        tensors, metadata = read(argv[1])
    except (FormatError, ValueError, KeyError, TypeError) as e:
        print("FAIL: %s" % e)
        return 1
    for name, (dtype, shape, values) in sorted(tensors.items()):
        print("%s %s %s %s" % (name, dtype, shape, values[:6]))
    if len(argv) == 4:
        with open(argv[3]) as f:
            expected = json.load(f)
        errors = compare(tensors, metadata, expected)
        for e in errors:
            print("FAIL: " + e)
        if errors:
            return 1
        print("OK: %d tensors equal the expected values" % len(tensors))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
