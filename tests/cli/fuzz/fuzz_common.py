"""What the fuzz case generators share: the case list, file helpers, tar / index / PNG / JPEG
builders, the demo dataset copied and rewritten, byte damage."""
import argparse
import io
import json
import os
import random
import shutil
import struct
import tarfile
import zlib

CASES = []


def add(name, group, cmd, expect, names=(), stdin=None):
    assert not any(c["name"] == name for c in CASES), name
    CASES.append({"name": name, "group": group, "cmd": [str(c) for c in cmd], "expect": expect,
                  "names": list(names), "stdin": stdin})


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(path, "rb") as f:
        return f.read()


# --- Energon datasets ------------------------------------------------------------------------------

def read_shard(path):
    """[(key, [(part, bytes)])] of a tar, grouped as energon does (consecutive same key)."""
    samples = []
    with tarfile.open(path) as t:
        for m in t.getmembers():
            base = m.name.rsplit("/", 1)[-1]
            key = m.name[: len(m.name) - len(base)] + base.split(".", 1)[0]
            part = base.split(".", 1)[1]
            data = t.extractfile(m).read()
            if samples and samples[-1][0] == key:
                samples[-1][1].append((part, data))
            else:
                samples.append((key, [(part, data)]))
    return samples


def tar_bytes(samples):
    """ustar bytes of the samples and the .tar.idx offsets (count + 1 entries)."""
    buf = io.BytesIO()
    offsets = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for key, parts in samples:
            offsets.append(t.offset)
            for part, data in parts:
                info = tarfile.TarInfo(key + "." + part)
                info.size = len(data)
                info.mode = 0o644
                t.addfile(info, io.BytesIO(data))
        offsets.append(t.offset)
    return buf.getvalue(), offsets


def idx_bytes(offsets):
    return b"".join(struct.pack("<Q", o) for o in offsets)


class Dataset:
    """A dataset in memory: splits of shards of samples, plus the .nv-meta texts."""

    def __init__(self, base):
        self.splits = {}
        for split in ("train", "val"):
            self.splits[split] = {split + "/shard_000000.tar":
                                  read_shard(os.path.join(base, split, "shard_000000.tar"))}
        self.dataset_yaml = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
        self.exclude = "[]"

    def copy(self):
        d = Dataset.__new__(Dataset)
        d.splits = {s: {n: [(k, list(p)) for k, p in v] for n, v in shards.items()}
                    for s, shards in self.splits.items()}
        d.dataset_yaml, d.exclude = self.dataset_yaml, self.exclude
        return d

    def split_yaml(self):
        y = "split_parts:\n"
        for split, shards in self.splits.items():
            y += "  %s:\n" % split + "".join("  - %s\n" % n for n in shards)
        return y + "exclude: %s\n" % self.exclude

    def info(self):
        counts = {n: len(s) for shards in self.splits.values() for n, s in shards.items()}
        return {"energon_version": "fuzz", "shard_counts": counts}

    def write(self, root):
        for shards in self.splits.values():
            for name, samples in shards.items():
                data, offsets = tar_bytes(samples)
                write(os.path.join(root, name), data)
                write(os.path.join(root, name + ".idx"), idx_bytes(offsets))
        write(os.path.join(root, ".nv-meta", "dataset.yaml"), self.dataset_yaml)
        write(os.path.join(root, ".nv-meta", "split.yaml"), self.split_yaml())
        write(os.path.join(root, ".nv-meta", ".info.json"), json.dumps(self.info(), indent=2))
        return root


# --- images ---------------------------------------------------------------------------------------

def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width, height, bit_depth=8, colour=2, rows=None, idat=None):
    """A PNG; `rows` = number of (zero) rows to compress (default all), `idat` = raw IDAT bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    if idat is None:
        channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
        row = b"\0" * (1 + (width * channels * bit_depth + 7) // 8)
        z = zlib.compressobj(9)
        idat = b"".join(z.compress(row) for _ in range(height if rows is None else rows))
        idat += z.flush()
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) +
            png_chunk(b"IEND", b""))


def jpeg_with_size(jpg, width, height):
    """The JPEG with the frame size of its SOF0/SOF2 marker replaced."""
    b = bytearray(jpg)
    i = 2
    while i + 4 < len(b):
        marker, length = b[i + 1], struct.unpack(">H", b[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            b[i + 5:i + 9] = struct.pack(">HH", height, width)
            return bytes(b)
        i += 2 + length
    raise ValueError("no SOF marker")


def flip_bytes(data, rng, n, start=0):
    b = bytearray(data)
    for _ in range(n):
        i = rng.randrange(start, len(b))
        b[i] ^= 1 + rng.randrange(255)
    return bytes(b)


# --- the case families ----------------------------------------------------------------------------


DROP = object()


def fix_checksum(b, at):
    """Recomputes the ustar checksum of the header block at offset `at`."""
    h = bytearray(b[at:at + 512])
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return b[:at] + bytes(h) + b[at + 512:]


def flip_headers(b, rng):
    """Random byte damage in a few header blocks (checksums fixed half the time, so the damage
    reaches the number and name fields and not only the checksum test)."""
    starts = []
    at = 0
    while at + 512 <= len(b) and any(b[at:at + 512]):
        starts.append(at)
        size = int(b[at + 124:at + 136].strip(b"\0 ") or b"0", 8)
        at += 512 + (size + 511) // 512 * 512
    for at in rng.sample(starts, min(2, len(starts))):
        field = rng.choice([(0, 100), (100, 124), (124, 136), (156, 157), (257, 265), (345, 500)])
        h = bytearray(b[at:at + 512])
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(*field)
            h[i] = rng.choice([0, 0x20, 0x30, 0x37, 0x38, 0x80, 0xFF, rng.randrange(256)])
        b = b[:at] + bytes(h) + b[at + 512:]
        if rng.random() < 0.5:
            b = fix_checksum(b, at)
    return b
