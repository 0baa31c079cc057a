"""A tensorfs transform worker: calls the user's function on row groups the daemon sends.

Started by the daemon as `PYTHON -c SOURCE SPEC [PATH]`, with this file as SOURCE (it needs
pyarrow and what the function imports, not the tensorfs package). SPEC is `FILE.py:NAME` or
`MODULE:NAME` (MODULE imported with PATH first on sys.path). NAME is a function taking a
pyarrow.RecordBatch, or a Petastorm TransformSpec (its func takes a pandas DataFrame).

The protocol, on the descriptors the daemon gave as stdin and stdout (the function's own prints
go to stderr, the daemon's log): messages of one kind byte, an 8-byte little-endian length and
that many bytes. The worker first sends R (ready) with a JSON object, or E with why it cannot
load the function. Then, for each S, it reads the request and answers. The rows themselves are
in memory files shared with the daemon, whose descriptors TENSORFS_SHARED_FDS names: the request
area, then two answer areas. S's body is the request's length (8 bytes, little-endian: an Arrow
IPC stream of one record batch, source rows, at the request area's start) and the answer area
to write (one byte: 0 or 1; 255 for none). The worker answers A (8 bytes: the length of the IPC
stream of the rows the function returned, written at that area's start, the file grown first
where it is too small, never shrunk), B (that stream itself, where no area was given or it
cannot be written), or E (one line: the exception's type, message and where it was raised), and
goes on. The daemon writes the request area only while the worker is idle, and names an answer
area only once it reads nothing from it any more.
"""

import json
import mmap
import os
import struct
import sys
import traceback

# The protocol's descriptor, then fd 1 becomes stderr: whatever the function prints goes to the
# log, never into the replies.
_OUT = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
sys.stdout = sys.stderr
_IN = os.fdopen(os.dup(0), "rb")


def send(kind: bytes, payload: bytes) -> None:
    _OUT.write(kind + struct.pack("<Q", len(payload)))
    _OUT.write(payload)
    _OUT.flush()


def receive():
    head = _IN.read(9)
    if len(head) < 9:
        return None, None
    (n,) = struct.unpack("<Q", head[1:])
    body = _IN.read(n)
    if len(body) < n:
        return None, None
    return head[:1], body


class Area:
    """One memory file shared with the daemon, mapped at its size (mapped again once it grows)."""

    def __init__(self, fd: int, writable: bool):
        self.fd, self.writable, self.map = fd, writable, None
        # The function's own subprocesses have no use for it.
        os.set_inheritable(fd, False)

    def at_least(self, n: int):
        """The area mapped over at least N bytes, the file grown to N first where it is writable."""
        if self.map is None or len(self.map) < n:
            size = os.fstat(self.fd).st_size
            if size < n:
                if not self.writable:
                    raise ValueError(f"a request of {n} bytes in an area of {size}")
                os.ftruncate(self.fd, n)
                size = n
            # The old map is not closed: arrays of an earlier call may still be over it, and it
            # goes with them.
            access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
            self.map = mmap.mmap(self.fd, size, access=access)
        return self.map


def areas() -> tuple:
    fds = [int(fd) for fd in os.environ.pop("TENSORFS_SHARED_FDS").split(",")]
    return Area(fds[0], writable=False), [Area(fd, writable=True) for fd in fds[1:]]


def answer(result, pa, area) -> None:
    """RESULT sent as an IPC stream: written into AREA and its length sent (A), or through the
    pipe (B) where there is no area or it cannot take the stream."""
    if area is not None:
        try:
            sized = pa.MockOutputStream()
            with pa.ipc.new_stream(sized, result.schema) as writer:
                writer.write_batch(result)
            n = sized.size()
            out = pa.FixedSizeBufferWriter(pa.py_buffer(area.at_least(n)))
            with pa.ipc.new_stream(out, result.schema) as writer:
                writer.write_batch(result)
            if out.tell() == n:
                send(b"A", struct.pack("<Q", n))
                return
        except (OSError, ValueError, pa.ArrowException):  # the area cannot grow: the pipe
            pass
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, result.schema) as writer:
        writer.write_batch(result)
    send(b"B", memoryview(sink.getvalue()))  # the stream's bytes, not a copy of them


def where(exc: BaseException) -> str:
    """The exception in one line: its type, message and the innermost frame that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
    return text + at


def py_files(directory: str, recursive: bool) -> list:
    """The .py files of DIRECTORY (and below it), sorted: what decides the function's code."""
    out = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
        if not recursive or len(out) > 10_000:
            break
    return out


def sources(spec: str, path: str, module) -> list:
    """The files whose bytes identify the function: FILE.py and the .py files beside it, every
    .py under transform_path, or the module's own file (a package's whole directory)."""
    target = spec.rsplit(":", 1)[0]
    if target.endswith(".py"):
        return py_files(os.path.dirname(os.path.abspath(target)), recursive=False)
    if path:
        return py_files(os.path.abspath(path), recursive=True)
    file = getattr(module, "__file__", None)
    if not file:
        return []
    if os.path.basename(file) == "__init__.py":
        return py_files(os.path.dirname(file), recursive=True)
    return [os.path.abspath(file)]


