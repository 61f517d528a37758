"""A checkpoint file cannot make loading take more memory than about twice its size: it is refused first.

``torch.load(weights_only=True)`` believes the sizes a file declares: a zip entry's uncompressed size (deflated
zeros), and what the pickle's opcodes build (an empty list per byte, a tensor per five bytes, ``bytearray(n)``,
``_codecs.encode(b, "hex")`` doubling ``b``). Each crafted file here is refused (a :class:`CheckpointError` saying
why) while the peak resident memory of the process rises by less than a few MiB, where loading it allocated tens
of MiB (or, for the doubling, any amount). What ``torch.save`` writes for tensors and plain values still loads.
"""

import collections
import io
import struct
import zipfile

import pytest
import torch

import l0bayes._archive as archive
from l0bayes.io import CheckpointError, load_checkpoint, save_checkpoint

MiB = 2**20


# ------------------------------------------------------------------------------------------------ helpers
def _status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def refused_within(limit, call, match):
    """``call()`` raises a :class:`CheckpointError` matching ``match`` while the peak resident memory rises by less
    than ``limit`` bytes (measured from Linux's ``VmHWM``, reset first)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident memory to the current one
    except OSError:
        pytest.skip("measuring a peak of resident memory needs Linux's /proc/self/clear_refs")
    before = _status("VmHWM")
    with pytest.raises(CheckpointError, match=match):
        call()
    rise = _status("VmHWM") - before
    assert rise < limit, f"loading took {rise / MiB:.1f} MiB before it was refused"


def deflated(source, target, zeros_mib):
    """``source``'s archive written again with every entry deflated, its first storage replaced by ``zeros_mib`` MiB
    of zeros (streamed: nothing of that size is held here)."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        replaced = False
        for info in src.infolist():
            if "/data/" in info.filename and not replaced:
                replaced = True
                with out.open(info.filename, "w", force_zip64=True) as f:
                    for _ in range(zeros_mib):
                        f.write(bytes(MiB))
            else:
                out.writestr(info.filename, src.read(info))
        assert replaced


def _entries(data):
    """``(central directory entries, end record)`` of a zip archive without a comment."""
    _, _, _, _, count, size, offset, _ = struct.unpack("<4sHHHHIIH", data[-22:])
    entries, at = [], offset
    for _ in range(count):
        n, m, k = struct.unpack_from("<HHH", data, at + 28)
        entries.append(bytearray(data[at : at + 46 + n + m + k]))
        at += 46 + n + m + k
    return entries, offset


def with_directory(data, entries):
    """``data`` with its central directory replaced by ``entries`` (the end record rewritten to match)."""
    _, offset = _entries(data)
    directory = b"".join(entries)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(directory), offset, 0)
    return data[:offset] + directory + end


def _name(entry):
    n = struct.unpack_from("<H", entry, 28)[0]
    return bytes(entry[46 : 46 + n])


def crafted(path, body):
    """A checkpoint whose pickle is ``{"x": <body>}``: ``body`` opcodes that push one object (protocol 2)."""
    buffer = io.BytesIO()
    torch.save({"x": torch.zeros(2)}, buffer)  # its storage "0", of 2 floats, for the pickle to name
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = b"\x80\x02}X\x01\x00\x00\x00x" + body + b"s."
            out.writestr(info, data)


def _text(value):
    data = value.encode()
    return b"X" + struct.pack("<I", len(data)) + data


# ------------------------------------------------------------------------------------------------ the zip entries
def test_a_deflated_checkpoint_is_refused_before_it_is_inflated(tmp_path):
    """48 MiB of zeros deflated to 48 kB: torch allocated and inflated all of it before finding the file wrong."""
    save_checkpoint(tmp_path / "c.pt", {"epoch": 1, "w": torch.arange(6.0)})
    deflated(tmp_path / "c.pt", tmp_path / "bomb.pt", 48)
    assert (tmp_path / "bomb.pt").stat().st_size < MiB
    message = r"bomb\.pt' was refused before it was loaded: its zip entry '.*' is compressed \(method 8\)"
    refused_within(8 * MiB, lambda: load_checkpoint(tmp_path / "bomb.pt"), message)


