"""The memory a checkpoint file may make ``torch.load`` take, bounded from the file's own bytes before it is read.

``torch.load(weights_only=True)`` runs no code from a file, but it believes the sizes that the file declares.
Two parts of torch's zip format declare them:

* the zip entries: torch allocates an entry's uncompressed size, as the archive's central directory states it,
  then inflates the entry into it. A few hundred kilobytes of deflated zeros declare gigabytes. ``torch.save``
  stores every entry uncompressed (method 0, "stored"), so an entry's size is bytes on disk: the entries of a
  file it wrote, taken together, hold no more bytes than the file.
* the pickle ``data.pkl``: every object that the restricted unpickler builds costs an opcode of one to a few
  bytes (an empty list, a tensor rebuilt from remembered arguments: up to a hundred times the opcode's size),
  and some functions it allows build objects far larger than their arguments: ``bytearray(n)``, or
  ``_codecs.encode(b, "hex")``, which doubles ``b``, so that a few hundred bytes of opcodes ask for gigabytes.

:func:`check_archive` reads the zip's central directory and walks the pickle's opcodes without building any of
their objects, and raises a ``ValueError`` (saying why) for a file that is not a zip archive, one whose entries
are compressed or declare more bytes than the file holds, a pickle that calls a function ``torch.save`` does not
write for tensors and plain values, or one whose objects would take more than the file's size plus
:data:`OBJECT_ALLOWANCE` bytes. A file that passes loads in at most about twice its size plus that constant: its
tensors' bytes (at most the file's) and its pickle's objects.
"""

import struct

__all__ = ["OBJECT_ALLOWANCE", "check_archive"]

#: The bytes of Python objects a checkpoint's pickle may build beyond the file's own size.
OBJECT_ALLOWANCE = 64 * 2**20

_LOCAL, _CENTRAL, _END, _LOCATOR64, _END64 = b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
_FULL32 = 0xFFFFFFFF


def check_archive(f, size):
    """Refuse (``ValueError``) a checkpoint file that could make ``torch.load`` allocate more than about twice its size.

    :param f: the file, open for reading in binary mode; read from any position, left at an unspecified one.
    :param int size: its size in bytes.
    :raises ValueError: whose message completes "checkpoint <path> ...": "is truncated or corrupt (...)" for a
        file that is not a zip archive as ``torch.save`` writes it, "was refused before it was loaded: ..." for
        one that declares more than it holds or whose pickle would build too much.
    """
    f.seek(0)
    if f.read(4) != _LOCAL:
        raise _corrupt("not a zip archive, the format torch.save writes; torch's legacy format is not read")
    start, count, directory_size = _end_record(f, size)
    f.seek(start)
    directory = f.read(directory_size)
    if len(directory) != directory_size:
        raise _corrupt("its zip directory is cut short")
    pickle_offset, pickle_size = _walk_directory(f, size, directory, count)
    del directory
    f.seek(pickle_offset)
    data = f.read(pickle_size)
    if len(data) != pickle_size:
        raise _corrupt("its pickle is cut short")
    _walk_pickle(data, size + OBJECT_ALLOWANCE, size)


def _corrupt(reason):
    return ValueError(f"is truncated or corrupt ({reason})")


def _refused(reason):
    return ValueError(f"was refused before it was loaded: {reason}")


def _end_record(f, size):
    """``(offset, entry count, size)`` of the central directory, from the end record (and the zip64 one, if any).

    As torch's zip reader (miniz) reads them: the end record is the file's last 22 bytes (``torch.save`` writes no
    archive comment), and a zip64 locator just before it points to the zip64 end record, whose values then count.
    """
    if size < 22 + 30:
        raise _corrupt("too short for a zip archive")
    f.seek(size - 22)
    end = f.read(22)
    if end[:4] != _END or struct.unpack_from("<H", end, 20)[0] != 0:
        raise _corrupt("its zip end record is missing")
    _, disk, cd_disk, on_disk, count, cd_size, cd_offset, _ = struct.unpack("<4sHHHHIIH", end)
    if size >= 22 + 20 + 56:
        f.seek(size - 22 - 20)
        locator = f.read(20)
        if locator[:4] == _LOCATOR64:
            (end64_offset,) = struct.unpack_from("<Q", locator, 8)
            if end64_offset > size - 22 - 20 - 56:
                raise _corrupt("its zip64 end record lies outside the file")
            f.seek(end64_offset)
            end64 = f.read(56)
            if end64[:4] != _END64:
                raise _corrupt("its zip64 end record is missing")
            disk, cd_disk, on_disk, count, cd_size, cd_offset = struct.unpack_from("<IIQQQQ", end64, 16)
    if disk or cd_disk or on_disk != count:
        raise _corrupt("a zip archive of several disks")
    if count == 0 or cd_size < 46 * count or cd_offset + cd_size > size:
        raise _corrupt("its zip directory does not fit the file")
    return cd_offset, count, cd_size


