//! Your own transforms, pushed down and cached (PRODUCT.md §10): a Python function called on
//! row groups in a pool of worker processes, its output what the cache keeps.
//!
//! Each worker is `python -c worker.py SPEC [PATH]`, asked on its stdin and answering on its
//! stdout: the daemon writes a row group as an Arrow IPC stream (the `arrow` crate's) into
//! memory shared with the worker, the worker writes the function's output as one into one of
//! two answer areas shared the same way, which the daemon reads in place, or answers with the
//! exception in one line (`worker.py`'s docstring has the framing). Through pipes, each row
//! group took two more copies each way, in the kernel, into fresh memory (7% of a cold epoch's
//! CPU with a TransformSpec, the daemon's and the workers' together); the pipes still carry the
//! messages, so a worker that dies shows as the end of its pipe. A dead worker is replaced, and
//! the row group it had is given to the new one once.
//!
//! The function is identified by a digest of its source files (the file named and the `.py`
//! files beside it, or the module's, or every `.py` under `transform_path=`) and
//! `transform_version=`: the cache keys decoded columns by it, so a changed function runs
//! again and is never mixed with old output.

use anyhow::{Context, Result, anyhow, bail};
use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use memmap2::{Mmap, MmapMut};
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};

const WORKER: &str = include_str!("worker.py");

/// How a transform is asked for: the mount options of PRODUCT.md §10.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransformOptions {
    /// `FILE.py:NAME` or `MODULE:NAME`.
    pub target: String,
    /// `transform_path=`: where MODULE is imported from.
    pub(crate) path: Option<PathBuf>,
    /// `transform_version=`: what the digest cannot see (a vocabulary file's version).
    pub(crate) version: String,
    /// `transform_workers=`.
    pub(crate) workers: usize,
    /// `python=`.
    pub(crate) python: String,
    /// `transform_columns=`: the source columns the function reads (all where empty).
    pub(crate) columns: Vec<String>,
}

/// Why a call gave no output.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The function raised: its exception in one line.
    #[error("the transform raised {0}")]
    Raised(String),
    /// The worker could not be reached, or died twice on this row group.
    #[error("the transform's worker {0}")]
    Worker(String),
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The request the worker reads: written by the daemon only while the worker is idle.
    request: Request,
    /// Where the worker writes its answers, each written only when a request names it.
    answers: [Answer; 2],
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a worker said when it started.
#[derive(Debug, serde::Deserialize)]
struct Hello {
    python: String,
    pyarrow: String,
    petastorm: bool,
    sources: Vec<PathBuf>,
}

/// The pool of workers for one transform.
pub struct Udf {
    spec: TransformOptions,
    /// Hex digest of the function's sources, the spec and the version.
    digest: String,
    /// Whether the function is a Petastorm TransformSpec.
    pub petastorm: bool,
    /// The interpreter's and pyarrow's versions, for the log and dataset.json.
    pub runtime: String,
    slots: Vec<Mutex<Option<Worker>>>,
    idle: Mutex<Vec<usize>>,
    freed: Condvar,
}

