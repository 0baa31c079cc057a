"""The Python blocks of the user docs (README.md, docs/reading.md, docs/many-hosts.md,
docs/python.md) run as written against a real mount, so the docs cannot drift from the product.

Each ```python fenced block of those files, parsed out of the markdown at collection time, is one
test case, with an id `FILE:N-HEADING` (N counts the file's Python blocks from 1). For each:

- The mount. A small dataset holding every column the blocks read (see `snippet_ds`) is
  mounted with the options the doc states first before the block: the first `-o OPTS` in the
  file above it (README, many-hosts.md and python.md: the `tensorfs mount` shell line;
  reading.md: "mounted with `-o batch_size=1024,epochs=10`"). Adapted for a one-host test:
  `cache_dir=` is the test's own; `snapshot=` is a snapshot the test takes of the dataset with
  `tensorfs snapshot`; `world_size=` is WORLD (the doc's `$W`), `partitions=` is PARTITIONS (the
  doc's 1920, scaled down to a multiple of WORLD whose partitions each hold full batches);
  `pad=tokens:PAD` is added, since the dataset's `tokens` column is a variable-length list. Every
  other option (batch_size, epochs, ...) is the doc's, so the blocks' `range(10)` epoch loops and
  `B = 1024` stand as written.
- The code. "/mnt/train" (the mount point the docs use) becomes the real mount point; nothing
  else of the block is changed.
- Continuations. A block that uses names it does not bind (the docs' fragments: the token
  stream's `np`, DALI's second pipeline's `meta`, `names`, `root`) continues an earlier block:
  the nearest earlier Python block of the same file that binds one of those names is put in front
  of it, repeatedly, until every name is bound. A name that no earlier block binds fails the test,
  except the placeholders the prose leaves to the reader (PLACEHOLDERS: many-hosts.md's training
  `step`), which get a stand-in that checks its arguments.
- Dependencies. The modules the (assembled) block imports must be importable
  (importlib.util.find_spec, in this interpreter, which also runs the blocks); else the test is
  skipped naming them ("needs jax, not installed"). `cupy` and `kvikio` also need a CUDA device
  (/dev/nvidiactl). So each block runs wherever its dependencies exist.
- Ranks. A block that reads RANK from the environment (the torchrun `train.py`) runs as torchrun
  would run it: WORLD processes at once, with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR and MASTER_PORT set. Every other block runs once, with none of them set.
- What is asserted. Each process runs with a timeout and must exit 0 with no traceback. An
  epilogue appended to the block then checks what the block left behind: every name the block
  binds at module level is bound (so a loop that never ran, over an empty loader, fails), and
  every value holding batch data (a dict of tensors, or an array named after a column with that
  column's dtype and row shape) holds rows of the dataset: each row's columns encode one row id,
  consistently (see `snippet_ds`), and no id is repeated. At least one such value must be checked.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import inspect
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import tfs

sys.path.insert(0, str(tfs.REPO / "python"))  # the tensorfs package, as the wheel installs it

DOCS = ["README.md", "docs/reading.md", "docs/many-hosts.md", "docs/python.md"]
DOC_MOUNT = "/mnt/train"  # the mount point the docs' blocks use
WORLD = 2  # the processes of a torchrun job, on this one host
PARTITIONS = 4  # a multiple of WORLD; each partition holds 2 full batches of 1024 rows
PAD = 32  # pad=tokens:PAD
EMB = 16  # emb is float32 [EMB]
TOKENS_MOD = 37  # row r has r % TOKENS_MOD tokens: lengths 0..36, so some are cut to PAD
FILES = [("part-000.parquet", 3000), ("part-001.parquet", 3316), ("part-002.parquet", 3000)]
ROW_GROUP = 500
ROWS = sum(n for _, n in FILES)  # 9316: 9 full batches of 1024 and one of 100
CUDA_MODULES = {"cupy", "kvikio"}
PROC_TIMEOUT = 120

# Names the prose leaves to the reader, and the stand-in each gets.
PLACEHOLDERS = {
    # many-hosts.md: "step(x[...], y[...])  # batch i of this rank": the training step.
    "step": (
        "def step(x, y):  # stand-in for the reader's training step (test_snippets.py)\n"
        "    import numpy as _np\n"
        "    assert 0 < len(x) == len(y), (len(x), len(y))\n"
        "    assert _np.array_equal(_np.asarray(y), 2 * _np.asarray(x).astype(_np.int64)), 'y != 2x'\n"
    ),
}


# --------------------------------------------------------------------------------------------
# The markdown
# --------------------------------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


@dataclass
class Block:
    doc: str  # e.g. "docs/reading.md"
    n: int  # 1-based among the file's Python blocks
    line: int  # of the opening fence
    heading: str
    code: str = field(repr=False)
    before: str = field(repr=False)  # the file's text above the block

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")[:40] or "top"
        return f"{Path(self.doc).name}:{self.n}-{slug}"


def python_blocks(doc: str) -> list[Block]:
    """Every ```python fenced block of DOC, in order, with the heading it sits under."""
    lines = (tfs.REPO / doc).read_text().splitlines()
    out: list[Block] = []
    heading, i = "", 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            h = HEADING.match(lines[i])
            if h:
                heading = h.group(1)
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if info == "python":
            before = "\n".join(lines[:start])
            out.append(Block(doc, len(out) + 1, start + 1, heading, "\n".join(body) + "\n", before))
    return out


ALL_BLOCKS = {doc: python_blocks(doc) for doc in DOCS}
CASES = [b for doc in DOCS for b in ALL_BLOCKS[doc]]


def test_the_docs_have_python_blocks():
    """The parser finds the blocks (a changed fence style would otherwise leave nothing to run)."""
    for doc in DOCS:
        assert ALL_BLOCKS[doc], f"no ```python block found in {doc}"
    assert len(CASES) >= 10, [b.id for b in CASES]