def _zip64(extra, values):
    """``values`` (uncompressed size, compressed size, local header offset) with those at 0xFFFFFFFF read from the
    zip64 field (0x0001) of ``extra``, in that order."""
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, at)
        field = extra[at + 4 : at + 4 + length]
        at += 4 + length
        if tag != 1:
            continue
        out, k = [], 0
        for value in values:
            if value == _FULL32:
                if k + 8 > len(field):
                    raise _corrupt("a zip64 field is cut short")
                value = struct.unpack_from("<Q", field, k)[0]
                k += 8
            out.append(value)
        return out
    return values


def _walk_directory(f, size, directory, count):
    """Check every entry of the central directory; ``(offset, size)`` of the pickle ``<archive>/data.pkl``."""
    at, total, archive, pickles = 0, 0, None, []
    for _ in range(count):
        if at + 46 > len(directory) or directory[at : at + 4] != _CENTRAL:
            raise _corrupt("its zip directory is damaged")
        method, _, _, _, compressed, uncompressed, name_len, extra_len, comment_len = struct.unpack_from(
            "<HHHIIIHHH", directory, at + 10
        )
        (local,) = struct.unpack_from("<I", directory, at + 42)
        name = directory[at + 46 : at + 46 + name_len]
        extra = directory[at + 46 + name_len : at + 46 + name_len + extra_len]
        at += 46 + name_len + extra_len + comment_len
        if at > len(directory):
            raise _corrupt("its zip directory is damaged")
        uncompressed, compressed, local = _zip64(extra, [uncompressed, compressed, local])
        shown = name.decode("utf-8", "replace")[:80]
        if method != 0:
            raise _refused(
                f"its zip entry {shown!r} is compressed (method {method}); torch.save stores every entry as it is, "
                "so the file was altered (a compressed entry can declare far more bytes than the file holds)"
            )
        if compressed != uncompressed:
            raise _refused(f"its zip entry {shown!r} declares {uncompressed} bytes but holds {compressed}")
        total += uncompressed
        if total > size:
            raise _refused(f"its zip entries declare more bytes than the file's {size}")
        if archive is None:  # torch reads every record under the directory of the first entry
            archive = name.split(b"/", 1)[0] + b"/data.pkl" if b"/" in name else None
            if archive is None:
                raise _corrupt(f"its first zip entry {shown!r} is not in a directory")
        if name.lower() == archive.lower():  # as torch's zip reader finds a name: ASCII case ignored
            pickles.append((local, uncompressed))
    if len(pickles) != 1:
        raise _corrupt(f"it holds {len(pickles)} entries {archive.decode('utf-8', 'replace')[:80]!r}, not one")
    local, length = pickles[0]
    f.seek(local)
    header = f.read(30)
    if len(header) != 30 or header[:4] != _LOCAL:
        raise _corrupt("a zip entry's local header is missing")
    (method,) = struct.unpack_from("<H", header, 8)
    if method != 0:
        raise _refused(f"the local header of its pickle says it is compressed (method {method})")
    name_len, extra_len = struct.unpack_from("<HH", header, 26)
    offset = local + 30 + name_len + extra_len
    if offset + length > size:
        raise _corrupt("its pickle lies outside the file")
    return offset, length


class _Value:
    """What the walk knows of an object the unpickler would build: its kind, its length (items, characters or
    bytes), a short string's text or a global's name, and a short tuple's items."""

    __slots__ = ("items", "kind", "length", "text")

    def __init__(self, kind, length=0, text=None, items=None):
        self.kind, self.length, self.text, self.items = kind, length, text, items


