#!/usr/bin/env python3
"""An independent reader of the tensorboard monitor's event file.

Reads the TFRecord framing itself (checking both masked CRC32C of every
record with its own CRC code), decodes each record as an Event with the
Python classes protoc made from monitor/tensorboard_event.proto (Debian's
python3-protobuf), and checks:
  - the first record is the file version "brain.Event:2";
  - with --csv DIR: the csv_monitor files in DIR hold the same scalars,
    tag by tag and step by step (the CSV rows are checked against the
    progress line by the C++ test that wrote them);
  - with --min-steps N: at least N steps of Train/Samples/train_loss were
    written (what a run killed after a flush must have left).
A torn last record (a run killed mid-write) is reported and allowed only
with --torn-tail-ok. --corrupt K flips one byte of record K's data before
checking, to show that a damaged record is caught. Prints "FAIL: ..." and
exits 1 on the first mismatch.

  read_events.py --proto-py GEN_DIR EVENTS_DIR [--csv DIR] [--min-steps N]
"""
import argparse
import glob
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def records(blob, corrupt, torn_tail_ok):
    at, index = 0, 0
    while at < len(blob):
        if len(blob) - at < 12:
            break
        (length,) = struct.unpack_from("<Q", blob, at)
        (length_crc,) = struct.unpack_from("<I", blob, at + 8)
        if masked(blob[at:at + 8]) != length_crc:
            fail("record %d: length CRC does not match" % index)
        end = at + 12 + length + 4
        if end > len(blob):
            break
        data = bytearray(blob[at + 12:at + 12 + length])
        if index == corrupt:
            data[len(data) // 2] ^= 0x01
        (data_crc,) = struct.unpack_from("<I", blob, at + 12 + length)
        if masked(bytes(data)) != data_crc:
            fail("record %d: data CRC does not match" % index)
        yield bytes(data)
        at, index = end, index + 1
    if at < len(blob):
        if not torn_tail_ok:
            fail("%d bytes after the last whole record" % (len(blob) - at))
        print("a torn last record (%d bytes) after %d whole records" % (len(blob) - at, index))


def read_csv(path):
    with open(path) as f:
        lines = f.read().split("\n")
    rows = []
    for line in lines[1:]:
        parts = line.split(",")
        if len(parts) != 2 or not parts[1]:
            continue  # the last line of a killed run may be torn
        rows.append((int(parts[0]), float(parts[1])))
    return lines[0], rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto-py", required=True)
    ap.add_argument("events_dir")
    ap.add_argument("--csv")
    ap.add_argument("--min-steps", type=int, default=1)
    ap.add_argument("--torn-tail-ok", action="store_true")
    ap.add_argument("--corrupt", type=int, default=-1)
    args = ap.parse_args()
    sys.path.insert(0, args.proto_py)
    from monitor import tensorboard_event_pb2 as pb

    files = glob.glob(os.path.join(args.events_dir, "events.out.tfevents.*"))
    if len(files) != 1:
        fail("expected one event file in %s, found %s" % (args.events_dir, files))
    with open(files[0], "rb") as f:
        blob = f.read()
    scalars = {}
    for i, data in enumerate(records(blob, args.corrupt, args.torn_tail_ok)):
        event = pb.Event()
        event.ParseFromString(data)
        if i == 0:
            if event.file_version != "brain.Event:2":
                fail("the first record is not the file version: %r" % event)
            continue
        if not event.HasField("summary") or event.wall_time <= 0:
            fail("record %d is not a summary with a wall time: %r" % (i, event))
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))

    steps = len(scalars.get("Train/Samples/train_loss", []))
    if steps < args.min_steps:
        fail("%d steps of Train/Samples/train_loss, expected at least %d" % (steps, args.min_steps))

    if args.csv:
        csv_files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(args.csv, "*.csv")))
        expected = sorted(tag.replace("/", "_").replace(" ", "_") + ".csv" for tag in scalars)
        if csv_files != expected:
            fail("CSV files %s, event tags give %s" % (csv_files, expected))
        for tag, values in scalars.items():
            header, rows = read_csv(os.path.join(args.csv, tag.replace("/", "_") + ".csv"))
            if header != "step," + tag.split("/")[-1]:
                fail("%s: CSV header %r" % (tag, header))
            # A killed run may have flushed one file further than the other.
            n = min(len(rows), len(values))
            if n < args.min_steps:
                fail("%s: %d CSV rows, %d events" % (tag, len(rows), len(values)))
            for (csv_step, csv_value), (step, value) in zip(rows[:n], values[:n]):
                if csv_step != step or not math.isclose(value, csv_value, rel_tol=1e-6, abs_tol=1e-30):
                    fail("%s: CSV (%d, %r) but event (%d, %r)" % (tag, csv_step, csv_value, step, value))
    print("ok: %d tags, %d steps, every record's CRC checked" % (len(scalars), steps))


if __name__ == "__main__":
    main()