impl Udf {
    /// Starts the pool's first worker (the others start on first use) and checks what the
    /// function is: an import that fails, a name that is missing, or (as root) a source that
    /// other users may write refuses the mount, in one line.
    pub(crate) fn start(spec: TransformOptions) -> Result<Udf> {
        if let Some(dir) = &spec.path
            && !dir.is_dir()
        {
            bail!("transform_path={} is not a directory", dir.display());
        }
        if let Some((file, _)) = spec.target.rsplit_once(':')
            && file.ends_with(".py")
            && !Path::new(file).is_file()
        {
            bail!("transform={}: no such file '{file}'", spec.target);
        }
        let (worker, hello) = spawn(&spec)?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let mut checked: Vec<&Path> = hello.sources.iter().map(PathBuf::as_path).collect();
            checked.extend(spec.path.as_deref());
            for p in checked {
                if let Some(why) = writable_by_others(p) {
                    bail!(
                        "transform={}: {why}; as root, tensorfs runs no code other users may change",
                        spec.target
                    );
                }
            }
        }
        let digest = digest(&spec, &hello.sources)?;
        let n = spec.workers.max(1);
        let slots: Vec<Mutex<Option<Worker>>> = (0..n).map(|_| Mutex::new(None)).collect();
        *slots[0].lock().unwrap() = Some(worker);
        Ok(Udf {
            runtime: format!("Python {}, pyarrow {}", hello.python, hello.pyarrow),
            petastorm: hello.petastorm,
            spec,
            digest,
            slots,
            idle: Mutex::new((0..n).rev().collect()),
            freed: Condvar::new(),
        })
    }

    pub fn spec(&self) -> &TransformOptions {
        &self.spec
    }

    /// The function's identity: what the cache keys its output by.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The function applied to `batch` (source rows) by one of the workers: its output, the same
    /// number of rows. Blocks until a worker is free; a worker that dies is replaced and the
    /// batch given to its replacement once.
    pub(crate) fn call(&self, batch: &RecordBatch) -> Result<RecordBatch, CallError> {
        let slot = self.take();
        let answer = self.call_on(slot, batch);
        self.idle.lock().unwrap().push(slot);
        self.freed.notify_one();
        answer
    }

    /// Waits for an idle worker slot.
    fn take(&self) -> usize {
        let mut idle = self.idle.lock().unwrap();
        loop {
            if let Some(i) = idle.pop() {
                return i;
            }
            idle = self.freed.wait(idle).unwrap();
        }
    }

    fn call_on(&self, slot: usize, batch: &RecordBatch) -> Result<RecordBatch, CallError> {
        let mut worker = self.slots[slot].lock().unwrap();
        let mut died = None;
        for _ in 0..2 {
            if worker.is_none() {
                match spawn(&self.spec) {
                    Ok((w, _)) => *worker = Some(w),
                    Err(e) => return Err(CallError::Worker(format!("cannot start: {e:#}"))),
                }
            }
            let w = worker.as_mut().expect("started above");
            match exchange(w, batch) {
                Ok(Answered::Batch(stream)) => {
                    return decode(stream).map_err(|e| CallError::Worker(format!("{e:#}")));
                }
                Ok(Answered::Message(b'E', body)) => {
                    return Err(CallError::Raised(
                        String::from_utf8_lossy(&body).into_owned(),
                    ));
                }
                Ok(Answered::Message(kind, _)) => {
                    died = Some(format!(
                        "answered with an unknown message '{}'",
                        kind as char
                    ));
                }
                Err(e) => {
                    let status = w.child.try_wait().ok().flatten();
                    died = Some(match status {
                        Some(s) => format!("died ({s})"),
                        None => format!("stopped answering ({e})"),
                    });
                }
            }
            // Dropped (killed and reaped): the next try starts a new one.
            *worker = None;
            tracing::warn!(
                "transform={}: a worker {}; it is replaced",
                self.spec.target,
                died.as_deref().unwrap_or("failed")
            );
        }
        Err(CallError::Worker(format!(
            "{} twice on this row group",
            died.unwrap_or_default()
        )))
    }
}

/// The pipe buffer asked for from a worker to the daemon: the default most an unprivileged
/// process may set (`/proc/sys/fs/pipe-max-size`).
const PIPE_BYTES: libc::c_int = 1 << 20;