def test_zip_headers_that_lie_are_refused(tmp_path):
    """Stored entries whose central directory or local header says another size or a compression method."""
    save_checkpoint(tmp_path / "c.pt", {"epoch": 1, "w": torch.arange(4096.0)})
    data = (tmp_path / "c.pt").read_bytes()
    entries, _ = _entries(data)
    k = next(i for i, e in enumerate(entries) if b"/data/" in _name(e))
    cases = {}
    deflate = [bytearray(e) for e in entries]
    struct.pack_into("<H", deflate[k], 10, 8)  # "deflated", though its bytes are stored
    cases["compressed \\(method 8\\)"] = with_directory(data, deflate)
    larger = [bytearray(e) for e in entries]
    struct.pack_into("<I", larger[k], 24, 2**31)  # declares 2 GiB uncompressed
    cases["declares 2147483648 bytes but holds 16384"] = with_directory(data, larger)
    repeated = entries + [entries[k]] * 200  # 200 more names for the same 16 kB: 3.2 MB from a 20 kB file
    cases["its zip entries declare more bytes than the file's"] = with_directory(data, repeated)
    pickle = next(e for e in entries if _name(e).endswith(b"/data.pkl"))
    local = bytearray(data)
    struct.pack_into("<H", local, struct.unpack_from("<I", pickle, 42)[0] + 8, 8)
    cases["the local header of its pickle says it is compressed"] = bytes(local)
    for reason, content in cases.items():
        (tmp_path / "lie.pt").write_bytes(content)
        with pytest.raises(CheckpointError, match=rf"lie\.pt' was refused before it was loaded: .*{reason}"):
            load_checkpoint(tmp_path / "lie.pt")


def test_a_zip64_archive_loads_as_torch_reads_it(tmp_path):
    """torch writes zip64 records for files over 4 GiB: sizes and offsets of 0xFFFFFFFF in the directory, their
    values in an extra field, and a zip64 end record. The same archive in that form loads; a zip64 size that lies
    is refused."""
    state = {"epoch": 2, "w": torch.arange(10.0), "note": "zip64"}
    save_checkpoint(tmp_path / "c.pt", state)
    data = (tmp_path / "c.pt").read_bytes()
    entries, offset = _entries(data)

    def zip64(entry, size=None):
        out = bytearray(entry)
        compressed, uncompressed = struct.unpack_from("<II", out, 20)
        (local,) = struct.unpack_from("<I", out, 42)
        struct.pack_into("<II", out, 20, 0xFFFFFFFF, 0xFFFFFFFF)
        struct.pack_into("<I", out, 42, 0xFFFFFFFF)
        n, m = struct.unpack_from("<HH", out, 28)
        extra = struct.pack("<HHQQQ", 1, 24, size or uncompressed, size or compressed, local)
        struct.pack_into("<H", out, 30, m + len(extra))
        return out[: 46 + n + m] + extra + out[46 + n + m :]

    def archive64(entries):
        directory = b"".join(entries)
        end64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, len(entries), len(entries),
                            len(directory), offset)  # fmt: skip
        locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, offset + len(directory), 1)
        end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
        return data[:offset] + directory + end64 + locator + end

    (tmp_path / "z64.pt").write_bytes(archive64([zip64(e) for e in entries]))
    loaded = load_checkpoint(tmp_path / "z64.pt")
    assert loaded["note"] == "zip64" and torch.equal(loaded["w"], state["w"])
    k = next(i for i, e in enumerate(entries) if b"/data/" in _name(e))
    lying = [zip64(e, size=2**40 if i == k else None) for i, e in enumerate(entries)]
    (tmp_path / "z64.pt").write_bytes(archive64(lying))
    with pytest.raises(CheckpointError, match=r"z64\.pt' was refused before it was loaded: its zip entries declare"):
        load_checkpoint(tmp_path / "z64.pt")