# What the unpickler's objects take at most, in bytes (CPython, 64-bit; measured, with a margin): a reference on
# the stack or in a container (with a dict's spare room), a number or a string's header, an empty list, dict, set,
# an item copied into a dict or set, a tensor or storage with its C++ parts, an entry of the unpickler's memo.
_SLOT, _SMALL, _LIST, _DICT, _SET, _ITEM, _TENSOR, _MEMO = 48, 48, 72, 160, 232, 128, 640, 64
_EMPTY = {0x5D: ("list", _LIST), 0x7D: ("dict", _DICT), 0x8F: ("set", _SET)}
_CONSTANTS = {0x4B: _Value("number"), 0x4E: _Value("none"), 0x88: _Value("bool"), 0x89: _Value("bool")}
_CONSTANTS[0x29] = _Value("tuple", 0, items=())  # EMPTY_TUPLE
_NUMBER_BYTES = {0x4A: 4, 0x4D: 2, 0x47: 8}
_TENSOR_CALLS = {
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_meta_tensor_no_storage",
}


def _walk_pickle(data, budget, size):
    """Walk the opcodes of ``data`` as ``torch.load``'s restricted unpickler would run them, counting what its
    objects take; refuse calls ``torch.save`` does not write and a total above ``budget`` bytes. Returns the
    total."""
    try:
        return _walk(data, budget, size)
    except (IndexError, KeyError, struct.error):  # read past the end, an empty stack, a mark or memo entry missing
        raise _corrupt("its pickle is cut short, or takes what it did not put") from None


