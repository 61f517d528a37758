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
_FULL16, _FULL32 = 0xFFFF, 0xFFFFFFFF


def check_archive(f, size):
    """Refuse (``ValueError``) a checkpoint file that could make ``torch.load`` allocate more than about twice its size.

    :param f: the file, open for reading in binary mode; read from any position, left at an unspecified one.
    :param int size: its size in bytes.
    :raises ValueError: whose message completes "checkpoint <path> ...": "is truncated or corrupt (...)" for a
        file that is not a zip archive as ``torch.save`` writes it, "was refused: ..." for one that declares more
        than it holds.
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
_NONE, _TRUE, _FALSE, _SMALL_INT = _Value("none"), _Value("bool"), _Value("bool"), _Value("int")
_EMPTY_TUPLE = _Value("tuple", 0, items=())
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
    stack, marks, memo = [], [], {}
    at, end, cost = 0, len(data), 0

    def take(n):
        nonlocal at
        if at + n > end:
            raise _corrupt("its pickle is cut short")
        at += n
        return data[at - n : at]

    def pop():
        if not stack:
            raise _corrupt("its pickle takes from an empty stack")
        return stack.pop()

    def pop_mark():
        nonlocal stack
        if not marks:
            raise _corrupt("its pickle closes a mark it did not open")
        items, stack = stack, marks.pop()
        return items

    def line():
        nonlocal at
        stop = data.find(b"\n", at)
        stop = end - 1 if stop < 0 else stop
        text, at = data[at:stop], stop + 1
        return text.decode("utf-8", "replace")

    while True:
        if at >= end:
            raise _corrupt("its pickle ends before its STOP")
        op = data[at]
        at += 1
        if op == 0x2E:  # STOP
            pop()
            return cost
        if op == 0x80:  # PROTO
            take(1)
        elif op == 0x63:  # GLOBAL
            module, name = line(), line()
            module = "builtins" if module == "__builtin__" else module
            stack.append(_Value("global", text=f"{module}.{name}"))
            cost += _SLOT
        elif op in (0x52, 0x81):  # REDUCE, NEWOBJ
            args = pop()
            func = stack[-1] if op == 0x52 else pop()
            if not stack and op == 0x52:
                raise _corrupt("its pickle takes from an empty stack")
            value, taken = _call(func, args)
            cost += taken
            if op == 0x52:
                stack[-1] = value
            else:
                stack.append(value)
        elif op == 0x62:  # BUILD
            state = pop()
            if not stack:
                raise _corrupt("its pickle takes from an empty stack")
            cost += _TENSOR + _ITEM * state.length
        elif op in (0x61, 0x65):  # APPEND, APPENDS
            items = [pop()] if op == 0x61 else pop_mark()
            if not stack or stack[-1].kind != "list":
                raise _corrupt("its pickle appends to something other than a list")
            stack[-1].length += len(items)
        elif op in (0x73, 0x75):  # SETITEM, SETITEMS
            items = [pop(), pop()] if op == 0x73 else pop_mark()
            if not stack or stack[-1].kind != "dict":
                raise _corrupt("its pickle sets an item of something other than a dict")
            stack[-1].length += len(items) // 2
        elif op == 0x28:  # MARK
            marks.append(stack)
            stack = []
            cost += _SLOT + _SMALL
        elif op == 0x74:  # TUPLE
            items = pop_mark()
            stack.append(_Value("tuple", len(items), items=tuple(items) if len(items) <= 8 else None))
            cost += _SLOT + 8 * len(items)
        elif op in (0x85, 0x86, 0x87):  # TUPLE1, TUPLE2, TUPLE3
            n = op - 0x84
            if len(stack) < n:
                raise _corrupt("its pickle takes from an empty stack")
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(_Value("tuple", n, items=items))
            cost += _SLOT + 8 * n
        elif op in (0x4E, 0x88, 0x89, 0x29, 0x4B):  # NONE, NEWTRUE, NEWFALSE, EMPTY_TUPLE, BININT1
            if op == 0x4B:
                take(1)
            stack.append({0x4E: _NONE, 0x88: _TRUE, 0x89: _FALSE, 0x29: _EMPTY_TUPLE, 0x4B: _SMALL_INT}[op])
            cost += _SLOT
        elif op in (0x5D, 0x7D, 0x8F):  # EMPTY_LIST, EMPTY_DICT, EMPTY_SET
            kind, taken = _EMPTY[op]
            stack.append(_Value(kind))
            cost += _SLOT + taken
        elif op in (0x4A, 0x4D, 0x47, 0x8A):  # BININT, BININT2, BINFLOAT, LONG1
            n = {0x4A: 4, 0x4D: 2, 0x47: 8}.get(op) or take(1)[0]
            take(n)
            stack.append(_Value("number"))
            cost += _SLOT + _SMALL + n
        elif op in (0x58, 0x55):  # BINUNICODE, SHORT_BINSTRING
            n = struct.unpack("<I", take(4))[0] if op == 0x58 else take(1)[0]
            raw = take(n)
            try:
                text = raw.decode("utf-8", "surrogatepass") if n <= 64 else None
            except UnicodeDecodeError:
                raise _corrupt("its pickle holds a string that is not UTF-8") from None
            stack.append(_Value("str", n, text=text))
            cost += _SLOT + _SMALL + 4 * n  # a single wide character makes every character 4 bytes
        elif op == 0x51:  # BINPERSID: a storage, read from its own zip entry
            if pop().kind not in ("tuple", "number"):
                raise _corrupt("its pickle names a storage by something other than a tuple")
            stack.append(_Value("storage"))
            cost += _SLOT + _TENSOR
        elif op in (0x68, 0x6A):  # BINGET, LONG_BINGET
            key = take(1)[0] if op == 0x68 else struct.unpack("<I", take(4))[0]
            if key not in memo:
                raise _corrupt("its pickle recalls an object it did not remember")
            stack.append(memo[key])
            cost += _SLOT
        elif op in (0x71, 0x72):  # BINPUT, LONG_BINPUT
            key = take(1)[0] if op == 0x71 else struct.unpack("<I", take(4))[0]
            if not stack:
                raise _corrupt("its pickle takes from an empty stack")
            cost += _MEMO if key not in memo else 0
            memo[key] = stack[-1]
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
        return _Value("set" if name == "builtins.set" else "dict"), _SET + _ITEM * n
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