def test_torchs_legacy_format_is_refused(tmp_path):
    """The format before torch 1.6 (``_use_new_zipfile_serialization=False``) is one pickle stream, which no
    directory sizes: save_checkpoint never writes it."""
    torch.save({"epoch": 1, "w": torch.ones(3)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"old\.pt' is truncated or corrupt \(not a zip archive.*legacy"):
        load_checkpoint(tmp_path / "old.pt")


# ------------------------------------------------------------------------------------------------ the pickle
def test_a_pickle_that_doubles_bytes_is_refused_at_once(tmp_path):
    """``_codecs.encode(b, "hex")``, an allowed call, doubles ``b``: 26 calls in a 1 kB file took 128 MiB (40: a
    TiB) before torch refused the file."""
    body = b"c_codecs\nencode\nq\x00" + _text("hex") + b"q\x01h\x00" + _text("a") + _text("latin1") + b"\x86R"
    body += b"q\x02h\x00h\x02h\x01\x86R" * 26  # b = encode(b, "hex"), 26 times
    crafted(tmp_path / "hex.pt", body)
    message = r"hex\.pt' was refused before it was loaded: its pickle calls _codecs.encode other than as torch.save"
    refused_within(8 * MiB, lambda: load_checkpoint(tmp_path / "hex.pt"), message)


def test_a_pickle_that_asks_for_a_bytearray_of_a_size_is_refused(tmp_path):
    """``bytearray(n)`` (allowed by torch's loader) allocates n zero bytes: 48 MiB from 100 bytes."""
    crafted(tmp_path / "b.pt", b"c__builtin__\nbytearray\nJ" + struct.pack("<i", 48 * MiB) + b"\x85R")
    message = r"b\.pt' was refused before it was loaded: its pickle calls bytearray on something other than bytes"
    refused_within(8 * MiB, lambda: load_checkpoint(tmp_path / "b.pt"), message)


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("empty lists", b"]"),  # 1 byte each, 72 bytes of objects
        ("tensors", b"h\x00h\x01R"),  # 5 bytes each: a tensor rebuilt from the same remembered arguments, 500 bytes
    ],
)
def test_a_pickle_that_builds_more_objects_than_its_size_allows_is_refused(tmp_path, monkeypatch, name, unit):
    """Loading builds at most the file's size plus :data:`OBJECT_ALLOWANCE` bytes of objects (here 1 MiB): a file of
    300 kB that builds 20 MiB is refused (before, it loaded)."""
    monkeypatch.setattr(archive, "OBJECT_ALLOWANCE", MiB)
    tensor = (b"ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x09ctorch\nFloatStorage\n"
              b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQK\x00K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n"
              b")Rtq\x01")  # fmt: skip
    n = 300_000 // len(unit)
    crafted(tmp_path / "many.pt", b"](" + (tensor if name == "tensors" else b"") + unit * n + b"e")
    with pytest.raises(
        CheckpointError,
        match=r"many\.pt' was refused before it was loaded: its pickle would build "
        r"more than 1 MiB of objects, from a file of \d+ bytes \(at most the file's size plus 1 MiB\)",
    ):
        load_checkpoint(tmp_path / "many.pt")
    monkeypatch.setattr(archive, "OBJECT_ALLOWANCE", 64 * MiB)
    assert len(load_checkpoint(tmp_path / "many.pt")["x"]) == n + 2 * (name == "tensors")  # the file is sound


def test_what_torch_save_writes_for_tensors_and_plain_values_loads(tmp_path):
    """Every kind of value a checkpoint holds (a callback's state keeps bytes, sets, complex numbers, dtypes and
    devices) passes the check as torch writes it."""
    tagged = torch.arange(3.0)
    tagged.note = "kept"  # a tensor with attributes: torch writes it with _rebuild_from_type_v2
    state = {
        "tensors": [torch.randn(2, 3), torch.arange(4).view(2, 2).t(), torch.zeros(0), torch.tensor(1 + 2j)],
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "half": torch.ones(2, dtype=torch.float16),
        "meta": torch.empty(3, device="meta"),
        "tagged": tagged,
        "module": torch.nn.Linear(3, 2).state_dict(),
        "plain": [None, True, 3, 2**70, -1.5, "text", "é😀", b"\x00\xff", bytearray(b"ab"), {1, 2}, 1 - 2j, ()],
        "torch": [torch.Size([2, 3]), torch.float32, torch.device("cpu")],
        "ordered": collections.OrderedDict(a=1, b=[2]),
        "history": [{"loss": float(i), "epoch": i} for i in range(300)],
    }
    save_checkpoint(tmp_path / "c.pt", state)
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["plain"] == state["plain"] and loaded["torch"] == state["torch"]
    assert loaded["ordered"] == state["ordered"] and loaded["history"] == state["history"]
    assert loaded["tagged"].note == "kept" and loaded["meta"].is_meta
    assert all(torch.equal(a, b) for a, b in zip(loaded["tensors"], state["tensors"], strict=True))
