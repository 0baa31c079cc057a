"""The command line: the mount(8) helper form, --foreground, sources (one file, file:// URL,
lexicographic order, non-Parquet files ignored), daemon life cycle, and docs/cli.md against what
each command's --help prints."""

import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfs
from tfs import batch_name


def test_helper_form_mounts(mounter, shuf_ds):
    """`tensorfs SOURCE MNT -o batch_size=64`, the form mount(8) calls."""
    m = mounter(shuf_ds.path, "batch_size=64", form="helper")
    dj = m.dataset()
    assert dj["batch_size"] == 64
    assert dj["batches_per_epoch"] == 41  # ceil(2600 / 64)
    assert dj["last_batch_rows"] == 2600 - 40 * 64
    assert len(tfs.load_safetensors(m.p("epoch-0", batch_name(40) + ".safetensors"))["id"]) == 40


def test_helper_form_accepts_generic_mount_options(mounter, shuf_ds):
    """mount(8) and mount.fuse3 pass generic options such as rw, nosuid, nodev along."""
    m = mounter(shuf_ds.path, "rw", "nosuid", "nodev", "noatime", "batch_size=64", form="helper")
    assert m.dataset()["batch_size"] == 64


@pytest.mark.skipif(not shutil.which("mount.fuse3"), reason="needs mount.fuse3 (fuse3)")
def test_mount_fuse3_helper(mounter, shuf_ds, tmp_path):
    """`mount -t fuse.tensorfs SOURCE DIR -o OPTS` runs `mount.fuse3 SOURCE DIR -t tensorfs -o OPTS`,
    which runs `tensorfs SOURCE DIR -o OPTS,dev,suid` from PATH. (mount(8) itself resets PATH,
    so it is not called here: that would need tensorfs installed in /usr/bin.)"""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "tensorfs").symlink_to(tfs.BIN)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}")
    mnt = mounter.mountpoint()
    proc = subprocess.run(
        ["mount.fuse3", str(shuf_ds.path), str(mnt), "-t", "tensorfs", "-o", f"batch_size=64,cache_dir={tmp_path / 'c'}"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert tfs.is_mounted(mnt)
    dj = tfs.Mount(mnt, str(shuf_ds.path), [], tmp_path / "c").dataset()
    assert dj["batch_size"] == 64


def test_every_documented_option_accepted(mounter, shuf_ds):
    m = mounter(
        shuf_ds.path,
        "batch_size=100,drop_last,columns=x:id,seed=5,shuffle=window,shuffle_window=3,epochs=2",
        "cache_size=1G,prefetch=2,memory_limit=512M,threads=2,passthrough=off,allow_other,log=warn",
        "nulls=error",
    )
    dj = m.dataset()
    assert (dj["batch_size"], dj["batches_per_epoch"], dj["epochs"]) == (100, 26, 2)
    assert [t["name"] for t in dj["tensors"]] == ["x", "id"]
    b = tfs.load_safetensors(m.p("epoch-1", "000025.safetensors"))
    tfs.assert_array(b["x"], (b["id"] / 2).astype(np.float32), "x")
    # The cache directory is private.
    assert os.stat(m.cache).st_mode & 0o777 == 0o700


def test_allow_other_only_when_asked(mounter, shuf_ds):
    plain = mounter(shuf_ds.path, "batch_size=256")
    other = mounter(shuf_ds.path, "batch_size=256", "allow_other")
    assert "allow_other" not in tfs.mount_options(plain.path), ",".join(tfs.mount_options(plain.path))
    assert "allow_other" in tfs.mount_options(other.path), ",".join(tfs.mount_options(other.path))


def test_foreground(tmp_path, shuf_ds):
    mnt = tmp_path / "fg"
    mnt.mkdir()
    proc = subprocess.Popen(
        [str(tfs.BIN), "mount", str(shuf_ds.path), str(mnt), "-o", f"batch_size=100,cache_dir={tmp_path / 'c'}", "--foreground"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not tfs.is_mounted(mnt):
            assert proc.poll() is None, f"tensorfs --foreground exited {proc.returncode} before mounting"
            assert time.monotonic() < deadline, "not mounted after 60 s"
            time.sleep(0.05)
        assert proc.poll() is None, "--foreground must not return while mounted"
        assert tfs.read_exact(mnt / "dataset.json")
        assert len(tfs.load_safetensors(mnt / "epoch-0" / "000025.safetensors")["id"]) == 100
        subprocess.run(["umount", str(mnt)], check=True, timeout=30)
        assert proc.wait(timeout=30) == 0
    finally:
        tfs.unmount(mnt)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_daemon_exits_after_umount(mounter, shuf_ds):
    for how in (["umount"], ["fusermount3", "-u"]):
        m = mounter(shuf_ds.path, "batch_size=256")
        tfs.sha256(m.p("epoch-0", "000003.safetensors"))
        assert m.pids, "no daemon process found whose command line names the mountpoint"
        subprocess.run([*how, str(m.path)], check=True, timeout=30)
        assert not tfs.is_mounted(m.path)
        assert tfs.wait_exited(m.pids, 15) == [], f"daemon still running 15 s after {how[0]}"


def test_mount_command_detaches_its_output(mounter, shuf_ds):
    """`tensorfs mount` returns and closes the caller's pipes: $(tensorfs mount ...) works."""
    mnt = mounter.mountpoint()
    proc = subprocess.run(
        [str(tfs.BIN), "mount", str(shuf_ds.path), str(mnt), "-o", f"cache_dir={mnt.parent / 'c'}"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert tfs.is_mounted(mnt)


def test_single_file_source(mounter, main_ds):
    m = mounter(main_ds.path / "part-001.parquet", "shuffle=none", "batch_size=400", "columns=id:i32")
    dj = m.dataset()
    assert dj["rows"] == 900
    assert len(dj["files"]) == 1 and os.path.basename(dj["files"][0]["path"]) == "part-001.parquet"
    got = tfs.load_safetensors(m.p("epoch-0", "000002.safetensors"))
    tfs.assert_array(got["id"], main_ds.ref["id"][1100 + 800 : 2000], "id")
    tfs.assert_array(got["i32"], main_ds.ref["i32"][1100 + 800 : 2000], "i32")


def test_file_url_source(mounter, shuf_ds):
    plain = mounter(shuf_ds.path, "batch_size=256", "shuffle=global")
    url = mounter(f"file://{shuf_ds.path}", "batch_size=256", "shuffle=global")
    assert url.dataset()["rows"] == 2600
    for rel in ("epoch-0/000000.safetensors", "epoch-0/000010/id.npy"):
        assert tfs.sha256(url.p(rel)) == tfs.sha256(plain.p(rel))


def test_lexicographic_file_order_and_other_files_ignored(mounter, tmp_path):
    src = tmp_path / "lex"
    src.mkdir()
    # Written in this order; lexicographic order is part-10, part-2, part-9.
    for name, start in (("part-9.parquet", 200), ("part-2.parquet", 100), ("part-10.parquet", 0)):
        pq.write_table(pa.table({"id": pa.array(np.arange(start, start + 100, dtype=np.int64))}), src / name, row_group_size=50)
    (src / "_SUCCESS").write_text("")
    (src / "README.txt").write_text("not data\n")
    (src / "part-0.parquet.crc").write_bytes(b"\x00\x01")
    # Parquet files a writer keeps beside the data, which pyarrow and Spark skip: under a name
    # starting with '_' or '.' (a schema-only _common_metadata style file, Spark's scratch,
    # a Delta log checkpoint, a hidden file). A subdirectory holds data.
    extra = pa.table({"id": pa.array(np.arange(1000, 1010, dtype=np.int64))})
    for rel in ("_meta.parquet", ".hidden.parquet", "_temporary/0/part-0.parquet",
                "_delta_log/00000000000000000010.checkpoint.parquet", "sub/.x/part-0.parquet"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(extra, src / rel)
    (src / "sub").mkdir(exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(np.arange(300, 350, dtype=np.int64))}), src / "sub" / "part-0.parquet")
    m = mounter(src, "shuffle=none", "batch_size=300")
    dj = m.dataset()
    assert [f["path"].removeprefix(str(src) + "/") for f in dj["files"]] == [
        "part-10.parquet", "part-2.parquet", "part-9.parquet", "sub/part-0.parquet"]
    assert dj["rows"] == 350
    got = tfs.load_safetensors(m.p("epoch-0", "000000.safetensors"))["id"]
    tfs.assert_array(got, np.arange(300, dtype=np.int64), "id")


@pytest.mark.parametrize("form", ["mount", "helper", "foreground"])
def test_a_cache_dir_that_cannot_be_made_is_one_line(tmp_path, shuf_ds, form):
    """A cache_dir under a regular file cannot be created: one error line, whether the mount
    daemonises or not, and nothing mounted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = {"mount": ["mount"], "helper": [], "foreground": ["mount", "--foreground"]}[form]
    proc = tfs.run([*args, shuf_ds.path, mnt, "-o", f"cache_dir={blocker / 'cache'}"], timeout=60)
    line = tfs.error_line(proc)
    assert "cache_dir" in line and str(blocker / "cache") in line, line
    assert not tfs.is_mounted(mnt)


def test_a_relative_cache_dir_gives_absolute_paths(tmp_path, shuf_ds):
    """cache_dir=rel/c from a working directory: the gds/ link and user.tensorfs.path name the
    backing file by its absolute path, so they resolve from anywhere."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "rel").mkdir()
    proc = subprocess.run(
        [str(tfs.BIN), "mount", str(shuf_ds.path), str(mnt), "-o", "batch_size=256,cache_dir=rel/c"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    try:
        tfs.read_exact(mnt / "epoch-0" / "000000.safetensors")
        target = os.readlink(mnt / "gds" / "epoch-0" / "000000.safetensors")
        assert target.startswith(str(tmp_path / "rel" / "c") + "/"), target
        assert os.path.isfile(target)
        attr = os.getxattr(mnt / "epoch-0" / "000000.safetensors", "user.tensorfs.path").decode()
        assert attr == target
        dj = json.loads(tfs.read_exact(mnt / "dataset.json"))
        assert dj["options"]["cache_dir"] == str(tmp_path / "rel" / "c")
    finally:
        tfs.unmount(mnt)


def test_stats_command_prints_every_line_docs_stats_md_lists(mounter, shuf_ds):
    """`tensorfs stats MOUNTPOINT` prints one line for each row of docs/stats.md's table, under
    the name the docs give, with the counts of what was read."""
    import re

    m = mounter(shuf_ds.path, "batch_size=10")
    for i in range(3):
        tfs.read_exact(m.p("epoch-0", f"{batch_name(i)}.safetensors"))
    proc = tfs.run(["stats", m.path])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    doc = (tfs.REPO / "docs" / "stats.md").read_text()
    table = doc.split("| line | fields of stats.json |", 1)[1].split("\n\n", 1)[0]
    names = re.findall(r"^\| `([a-z ]+)` \|", table, flags=re.M)
    assert {"served", "cache", "serving", "reader"} <= set(names), names
    for name in names:
        assert any(line.startswith(name + " ") for line in lines), (name, proc.stdout)
    served = next(line for line in lines if line.startswith("served "))
    assert re.match(r"served\s+3 batches", served), served
    cache = next(line for line in lines if line.startswith("cache "))
    assert "MB written" in cache and "writes failed" in cache, cache


def test_the_readme_quick_start_runs_as_written():
    """The README's first block, its commands taken from the README itself (but `scripts/test`,
    which is what runs this): a newcomer's first command mounts the example and trains on it,
    and leaves the mount up."""
    text = (tfs.REPO / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    commands = [c for c in commands if c != "scripts/test"]
    assert commands, block
    mnt = tfs.REPO / "example-mnt"
    try:
        for command in commands:
            proc = subprocess.run(
                ["bash", "-c", command], cwd=tfs.REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800
            )
            assert proc.returncode == 0, f"{command}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "epoch 2:" in proc.stdout and "umount" in proc.stdout, proc.stdout[-2000:]
        assert tfs.is_mounted(mnt)
    finally:
        if tfs.is_mounted(mnt):
            tfs.unmount(mnt)


# Every command of the CLI and the arguments that print its help (`tensorfs help --help` is no
# command line: `tensorfs help` prints the top-level help).
CLI_HELP = {
    "": ["--help"],
    "mount": ["mount", "--help"],
    "inspect": ["inspect", "--help"],
    "warm": ["warm", "--help"],
    "stats": ["stats", "--help"],
    "snapshot": ["snapshot", "--help"],
    "help": ["help"],
}


def _flag_in(flag: str, text: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", text) is not None


def test_docs_cli_md_names_every_command_and_flag_the_help_prints():
    """docs/cli.md cannot drift from the declarations in src/main.rs: every command the top-level
    help lists has a `tensorfs COMMAND` section there, and every long flag (`--something`), short
    flag (`-x` of an option line) and `--format` value each command's `--help` prints appears in
    it."""
    doc = (tfs.REPO / "docs" / "cli.md").read_text()
    top = tfs.run(["--help"])
    assert top.returncode == 0, top.stderr
    commands = top.stdout.split("Commands:", 1)[1].split("Options:", 1)[0]
    listed = re.findall(r"^  ([a-z]+)  ", commands, re.M)
    assert sorted(listed) == sorted(c for c in CLI_HELP if c), f"--help lists {listed}; CLI_HELP has {list(CLI_HELP)}"
    missing = []
    for command, args in CLI_HELP.items():
        if command:
            heading = f"## `tensorfs {command}`"
            if heading not in doc:
                missing.append(f"the section {heading!r}")
        proc = tfs.run(args)
        assert proc.returncode == 0, f"tensorfs {' '.join(args)}: {proc.stderr}"
        out = proc.stdout
        long_flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out))
        short_flags = set(re.findall(r"^\s+(-[A-Za-z])(?:,|\s)", out, re.M))
        values = set(re.findall(r"^\s+- ([a-z][a-z0-9-]*): ", out, re.M))  # clap's "Possible values"
        assert long_flags, f"tensorfs {' '.join(args)} printed no long flag:\n{out}"
        for flag in sorted(long_flags | short_flags):
            if not _flag_in(flag, doc):
                missing.append(f"{flag} (tensorfs {' '.join(args)})")
        for value in sorted(values):
            if f"`{value}`" not in doc:
                missing.append(f"the value `{value}` (tensorfs {' '.join(args)})")
    assert not missing, "docs/cli.md lacks: " + ", ".join(missing)