def _walk(data, budget, size):
    stack, marks, memo = [], [], {}
    push = stack.append
    at, end, cost = 0, len(data), 0
    unpack_from = struct.unpack_from
    while True:
        op = data[at]
        at += 1
        if op == 0x71:  # BINPUT (at most 256 entries)
            memo[data[at]] = stack[-1]
            at += 1
            continue
        if op == 0x68:  # BINGET
            push(memo[data[at]])
            at += 1
            cost += _SLOT
        elif op == 0x72 or op == 0x6A:  # LONG_BINPUT, LONG_BINGET
            (key,) = unpack_from("<I", data, at)
            at += 4
            if op == 0x72:
                cost += 0 if key in memo else _MEMO
                memo[key] = stack[-1]
            else:
                push(memo[key])
                cost += _SLOT
        elif op == 0x58 or op == 0x55:  # BINUNICODE, SHORT_BINSTRING
            if op == 0x58:
                (n,) = unpack_from("<I", data, at)
                at += 4
            else:
                n = data[at]
                at += 1
            if at + n > end:
                raise IndexError
            try:
                text = data[at : at + n].decode("utf-8", "surrogatepass") if n <= 64 else None
            except UnicodeDecodeError:
                raise _corrupt("its pickle holds a string that is not UTF-8") from None
            at += n
            push(_Value("str", n, text=text))
            cost += _SLOT + _SMALL + 4 * n  # a single wide character makes every character 4 bytes
        elif op == 0x28:  # MARK
            marks.append(stack)
            stack = []
            push = stack.append
            cost += _SLOT + _SMALL
        elif op == 0x4B or op == 0x4E or op == 0x88 or op == 0x89 or op == 0x29:  # BININT1, NONE, bools, ()
            at += op == 0x4B
            push(_CONSTANTS[op])
            cost += _SLOT
        elif op == 0x4A or op == 0x4D or op == 0x47 or op == 0x8A:  # BININT, BININT2, BINFLOAT, LONG1
            n = _NUMBER_BYTES[op] if op != 0x8A else 1 + data[at]
            at += n
            if at > end:
                raise IndexError
            push(_Value("number"))
            cost += _SLOT + _SMALL + n
        elif op == 0x74 or op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE, TUPLE1, TUPLE2, TUPLE3
            if op == 0x74:
                items, stack = stack, marks.pop()
                push = stack.append
            else:
                n = op - 0x84
                if len(stack) < n:
                    raise IndexError
                items = stack[-n:]
                del stack[-n:]
            push(_Value("tuple", len(items), items=tuple(items) if len(items) <= 8 else None))
            cost += _SLOT + 8 * len(items)
        elif op == 0x52 or op == 0x81:  # REDUCE, NEWOBJ
            args = stack.pop()
            func = stack.pop()
            value, taken = _call(func, args)
            push(value)
            cost += taken
        elif op == 0x73 or op == 0x75 or op == 0x61 or op == 0x65:  # SETITEM, SETITEMS, APPEND, APPENDS
            if op == 0x73 or op == 0x61:
                n = 2 if op == 0x73 else 1
                if len(stack) < n + 1:
                    raise IndexError
                del stack[-n:]
            else:
                items, stack = stack, marks.pop()
                push = stack.append
                n = len(items)
            target, setting = stack[-1], op == 0x73 or op == 0x75
            if target.kind not in (("dict", "ordered") if setting else ("list",)):
                raise _corrupt(f"its pickle {'sets an item of' if setting else 'appends to'} a {target.kind}")
            target.length += n // 2 if setting else n
            cost += _SLOT * (n // 2) if target.kind == "ordered" else 0  # the order's own record of each key
        elif op == 0x62:  # BUILD
            state = stack.pop()
            stack[-1]  # noqa: B018 - the object built
            cost += _TENSOR + _ITEM * state.length
        elif op == 0x5D or op == 0x7D or op == 0x8F:  # EMPTY_LIST, EMPTY_DICT, EMPTY_SET
            kind, taken = _EMPTY[op]
            push(_Value(kind))
            cost += _SLOT + taken
        elif op == 0x51:  # BINPERSID: a storage, read from its own zip entry
            if stack.pop().kind not in ("tuple", "number"):
                raise _corrupt("its pickle names a storage by something other than a tuple")
            push(_Value("storage"))
            cost += _SLOT + _TENSOR
        elif op == 0x63:  # GLOBAL: two lines, module and name
            first = data.find(b"\n", at)
            second = data.find(b"\n", first + 1)
            if first < 0 or second < 0:
                raise IndexError
            module = data[at:first].decode("utf-8", "replace")
            module = "builtins" if module == "__builtin__" else module
            push(_Value("global", text=f"{module}.{data[first + 1 : second].decode('utf-8', 'replace')}"))
            cost += _SLOT + second - at
            at = second + 1
        elif op == 0x80:  # PROTO
            at += 1
        elif op == 0x2E:  # STOP
            stack.pop()
            return cost
        else:
            raise _corrupt(f"its pickle holds the opcode {bytes([op])!r}, which torch's loader does not run")
        if cost > budget:
            raise _refused(
                f"its pickle would build more than {budget / 2**20:.0f} MiB of objects, from a file of {size} bytes "
                f"(at most the file's size plus {OBJECT_ALLOWANCE // 2**20} MiB)"
            )


def _call(func, args):
    """``(value, bytes)`` of a call ``func(*args)`` (REDUCE, NEWOBJ) that ``torch.save`` writes for a tensor or a
    plain value; any other call is refused, and one whose result could outgrow its arguments is checked."""
    name = func.text if func.kind == "global" else None
    if args.kind != "tuple":
        raise _corrupt("its pickle calls a function with arguments that are not a tuple")
    items = args.items
    if name in _TENSOR_CALLS or name == "torch._tensor._rebuild_from_type_v2":
        if items is None:
            raise _corrupt(f"its pickle calls {name} with {args.length} arguments")
        if name == "torch._tensor._rebuild_from_type_v2":  # (function, type, its arguments, state)
            if len(items) != 4 or items[0].kind != "global" or items[0].text not in _TENSOR_CALLS:
                raise _refused("its pickle rebuilds a tensor of a subclass with a function other than torch's own")
            inner, taken = _call(items[0], items[2])
            return inner, taken + _TENSOR + _ITEM * items[3].length
        dims = sum(item.length for item in items if item.kind == "tuple")
        state = items[3].length if name.endswith("_with_state") and len(items) > 3 else 0
        return _Value("tensor"), _TENSOR + 16 * dims + _ITEM * state
    n = items[0].length if items else 0
    if name in ("collections.OrderedDict", "collections.Counter", "builtins.set"):
        return _Value("set" if name == "builtins.set" else "ordered"), _SET + _ITEM * n
    if name in ("builtins.complex", "torch.device", "torch.Size"):
        return _Value("tuple" if name == "torch.Size" else "number", n), _TENSOR + 16 * n
    if name == "_codecs.encode":  # how protocol 2 writes bytes: encode(text, "latin1")
        if not (len(items) == 2 and items[0].kind == "str" and items[1].text in ("latin1", "latin-1")):
            raise _refused("its pickle calls _codecs.encode other than as torch.save writes bytes (text, 'latin1')")
        return _Value("bytes", n), _SMALL + n
    if name == "builtins.bytearray":  # as torch.save writes one: bytearray(bytes); bytearray(n) allocates n bytes
        if items and items[0].kind not in ("bytes", "str"):
            raise _refused("its pickle calls bytearray on something other than bytes")
        return _Value("bytes", n), _LIST + n
    shown = name if name is not None else f"a {func.kind}"
    raise _refused(f"its pickle calls {shown}, which torch.save does not write for tensors and plain values")