# --------------------------------------------------------------------------------------------
# Names a block binds and uses
# --------------------------------------------------------------------------------------------


def _import_binding(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def all_bound(tree: ast.AST) -> set[str]:
    """Every name the code binds anywhere (any scope)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(_import_binding(a) for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def module_bound(tree: ast.Module) -> list[str]:
    """The names the code binds at module level when every statement of it runs (loop bodies
    included, exception handlers, functions and classes' insides not)."""
    out: list[str] = []

    def add(name):
        if name not in out:
            out.append(name)

    def targets(node):
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                add(n.id)

    def stmts(body):
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                add(s.name)
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                for a in s.names:
                    add(_import_binding(a))
            elif isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for t in s.targets if isinstance(s, ast.Assign) else [s.target]:
                    targets(t)
            elif isinstance(s, (ast.For, ast.AsyncFor)):
                targets(s.target)
                stmts(s.body)
                stmts(s.orelse)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                for item in s.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                stmts(s.body)
            elif isinstance(s, (ast.While, ast.If)):
                stmts(s.body)
                stmts(s.orelse)
            elif isinstance(s, ast.Try):
                stmts(s.body)
                stmts(s.orelse)
                stmts(s.finalbody)

    stmts(tree.body)
    return out


def free_names(code: str) -> set[str]:
    """Names the code reads but binds nowhere, builtins aside."""
    tree = ast.parse(code)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - all_bound(tree) - set(dir(builtins))


def imported_modules(code: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return list(dict.fromkeys(out))


def assemble(block: Block) -> tuple[list[Block], str]:
    """BLOCK with the earlier blocks of its file that it continues (see the module docstring),
    and the placeholders it uses; fails when a name is bound nowhere."""
    blocks = ALL_BLOCKS[block.doc]
    chain = [block]
    while True:
        code = "".join(b.code for b in chain)
        free = free_names(code) - set(PLACEHOLDERS)
        if not free:
            break
        first = blocks.index(chain[0])
        for j in range(first - 1, -1, -1):
            if free & set(module_bound(ast.parse(blocks[j].code))):
                chain.insert(0, blocks[j])
                break
        else:
            pytest.fail(
                f"{block.id} ({' + '.join(f'{b.doc}:{b.line}' for b in chain)}) uses {sorted(free)}, which "
                f"neither it nor an earlier Python block of {block.doc} defines"
            )
    used = free_names(code)
    prelude = "".join(PLACEHOLDERS[name] for name in sorted(used & set(PLACEHOLDERS)))
    return chain, prelude + code


def missing_dependencies(code: str) -> list[str]:
    missing, absent = [], []
    for mod in imported_modules(code):
        if any(mod.startswith(a + ".") for a in absent):
            continue  # jax.numpy when jax is missing
        try:
            found = importlib.util.find_spec(mod) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            absent.append(mod)
            missing.append(f"{mod}, not installed")
        elif mod.split(".")[0] in CUDA_MODULES and not os.path.exists("/dev/nvidiactl"):
            missing.append(f"{mod} with a CUDA GPU, none here")
    return missing


# --------------------------------------------------------------------------------------------
# The dataset, and what the blocks' values must hold
# --------------------------------------------------------------------------------------------

# Columns and what each row r holds (every value exact in its dtype):
#   label int64 r; x float32 r; y int64 2r; emb float32 [EMB] r + j/16;
#   tokens list<int32> [r, r+1, ..., r + r%37 - 1], served as tokens [PAD] (cut, zero-padded)
#   and tokens.len int32 min(r % 37, PAD).
COLUMNS = {
    "label": ("int64", ()),
    "x": ("float32", ()),
    "y": ("int64", ()),
    "emb": ("float32", (EMB,)),
    "tokens": ("int32", (PAD,)),
    "tokens.len": ("int32", ()),
}


@pytest.fixture(scope="module")
def snippet_ds(tmp_path_factory) -> tfs.Dataset:
    tables, start = [], 0
    for name, n in FILES:
        r = np.arange(start, start + n, dtype=np.int64)
        emb = r[:, None].astype(np.float32) + np.arange(EMB, dtype=np.float32) / 16
        tokens = [list(range(k, k + k % TOKENS_MOD)) for k in r.tolist()]
        table = pa.table(
            {
                "label": pa.array(r),
                "x": pa.array(r.astype(np.float32)),
                "y": pa.array(2 * r),
                "emb": tfs.fsl(emb, EMB),
                "tokens": pa.array(tokens, type=pa.list_(pa.int32())),
            }
        )
        tables.append((name, table))
        start += n
    path = tmp_path_factory.mktemp("snippets") / "train"
    return tfs.Dataset(path, tfs.write_dataset(path, tables, ROW_GROUP))


def _snippet_report(g, names, columns, rows, pad, tokens_mod):
    """Runs in the block's process, after it (its source is appended to the block): prints one
    line `SNIPPET-REPORT {json}` saying which of NAMES the block left unbound and which values it
    checked; a value that breaks the dataset's encoding raises AssertionError."""
    import json

    import numpy as np

    def arr(v):
        if hasattr(v, "detach"):  # torch
            v = v.detach().cpu()
        return np.asarray(v)

    def column_of(name, a):
        """The column NAME (or its plural) names, if A has that column's dtype and row shape."""
        col = name if name in columns else None
        if col is None and name.endswith("s") and name[:-1] in columns:
            col = name[:-1]  # labels
        if col is None or not hasattr(a, "dtype") or not hasattr(a, "shape") or len(a.shape) < 1:
            return None
        dtype, shape = columns[col]
        return col if str(a.dtype) == dtype and tuple(a.shape[1:]) == tuple(shape) else None

    def ids_of(col, a, what):
        """The row ids that column COL's rows A encode (-1: not told by this column alone)."""
        a = arr(a)
        if col == "label":
            ids = a.astype(np.int64)
        elif col == "x":
            ids = a.astype(np.int64)
            assert np.array_equal(ids.astype(np.float32), a), f"{what}: x not whole numbers"
        elif col == "y":
            assert (a % 2 == 0).all(), f"{what}: y not even"
            ids = a // 2
        elif col == "emb":
            ids = a[:, 0].astype(np.int64)
            want = ids[:, None].astype(np.float32) + np.arange(a.shape[1], dtype=np.float32) / 16
            assert np.array_equal(a, want), f"{what}: emb rows are not r + j/16"
        elif col == "tokens":
            ids = np.where(a[:, 0] != 0, a[:, 0], -1).astype(np.int64)
            known = ids >= 0
            lens = np.minimum(ids % tokens_mod, pad)
            want = ids[:, None] + np.arange(pad)
            want = np.where(np.arange(pad) < lens[:, None], want, 0)
            assert np.array_equal(a[known], want[known]), f"{what}: tokens rows are not r, r+1, ... padded"
            assert not a[~known].any(), f"{what}: a tokens row starting with 0 is not all zeros"
        else:
            ids = np.full(len(a), -1, dtype=np.int64)
        known = ids[ids >= 0]
        assert ((known >= 0) & (known < rows)).all(), f"{what}: row ids out of [0, {rows}): {known[:8]}"
        assert len(np.unique(known)) == len(known), f"{what}: a row appears twice"
        return ids

    checked, unbound = [], [n for n in names if n not in g]
    for name, v in list(g.items()):
        if name.startswith("_") or name not in names:
            continue
        batch_like = isinstance(v, dict) and v and set(v) <= set(columns)
        if batch_like and all(len(getattr(t, "shape", ())) for t in v.values()):  # a batch: {name: tensor}
            a = {k: arr(t) for k, t in v.items()}
            lengths = {k: len(t) for k, t in a.items()}
            assert len(set(lengths.values())) == 1 and min(lengths.values()) > 0, f"{name}: lengths {lengths}"
            ids = None
            for k, t in a.items():
                assert column_of(k, t) == k, f"{name}[{k!r}]: dtype {t.dtype} shape {t.shape}, not the column's"
                got = ids_of(k, t, f"{name}[{k!r}]")
                if ids is None:
                    ids = got
                else:
                    both = (ids >= 0) & (got >= 0)
                    assert np.array_equal(ids[both], got[both]), f"{name}[{k!r}]: rows not aligned with the others"
                    ids = np.where(ids >= 0, ids, got)
            if "tokens.len" in a and (ids >= 0).all():
                want = np.minimum(ids % tokens_mod, pad)
                assert np.array_equal(a["tokens.len"], want), f"{name}['tokens.len'] wrong"
            checked.append(name)
        else:
            col = column_of(name, v)
            if col is not None and len(v) > 0:
                ids_of(col, v, name)
                checked.append(name)
    print("SNIPPET-REPORT " + json.dumps({"unbound": unbound, "checked": checked}), flush=True)


def epilogue(code: str) -> str:
    names = [n for n in module_bound(ast.parse(code)) if not n.startswith("_")]
    args = (names, COLUMNS, ROWS, PAD, TOKENS_MOD)
    return (
        "\n\n# ---- appended by tests/integration/test_snippets.py ----\n"
        + inspect.getsource(_snippet_report)
        + f"\n_snippet_report(globals(), *{args!r})\n"
    )


# --------------------------------------------------------------------------------------------
# Mount options, from the doc
# --------------------------------------------------------------------------------------------


def doc_options(block: Block) -> str:
    """The first `-o OPTS` of the block's file, above the block."""
    m = re.search(r"(?<![\w-])-o\s+([^\s`'\"]+)", block.before)
    assert m, f"{block.doc} states no mount options (-o ...) above line {block.line}"
    return m.group(1)


def adapted_options(stated: str, snapshot) -> list[str]:
    out = []
    for opt in tfs.split_options(stated):
        key, _, _ = opt.partition("=")
        if key == "cache_dir":
            continue  # the mounter gives each mount its own
        if key == "snapshot":
            out.append(f"snapshot={snapshot()}")
        elif key == "world_size":
            out.append(f"world_size={WORLD}")
        elif key == "partitions":
            out.append(f"partitions={PARTITIONS}")
        else:
            out.append(opt)
    return [*out, f"pad=tokens:{PAD}"]


# --------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------

RANK_FROM_ENV = re.compile(r"""environ(?:\.get\(\s*|\[\s*)["']RANK["']""")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("block", CASES, ids=[b.id for b in CASES])
def test_doc_block_runs_against_a_mount(block: Block, snippet_ds, mounter, tmp_path):
    chain, code = assemble(block)
    where = " + ".join(f"{b.doc}:{b.line}" for b in chain)
    missing = missing_dependencies(code)
    if missing:
        pytest.skip(f"needs {'; '.join(missing)}")
    assert DOC_MOUNT in code, f"{where}: the block does not read {DOC_MOUNT}"

    def snapshot():
        pin = tmp_path / "train.snapshot"
        proc = tfs.run(["snapshot", snippet_ds.path, pin, "-o", f"pad=tokens:{PAD},cache_dir={tmp_path / 'pin-cache'}"])
        assert proc.returncode == 0, f"tensorfs snapshot failed:\n{proc.stderr}"
        return pin

    stated = doc_options(block)
    m = mounter(snippet_ds.path, *adapted_options(stated, snapshot))
    meta = m.dataset()
    assert meta["rows"] == ROWS

    script = tmp_path / "snippet.py"
    # A block that hangs prints every thread's stack before the test gives up on it.
    watchdog = f"import faulthandler; faulthandler.dump_traceback_later({PROC_TIMEOUT - 15}, exit=True)\n"
    script.write_text(watchdog + code.replace(DOC_MOUNT, str(m.path)) + epilogue(code))

    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tfs.REPO / "python"), env.get("PYTHONPATH")]))
    if RANK_FROM_ENV.search(code):  # run as torchrun would: WORLD processes
        assert meta["world_size"] == WORLD, f"a rank block against a mount without world_size={WORLD}: {stated}"
        port = str(free_port())
        envs = [
            {
                **env,
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(WORLD),
                "LOCAL_WORLD_SIZE": str(WORLD),
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                # gloo binds the address the host name resolves to; on a machine whose name
                # resolves to an address it cannot reach, the ranks wait for each other forever.
                "GLOO_SOCKET_IFNAME": "lo",
            }
            for r in range(WORLD)
        ]
    else:
        envs = [env]

    # Run them all at once (a torchrun job's ranks start together), then judge each.
    runs = []
    for k, e in enumerate(envs):
        out = open(tmp_path / f"out-{k}.txt", "w+")
        proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=tmp_path, env=e, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT,
        )
        runs.append((proc, out))
    results = []
    for proc, out in runs:
        try:
            rc = proc.wait(PROC_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        out.seek(0)
        results.append((rc, out.read()))
        out.close()
    for k, (rc, text) in enumerate(results):
        who = f"{block.id} ({where}; mounted with {' '.join(m.options)})" + (f", RANK={k}" if len(envs) > 1 else "")
        assert rc is not None, f"{who}: still running after {PROC_TIMEOUT} s:\n{text[-4000:]}"
        assert rc == 0, f"{who}: exit status {rc}:\n{text[-4000:]}"
        assert "Traceback (most recent call last)" not in text, f"{who}: printed a traceback:\n{text[-4000:]}"
        reports = [line for line in text.splitlines() if line.startswith("SNIPPET-REPORT ")]
        assert reports, f"{who}: the block did not run to its end (no report):\n{text[-4000:]}"
        report = json.loads(reports[-1].split(" ", 1)[1])
        assert not report["unbound"], f"{who}: {report['unbound']} never bound (a loop that never ran?)"
        assert report["checked"], f"{who}: left no batch data behind to check"
        print(f"{who}: checked {report['checked']}")
