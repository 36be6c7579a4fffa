#!/usr/bin/env python3
"""Reads TensorBoard event files the way TensorBoard does, for test_tfevents.

  /usr/bin/python3 tests/reference/read_tfevents.py FILE...

Each file is TFRecords (u64 length, masked CRC-32C of the length, data,
masked CRC-32C of the data); both CRCs are checked. Each record is parsed as
a tensorflow.Event with Google's protobuf library (the messages built here
from descriptor_pb2, with the field numbers of TensorFlow's event.proto and
summary.proto), and re-encoded by protobuf: the bytes must be the record's
bytes, so kiln's hand-written encoding is the canonical one. Prints, per
file, "file NAME" and then per event one of
  version STRING WALL_TIME
  start STEP WALL_TIME          (a SessionLog with status START)
  scalar STEP TAG VALUE WALL_TIME
and exits 1 with an "error: ..." line on anything else."""
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build_messages():
    fd = descriptor_pb2.FileDescriptorProto(name="kiln_tfevents_check.proto", package="tensorflow", syntax="proto3")

    def field(msg, name, number, ftype, type_name=None, oneof=None, repeated=False):
        f = msg.field.add(name=name, number=number, type=ftype,
                          label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name
        if oneof is not None:
            f.oneof_index = oneof

    summary = fd.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    field(value, "tag", 1, F.TYPE_STRING)
    field(value, "simple_value", 2, F.TYPE_FLOAT, oneof=0)
    field(summary, "value", 1, F.TYPE_MESSAGE, ".tensorflow.Summary.Value", repeated=True)

    session_log = fd.message_type.add(name="SessionLog")
    status = session_log.enum_type.add(name="SessionStatus")
    for i, n in enumerate(["STATUS_UNSPECIFIED", "START", "STOP", "CHECKPOINT"]):
        status.value.add(name=n, number=i)
    field(session_log, "status", 1, F.TYPE_ENUM, ".tensorflow.SessionLog.SessionStatus")
    field(session_log, "checkpoint_path", 2, F.TYPE_STRING)
    field(session_log, "msg", 3, F.TYPE_STRING)

    event = fd.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    field(event, "wall_time", 1, F.TYPE_DOUBLE)
    field(event, "step", 2, F.TYPE_INT64)
    field(event, "file_version", 3, F.TYPE_STRING, oneof=0)
    field(event, "graph_def", 4, F.TYPE_BYTES, oneof=0)
    field(event, "summary", 5, F.TYPE_MESSAGE, ".tensorflow.Summary", oneof=0)
    field(event, "session_log", 7, F.TYPE_MESSAGE, ".tensorflow.SessionLog", oneof=0)

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    desc = pool.FindMessageTypeByName("tensorflow.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(msg):
    print("error: " + msg)
    sys.exit(1)


def main():
    Event = build_messages()
    for path in sys.argv[1:]:
        print("file " + path)
        data = open(path, "rb").read()
        off = 0
        while off < len(data):
            if len(data) - off < 12:
                fail(f"{path}: {len(data) - off} stray bytes at {off}")
            (n,) = struct.unpack_from("<Q", data, off)
            (lcrc,) = struct.unpack_from("<I", data, off + 8)
            if masked(crc32c(data[off:off + 8])) != lcrc:
                fail(f"{path}: length CRC of the record at {off}")
            if off + 16 + n > len(data):
                fail(f"{path}: the record at {off} runs past the end")
            rec = data[off + 12:off + 12 + n]
            (dcrc,) = struct.unpack_from("<I", data, off + 12 + n)
            if masked(crc32c(rec)) != dcrc:
                fail(f"{path}: data CRC of the record at {off}")
            off += 16 + n
            ev = Event.FromString(rec)
            if ev.SerializeToString() != rec:
                fail(f"{path}: the record at {off - 16 - n} is not protobuf's encoding of what it decodes to")
            what = ev.WhichOneof("what")
            if what == "file_version":
                print(f"version {ev.file_version} {ev.wall_time!r}")
            elif what == "session_log" and ev.session_log.status == 1:
                print(f"start {ev.step} {ev.wall_time!r}")
            elif what == "summary":
                for v in ev.summary.value:
                    if v.WhichOneof("value") != "simple_value":
                        fail(f"{path}: summary value {v.tag} is not a simple_value")
                    print(f"scalar {ev.step} {v.tag} {v.simple_value!r} {ev.wall_time!r}")
            else:
                fail(f"{path}: an event with {what}")


if __name__ == "__main__":
    main()