def load(spec: str, path: str):
    if ":" not in spec:
        raise ValueError(f"transform={spec} names no function: give FILE.py:NAME or MODULE:NAME")
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        import importlib.util

        location = os.path.abspath(target)
        module_spec = importlib.util.spec_from_file_location("tensorfs_transform", location)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"{target} cannot be imported")
        # Its own directory first, as `python FILE.py` would have it, for its sibling modules.
        sys.path.insert(0, os.path.dirname(location))
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["tensorfs_transform"] = module
        module_spec.loader.exec_module(module)
    else:
        import importlib

        if path:
            sys.path.insert(0, path)
        module = importlib.import_module(target)
    if not hasattr(module, name):
        raise AttributeError(f"{target} has no '{name}'")
    return getattr(module, name), module


def is_transform_spec(obj) -> bool:
    """A Petastorm TransformSpec, recognised by its shape (petastorm need not be installed)."""
    return type(obj).__name__ == "TransformSpec" and hasattr(obj, "func") and hasattr(obj, "removed_fields")


def fixed_shape(column, pa, np):
    """A column of NumPy array cells of one shape (what Petastorm transforms return) as nested
    FixedSizeLists; anything else as pyarrow converts it."""
    first = next((c for c in column if c is not None), None)
    if isinstance(first, np.ndarray) and first.ndim >= 1 and all(
        isinstance(c, np.ndarray) and c.shape == first.shape for c in column
    ):
        return tensor_array(np.stack(list(column)), pa, np)
    return None


def tensor_array(a, pa, np):
    """An array of rank >= 1 as an Arrow array: rank 1 plain, each further dimension a
    FixedSizeList around the next."""
    a = np.ascontiguousarray(a)
    flat = pa.array(a.reshape(-1))
    for size in reversed(a.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat


def as_batch(out, pa, np, columns=None):
    """What the function returned as one RecordBatch (of a DataFrame, only COLUMNS where given)."""
    if isinstance(out, pa.RecordBatch):
        return out
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches(max_chunksize=max(out.num_rows, 1))[0] if out.num_rows else (
            pa.RecordBatch.from_pylist([], schema=out.schema))
    if isinstance(out, dict):
        names, arrays = [], []
        for k, v in out.items():
            names.append(str(k))
            if isinstance(v, (pa.Array, pa.ChunkedArray)):
                arrays.append(v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v)
            else:
                arrays.append(tensor_array(np.asarray(v), pa, np))
        return pa.RecordBatch.from_arrays(arrays, names=names)
    try:
        import pandas as pd
    except ImportError:
        pd = None
    if pd is not None and isinstance(out, pd.DataFrame):
        columns = list(out.columns) if columns is None else columns
        arrays = []
        for name in columns:
            col = out[name]
            arr = fixed_shape(col.to_numpy(), pa, np) if col.dtype == object else None
            arrays.append(arr if arr is not None else pa.Array.from_pandas(col))
        return pa.RecordBatch.from_arrays(arrays, names=[str(c) for c in columns])
    raise TypeError(
        f"the transform returned {type(out).__name__}: return a pyarrow.RecordBatch, a pyarrow.Table, "
        "a pandas.DataFrame or a dict of NumPy arrays"
    )


def main() -> None:
    spec, path = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    request, answers = areas()
    try:
        import numpy as np
        import pyarrow as pa

        fn, module = load(spec, path)
        petastorm = is_transform_spec(fn)
        if not petastorm and not callable(fn):
            raise TypeError(f"transform={spec} is a {type(fn).__name__}, not a function")
    except BaseException as e:  # noqa: BLE001 - every failure to load is the mount's refusal
        send(b"E", where(e).encode())
        return
    send(b"R", json.dumps({"python": sys.version.split()[0], "pyarrow": pa.__version__,
                           "petastorm": petastorm, "sources": sources(spec, path, module)}).encode())
    while True:
        kind, body = receive()
        if kind is None:
            return
        try:
            if kind != b"S" or len(body) != 9:
                raise ValueError(f"the daemon sent an unknown message {kind!r}")
            n, k = struct.unpack("<QB", body)
            area = answers[k] if k < len(answers) else None
            # The request's arrays are the shared memory itself, not a copy of it.
            stream = pa.py_buffer(request.at_least(n)).slice(0, n)
            batch = pa.ipc.open_stream(stream).read_next_batch()
            if petastorm:
                # A block per column: the same frame to the function, without pandas copying the
                # columns into 2-D blocks by dtype first (a quarter of the conversion's time).
                frame = batch.to_pandas(split_blocks=True)
                out = fn.func(frame) if fn.func is not None else frame
                removed = set(fn.removed_fields or [])
                keep = [c for c in out.columns if c not in removed]
                if fn.selected_fields is not None:
                    keep = [c for c in fn.selected_fields if c in set(keep)]
                # The kept columns are taken from the frame itself: `out[keep]` copied every one.
                result = as_batch(out, pa, np, keep)
            else:
                result = as_batch(fn(batch), pa, np)
            if result.num_rows != batch.num_rows:
                raise ValueError(f"the transform returned {result.num_rows} rows for {batch.num_rows}: "
                                 "it must return one row for each row it is given, in order")
            answer(result, pa, area)
        except BaseException as e:  # noqa: BLE001 - reported for this row group, the worker goes on
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            send(b"E", where(e).encode())


if __name__ == "__main__":
    main()