/// Starts one worker and reads its hello.
fn spawn(spec: &TransformOptions) -> Result<(Worker, Hello)> {
    let shared_memory = "memory to share with a transform worker";
    let request = Request::new().context(shared_memory)?;
    let answers = [
        Answer::new().context(shared_memory)?,
        Answer::new().context(shared_memory)?,
    ];
    let shared = [
        request.file.as_raw_fd(),
        answers[0].file.as_raw_fd(),
        answers[1].file.as_raw_fd(),
    ];
    let mut cmd = Command::new(&spec.python);
    cmd.arg("-c").arg(WORKER).arg(&spec.target);
    if let Some(p) = &spec.path {
        cmd.arg(p);
    }
    let fds: Vec<String> = shared.iter().map(i32::to_string).collect();
    cmd.env("TENSORFS_SHARED_FDS", fds.join(","));
    // SAFETY: between fork and exec only fcntl runs, which is async-signal-safe; it lets the
    // worker keep the three descriptors (opened close-on-exec, so no other child has them).
    unsafe {
        cmd.pre_exec(move || {
            for fd in shared {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // The worker's own output goes where the daemon's does: its log.
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(|e| {
        anyhow!(
            "transform={}: python={} cannot be started: {e}",
            spec.target,
            spec.python
        )
    })?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    // An answer through the pipe (both answer areas still in use) is megabytes: in the default
    // 64 KiB of a pipe, each of its pieces was a switch between the daemon and the worker. The
    // most an unprivileged pipe may hold is asked for; where the system allows less, the
    // default stays.
    // SAFETY: fcntl on a descriptor this process owns; no memory is passed.
    unsafe { libc::fcntl(stdout.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
    let stdout = BufReader::new(stdout);
    let mut worker = Worker {
        child,
        stdin,
        stdout,
        request,
        answers,
    };
    let (kind, body) = read_message(&mut worker.stdout).map_err(|e| {
        let status = worker.child.try_wait().ok().flatten();
        anyhow!(
            "transform={}: the worker ({}) exited before it was ready{}: {e}; it needs pyarrow",
            spec.target,
            spec.python,
            status.map(|s| format!(" ({s})")).unwrap_or_default()
        )
    })?;
    match kind {
        b'R' => {
            let hello: Hello = serde_json::from_slice(&body)
                .with_context(|| format!("transform={}: the worker's hello", spec.target))?;
            Ok((worker, hello))
        }
        _ => bail!(
            "transform={}: {}",
            spec.target,
            String::from_utf8_lossy(&body)
        ),
    }
}

/// What a worker answered: the function's output as an IPC stream, or another message.
enum Answered {
    Batch(Buffer),
    Message(u8, Vec<u8>),
}

/// Sends one request and reads one answer.
fn exchange(w: &mut Worker, batch: &RecordBatch) -> std::io::Result<Answered> {
    let len = w.request.write(batch)?;
    // An answer area still read by the daemon (its arrays not yet made tensors) is not written
    // over: with both in use, the answer comes through the pipe.
    let area = (w.answers.iter()).position(Answer::is_free);
    let mut message = [0u8; 18];
    message[0] = b'S';
    message[1..9].copy_from_slice(&9u64.to_le_bytes());
    message[9..17].copy_from_slice(&(len as u64).to_le_bytes());
    message[17] = area.map_or(u8::MAX, |a| a as u8);
    w.stdin.write_all(&message)?;
    w.stdin.flush()?;
    let (kind, body) = read_message(&mut w.stdout)?;
    // Answered: the worker reads the request no more.
    release(&w.request.file, len);
    match (kind, area) {
        (b'B', _) => Ok(Answered::Batch(Buffer::from_vec(body))),
        (b'A', Some(a)) => {
            let len = match <[u8; 8]>::try_from(body.as_slice()) {
                Ok(len) => u64::from_le_bytes(len),
                Err(_) => {
                    return Err(std::io::Error::other(
                        "an answer's length of other than 8 bytes",
                    ));
                }
            };
            w.answers[a].read(len).map(Answered::Batch)
        }
        _ => Ok(Answered::Message(kind, body)),
    }
}

/// A memory file shared with a worker, as its `File`.
fn shared_file(name: &std::ffi::CStr) -> std::io::Result<File> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the descriptor returned is
    // owned by the File.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened, and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The size an area starts at: pages are taken only as they are written.
const AREA_START: u64 = 1 << 20;

/// The daemon's side of the request area: a row group written as an IPC stream.
struct Request {
    file: File,
    map: MmapMut,
}

impl Request {
    fn new() -> std::io::Result<Request> {
        let file = shared_file(c"tensorfs-request")?;
        file.set_len(AREA_START)?;
        // SAFETY: the file is this process's memory file, which only grows (the worker reads it).
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(Request { file, map })
    }

    /// Writes `batch` at the area's start, grown as it must be, and says how many bytes.
    fn write(&mut self, batch: &RecordBatch) -> std::io::Result<usize> {
        let mut at = Cursor {
            request: self,
            len: 0,
        };
        let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut at, &batch.schema())
            .map_err(std::io::Error::other)?;
        writer.write(batch).map_err(std::io::Error::other)?;
        writer.finish().map_err(std::io::Error::other)?;
        drop(writer);
        Ok(at.len)
    }
}

/// Writes into the request area from its start.
struct Cursor<'a> {
    request: &'a mut Request,
    len: usize,
}

impl Write for Cursor<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.len + buf.len();
        let r = &mut *self.request;
        if end > r.map.len() {
            // Grown by doubling: the bytes written stay in the file and show in the new map.
            let size = (end as u64).max(2 * r.map.len() as u64);
            r.file.set_len(size)?;
            // SAFETY: as in Request::new.
            r.map = unsafe { MmapMut::map_mut(&r.file)? };
        }
        r.map[self.len..end].copy_from_slice(buf);
        self.len = end;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The daemon's side of an answer area: the worker writes an IPC stream at its start (growing
/// the file as it must); the arrays decoded from it are the map's own memory, each holding the
/// answer's [`Lease`], so the area is free again once the last of them is dropped.
struct Answer {
    file: Arc<File>,
    map: Arc<Mmap>,
    lease: std::sync::Weak<Lease>,
}

/// An answer read in place: what its arrays hold. Dropped with the last of them, it gives back
/// the pages of an answer larger than [`KEEP_BYTES`].
struct Lease {
    file: Arc<File>,
    _map: Arc<Mmap>,
    len: usize,
}

impl Drop for Lease {
    fn drop(&mut self) {
        release(&self.file, self.len);
    }
}

/// The bytes of an area whose pages are kept from one call to the next: a worker's row groups
/// rewrite the same pages, where fresh ones each time cost a fault a page (given back after
/// each call, a cold epoch with a TransformSpec took 14% more CPU, its page faults 7x). Beyond
/// it the pages are given back once read: a host of many workers given large row groups would
/// hold three of them each, idle or not; at most 48 MiB a worker is held so.
const KEEP_BYTES: usize = 16 << 20;

/// Gives back the pages of an area's first `len` bytes, where more than [`KEEP_BYTES`]: its
/// size and every map of it stay as they are (a page given back reads as zeros, and a write
/// takes a new one).
fn release(file: &File, len: usize) {
    if len <= KEEP_BYTES {
        return;
    }
    // SAFETY: fallocate on a descriptor this process owns; no memory is passed.
    unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            len as libc::off_t,
        )
    };
}

impl Answer {
    fn new() -> std::io::Result<Answer> {
        let file = shared_file(c"tensorfs-answer")?;
        file.set_len(AREA_START)?;
        // SAFETY: the worker writes the file only while no array of the daemon's is in it (see
        // `read`), and never shrinks it.
        let map = Arc::new(unsafe { Mmap::map(&file)? });
        Ok(Answer {
            file: Arc::new(file),
            map,
            lease: std::sync::Weak::new(),
        })
    }

    fn is_free(&self) -> bool {
        self.lease.strong_count() == 0
    }

    /// The first `len` bytes the worker wrote, as a buffer holding their lease.
    fn read(&mut self, len: u64) -> std::io::Result<Buffer> {
        if len > self.map.len() as u64 {
            // SAFETY: as in Answer::new; the old map is free (the worker was asked to write).
            self.map = Arc::new(unsafe { Mmap::map(&*self.file)? });
        }
        if len > self.map.len() as u64 || len == 0 {
            return Err(std::io::Error::other(format!(
                "an answer of {len} bytes in an area of {}",
                self.map.len()
            )));
        }
        let lease = Arc::new(Lease {
            file: self.file.clone(),
            _map: self.map.clone(),
            len: len as usize,
        });
        self.lease = Arc::downgrade(&lease);
        let start = NonNull::new(self.map.as_ptr() as *mut u8).expect("a map is never null");
        // SAFETY: the map's first `len` bytes are mapped (checked above) and stay so while the
        // buffer holds the lease, which holds the map; nothing writes them until the lease is
        // dropped (`is_free`).
        Ok(unsafe { Buffer::from_custom_allocation(start, len as usize, lease) })
    }
}

/// The largest answer taken: a row group's output of more is a function gone wrong.
const ANSWER_LIMIT: u64 = 64 << 30;

fn read_message(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let len = u64::from_le_bytes(head[1..].try_into().expect("8 bytes"));
    if len > ANSWER_LIMIT {
        return Err(std::io::Error::other(format!("an answer of {len} bytes")));
    }
    // Read into memory never written first: a row group's answer is megabytes.
    let mut body = Vec::with_capacity(len as usize);
    r.take(len).read_to_end(&mut body)?;
    if body.len() as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok((head[0], body))
}

/// The first record batch of an Arrow IPC stream, its arrays in `stream` itself (a buffer
/// out of alignment for its type is copied): a reader over the bytes copied every array into
/// memory of its own, zeroed first.
fn decode(mut stream: Buffer) -> Result<RecordBatch> {
    let mut decoder = arrow::ipc::reader::StreamDecoder::new();
    let mut first = None;
    while !stream.is_empty() {
        let batch = decoder.decode(&mut stream)?;
        first = first.or(batch);
    }
    decoder.finish()?;
    match (first, decoder.schema()) {
        (Some(batch), _) => Ok(batch),
        (None, Some(schema)) => Ok(RecordBatch::new_empty(schema)),
        (None, None) => bail!("an Arrow stream without a schema"),
    }
}

/// Why a path (or its directory) is one other users may write, if it is: written by another
/// user than root, or group- or world-writable.
fn writable_by_others(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut at = Some(path);
    // The file itself and every directory above it: a writable parent can swap the file.
    while let Some(p) = at {
        if let Ok(md) = std::fs::metadata(p) {
            let sticky = md.mode() & 0o1000 != 0;
            if md.uid() != 0 {
                return Some(format!("'{}' belongs to uid {}", p.display(), md.uid()));
            }
            if md.mode() & 0o022 != 0 && !(md.is_dir() && sticky) {
                return Some(format!("'{}' is writable by other users", p.display()));
            }
        }
        at = p.parent();
    }
    None
}

/// The digest of the function: its spec, version and every source file's bytes, in order.
fn digest(spec: &TransformOptions, sources: &[PathBuf]) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"tensorfs transform\0");
    h.update(spec.target.as_bytes());
    h.update([0]);
    h.update(spec.version.as_bytes());
    h.update([0]);
    for c in &spec.columns {
        h.update(c.as_bytes());
        h.update([0]);
    }
    let mut sources: Vec<&PathBuf> = sources.iter().collect();
    sources.sort();
    for p in sources {
        let bytes = std::fs::read(p).with_context(|| {
            format!(
                "transform={}: '{}' cannot be read",
                spec.target,
                p.display()
            )
        })?;
        h.update(p.as_os_str().as_encoded_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A transform applied to a dataset: the source columns it reads, and its output as the
/// mount-time trial found it (the view is built over that schema).
pub struct Applied {
    pub udf: Udf,
    /// Row groups between their decode and the end of their call, at most two a worker: one
    /// called, one decoded and waiting for it, so that a worker never waits on the daemon's
    /// decode of its next row group.
    pub(crate) calls: Arc<tokio::sync::Semaphore>,
    /// The source's root columns given to the function, ascending.
    pub(crate) input: Vec<usize>,
    /// The output's schema on the first row group.
    pub(crate) schema: SchemaRef,
    /// For each output column, whether the first row group's output holds nulls in it.
    pub(crate) nulls: Vec<bool>,
}

impl Applied {
    /// The source columns the function reads (`transform_columns=`, else all of `schema`'s).
    pub(crate) fn input_columns(
        udf: &Udf,
        schema: &arrow::datatypes::Schema,
    ) -> Result<Vec<usize>> {
        if udf.spec.columns.is_empty() {
            return Ok((0..schema.fields().len()).collect());
        }
        let mut roots = Vec::new();
        for c in &udf.spec.columns {
            let Ok(i) = schema.index_of(c) else {
                bail!("transform_columns={c}: the dataset has no column '{c}'");
            };
            roots.push(i);
        }
        roots.sort_unstable();
        roots.dedup();
        Ok(roots)
    }

    /// Calls the function twice on `batch`, the first row group's `input` columns (found at
    /// `at`), on two workers where there are two, and refuses, in one line, a function that
    /// raises, returns another number of rows or something that is no table, or returns two
    /// different outputs (it is not deterministic).
    pub(crate) fn trial(
        udf: Udf,
        input: Vec<usize>,
        batch: RecordBatch,
        at: &str,
    ) -> Result<Applied> {
        let target = udf.spec.target.clone();
        let slots = [0, 1.min(udf.slots.len() - 1)];
        let mut outputs = Vec::new();
        for slot in slots {
            // A blocking exchange with a worker process (the caller's thread may block).
            let out = udf
                .call_on(slot, &batch)
                .map_err(|e| anyhow!("transform={target} on the first row group ({at}): {e}"))?;
            outputs.push(out);
        }
        let (a, b) = (&outputs[0], &outputs[1]);
        if a != b {
            bail!(
                "transform={target} is not deterministic: two calls on the first row group ({at}) returned different outputs; random augmentation belongs in the training loop"
            );
        }
        let schema = a.schema();
        let nulls = a.columns().iter().map(|c| c.null_count() > 0).collect();
        Ok(Applied {
            calls: Arc::new(tokio::sync::Semaphore::new(2 * udf.slots.len())),
            udf,
            input,
            schema,
            nulls,
        })
    }

    /// What dataset.json says of the transform.
    pub fn json(&self) -> serde_json::Value {
        let spec = &self.udf.spec;
        serde_json::json!({
            "function": spec.target,
            "digest": self.udf.digest,
            "version": spec.version,
            "petastorm_transform_spec": self.udf.petastorm,
            "workers": self.udf.slots.len(),
            "python": spec.python,
            "runtime": self.udf.runtime,
            "input_columns": self.input.len(),
        })
    }

    /// The function's output for one row group (`pieces`: its source rows, decoded as
    /// `input`), projected to the output columns `roots`. An output of other columns than the
    /// first row group's is an error for that row group.
    pub(crate) fn apply(&self, pieces: Vec<RecordBatch>, roots: &[usize]) -> Result<RecordBatch> {
        let schema = match pieces.first() {
            Some(p) => p.schema(),
            None => bail!("no rows were decoded"),
        };
        let batch = arrow::compute::concat_batches(&schema, &pieces)?;
        drop(pieces);
        let out = self.udf.call(&batch)?;
        let same = out.schema().fields().len() == self.schema.fields().len()
            && (out.schema().fields().iter().zip(self.schema.fields()))
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
        if !same {
            let show = |s: &arrow::datatypes::Schema| {
                (s.fields().iter())
                    .map(|f| format!("{}: {}", f.name(), f.data_type()))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            bail!(
                "the transform returned columns [{}], not the [{}] it returned for the first row group",
                show(&out.schema()),
                show(&self.schema)
            );
        }
        Ok(out.project(roots)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use std::os::unix::fs::FileExt;

    /// Rows enough that their IPC stream passes an area's first size.
    fn batch(rows: i64) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(0..rows)) as _),
            (
                "x",
                Arc::new(Float64Array::from_iter_values(
                    (0..rows).map(|i| i as f64 / 3.0),
                )) as _,
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("row {i}")),
                )) as _,
            ),
        ])
        .unwrap()
    }

    #[test]
    fn a_request_grows_its_area_and_is_read_back_whole() {
        let mut request = Request::new().unwrap();
        for rows in [10, 200_000, 50] {
            let b = batch(rows);
            let len = request.write(&b).unwrap();
            assert!(request.map.len() >= len);
            // What the worker reads: the file's bytes, not the daemon's map.
            let mut bytes = vec![0u8; len];
            request.file.read_exact_at(&mut bytes, 0).unwrap();
            assert_eq!(decode(Buffer::from_vec(bytes)).unwrap(), b);
        }
        assert!(
            request.map.len() as u64 > AREA_START,
            "grown for 200,000 rows"
        );
    }

    #[test]
    fn an_answer_area_is_held_while_its_arrays_live_and_grows_as_the_worker_grew_it() {
        let mut answer = Answer::new().unwrap();
        assert!(answer.is_free());
        for rows in [200_000, 10] {
            let b = batch(rows);
            let mut stream = Vec::new();
            let mut w =
                arrow::ipc::writer::StreamWriter::try_new(&mut stream, &b.schema()).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
            drop(w);
            // The worker's side: the file grown where it is too small, the stream at its start.
            if answer.file.metadata().unwrap().len() < stream.len() as u64 {
                answer.file.set_len(stream.len() as u64).unwrap();
            }
            answer.file.write_all_at(&stream, 0).unwrap();
            let got = decode(answer.read(stream.len() as u64).unwrap()).unwrap();
            assert!(!answer.is_free(), "the decoded arrays hold the area");
            let x = got.column(1).clone();
            drop(got);
            assert!(!answer.is_free(), "one array left holds it still");
            assert_eq!(x.as_ref(), b.column(1).as_ref());
            drop(x);
            assert!(answer.is_free());
        }
        assert!(answer.read(0).is_err(), "an empty answer");
    }

    #[test]
    fn pages_past_what_an_area_keeps_are_given_back_once_read() {
        use std::os::unix::fs::MetadataExt;
        let held = |f: &File| f.metadata().unwrap().blocks() * 512;
        let mut request = Request::new().unwrap();
        let mut answer = Answer::new().unwrap();
        for (rows, kept) in [(10_000, true), (1_000_000, false)] {
            let b = batch(rows);
            let len = request.write(&b).unwrap();
            assert!(held(&request.file) >= len as u64);
            let mut bytes = vec![0u8; len];
            request.file.read_exact_at(&mut bytes, 0).unwrap();
            release(&request.file, len);
            assert_eq!(held(&request.file) >= len as u64, kept, "{rows} rows");
            // The worker's answer: the same stream, in the answer area.
            answer.file.set_len(len as u64).unwrap();
            answer.file.write_all_at(&bytes, 0).unwrap();
            let got = decode(answer.read(len as u64).unwrap()).unwrap();
            assert!(len <= KEEP_BYTES || held(&answer.file) >= len as u64);
            drop(got);
            assert_eq!(held(&answer.file) >= len as u64, kept, "{rows} rows");
        }
        let beyond = answer.file.metadata().unwrap().len() + 1;
        assert!(
            answer.read(beyond).is_err(),
            "an answer past the file's end"
        );
    }
}
