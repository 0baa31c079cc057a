//! Mount options: `-o a=1,b=2` strings parsed and checked into [`Options`].
//!
//! Content options change the bytes of batches; runtime options change only how they are
//! produced and served; object_store keys configure the source. Options that mount(8) and
//! fstab pass to every filesystem are accepted and ignored.

use crate::read::dtype::DType;
use crate::read::plan::{OrderOptions, Shuffle};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OptionError(String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nulls {
    Error,
    Zero,
}

impl Nulls {
    pub fn name(self) -> &'static str {
        match self {
            Nulls::Error => "error",
            Nulls::Zero => "zero",
        }
    }
}

/// The content options (see [`Options::content`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Content {
    /// What decides the decoded columns of a row group.
    pub columns: serde_json::Value,
    /// What decides which rows form each batch.
    pub order: serde_json::Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passthrough {
    Auto,
    Off,
}

/// Who answers an open of a file of the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opens {
    /// The daemon: each open is a round trip, answered by passthrough where it may.
    Daemon,
    /// The kernel alone: opens and closes cost no round trip, reads come from the kernel's page
    /// cache, which the prefetcher fills ahead of the reader (see `docs/reading.md`).
    Kernel,
}

#[derive(Clone, Debug)]
pub struct Options {
    // Content options.
    pub batch_size: u64,
    pub drop_last: bool,
    pub columns: Option<Vec<String>>,
    pub seed: u64,
    pub shuffle: Shuffle,
    pub shuffle_window: u64,
    /// Rows per block of `shuffle=block`; `None`: the default for the partitions.
    pub shuffle_block: Option<u64>,
    pub casts: Vec<(String, DType)>,
    pub stacks: Vec<(String, Vec<String>)>,
    pub pads: Vec<(String, usize)>,
    pub nulls: Nulls,
    pub partitions: u64,
    /// `transform=FILE.py:NAME|MODULE:NAME`: the user's function (PRODUCT.md §10).
    pub transform: Option<String>,
    pub transform_path: Option<PathBuf>,
    pub transform_version: String,
    /// The source columns the transform reads (all where unset).
    pub transform_columns: Option<Vec<String>>,
    // Runtime options.
    /// The transform's worker processes (the cores where unset) and their interpreter.
    pub transform_workers: Option<usize>,
    pub python: String,
    pub epochs: u64,
    pub world_size: Option<u64>,
    pub cache_dir: PathBuf,
    pub cache_size: Option<u64>,
    pub prefetch: u64,
    pub memory_limit: u64,
    pub threads: usize,
    pub passthrough: Passthrough,
    pub opens: Opens,
    pub allow_other: bool,
    /// Unmount when the daemon dies (through fusermount3; on by default where it exists).
    pub auto_unmount: bool,
    /// Mount over a directory that is not empty.
    pub nonempty: bool,
    pub log: String,
    /// Where to serve the counters for Prometheus (`ADDR:PORT`).
    pub metrics: Option<String>,
    /// The snapshot (a path or URL) that pins the dataset mounted.
    pub snapshot: Option<String>,
    /// The fingerprint the dataset must have.
    pub fingerprint: Option<String>,
    /// The version of a Delta table to mount (the latest when unset).
    pub version: Option<u64>,
    /// object_store configuration keys, passed to the store as they are.
    pub store: Vec<(String, String)>,
}

/// Options that mount(8), fstab and systemd hand to every filesystem.
const GENERIC: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "nofail",
    "_netdev",
    "rw",
    "ro",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "nodiratime",
    "diratime",
    "sync",
    "async",
    "loud",
    "silent",
];

/// Prefixes of object_store configuration keys.
const STORE_PREFIXES: &[&str] = &[
    "aws_",
    "google_",
    "azure_",
    "http_",
    "client_",
    "object_store_",
];

fn is_generic(key: &str) -> bool {
    GENERIC.contains(&key) || key.starts_with("x-") || key == "comment"
}

fn default_cache_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/tensorfs");
    }
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("tensorfs"),
        _ => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
            PathBuf::from(home).join(".cache").join("tensorfs")
        }
    }
}

/// Whether an executable `name` is on the PATH (or in the usual system directories).
pub fn find_in_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/bin", "/usr/bin", "/sbin", "/usr/sbin"].map(PathBuf::from))
        .any(|d| d.join(name).is_file())
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batch_size: 1024,
            drop_last: false,
            columns: None,
            seed: 0,
            shuffle: Shuffle::Block,
            shuffle_window: 4,
            shuffle_block: None,
            casts: Vec::new(),
            stacks: Vec::new(),
            pads: Vec::new(),
            nulls: Nulls::Error,
            partitions: 1,
            transform: None,
            transform_path: None,
            transform_version: String::new(),
            transform_columns: None,
            transform_workers: None,
            python: "python3".into(),
            epochs: 1,
            world_size: None,
            cache_dir: default_cache_dir(),
            cache_size: None,
            prefetch: 8,
            memory_limit: 2 << 30,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            passthrough: Passthrough::Auto,
            opens: Opens::Daemon,
            allow_other: false,
            // A daemon that dies (SIGKILL, OOM) then takes its mount with it, so a restart needs
            // no manual unmount; fusermount3 is what does it.
            auto_unmount: find_in_path("fusermount3"),
            nonempty: false,
            log: "info".into(),
            metrics: None,
            snapshot: None,
            fingerprint: None,
            version: None,
            store: Vec::new(),
        }
    }
}

/// Every option tensorfs itself takes (object_store keys and mount(8)'s generic ones aside).
const KNOWN: &[&str] = &[
    "batch_size",
    "drop_last",
    "columns",
    "seed",
    "shuffle",
    "shuffle_window",
    "shuffle_block",
    "epochs",
    "world_size",
    "partitions",
    "cast",
    "stack",
    "pad",
    "nulls",
    "transform",
    "transform_path",
    "transform_version",
    "transform_columns",
    "transform_workers",
    "python",
    "cache_dir",
    "cache_size",
    "prefetch",
    "memory_limit",
    "threads",
    "passthrough",
    "opens",
    "allow_other",
    "auto_unmount",
    "nonempty",
    "log",
    "snapshot",
    "fingerprint",
    "metrics",
    "version",
];

/// Edits (insertions, deletions, substitutions) between two names.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn unknown(key: &str) -> OptionError {
    let near = KNOWN
        .iter()
        .map(|k| (distance(key, k), *k))
        .filter(|&(d, k)| d <= 2.max(k.len() / 4))
        .min();
    match near {
        Some((_, k)) => OptionError(format!(
            "unknown mount option '{key}' (did you mean '{k}'? docs/options.md lists them all)"
        )),
        None => OptionError(format!(
            "unknown mount option '{key}' (docs/options.md lists them all)"
        )),
    }
}

fn bad(key: &str, value: &str, why: impl std::fmt::Display) -> OptionError {
    OptionError(format!("bad mount option {key}={value}: {why}"))
}

fn positive(key: &str, value: &str) -> Result<u64, OptionError> {
    match value.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(bad(key, value, "expected a whole number greater than 0")),
    }
}

/// `200G`, `512M`, `1.5G`, `4096`: binary units.
pub fn parse_size(value: &str) -> Option<u64> {
    let v = value.trim();
    let v = v
        .strip_suffix("iB")
        .or_else(|| v.strip_suffix('B'))
        .unwrap_or(v);
    let (num, mult) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 1u64 << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        'T' | 't' => (&v[..v.len() - 1], 1 << 40),
        _ => (v, 1),
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult);
    }
    let f: f64 = num.parse().ok()?;
    (f.is_finite() && f >= 0.0).then_some((f * mult as f64) as u64)
}

/// A size for messages: `512.0K`, `1.5G`.
pub fn human_size(bytes: u64) -> String {
    let units = ["K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut unit = "";
    for u in units {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if unit.is_empty() {
        format!("{bytes}")
    } else {
        format!("{v:.1}{unit}")
    }
}

/// Characters that separate things in option strings, which a name escapes with `\`.
const SEPARATORS: &[char] = &['\\', ',', ':', '+', '='];

/// A column or tensor name as an option value writes it: every separator (and `\\` itself)
/// escaped with a backslash, so that any printed hint can be pasted back as it is. A line
/// break is written `\n` (`\r`), as the hint must stay one line.
pub fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if SEPARATORS.contains(&c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Splits `s` at every `sep` that no backslash escapes; the escapes stay in the parts (for a
/// further split), [`unescape`] removes them.
fn split_escaped(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A name with its escapes removed: `\\x` is `x`, but `\\n` and `\\r` are line breaks; a
/// trailing lone backslash stays.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        out.push(match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => '\n',
                Some('r') => '\r',
                Some(next) => next,
                None => '\\',
            },
            (c, false) => c,
        });
    }
    out
}

/// Splits `COL:REST` at the first unescaped `:`; both parts must be non-empty. The first is a
/// name, unescaped; the rest is left as written.
fn pair<'a>(key: &str, value: &'a str, what: &str) -> Result<(String, &'a str), OptionError> {
    let parts = split_escaped(value, ':');
    let a = parts[0];
    let b = value.get(a.len() + 1..).unwrap_or("");
    if parts.len() < 2 || a.is_empty() || b.is_empty() {
        return Err(bad(key, value, format!("expected {key}={what}")));
    }
    Ok((unescape(a), b))
}

/// A `:` or `+` separated list of names, each non-empty.
fn names(value: &str, sep: char) -> Option<Vec<String>> {
    let names: Vec<String> = split_escaped(value, sep)
        .into_iter()
        .map(unescape)
        .collect();
    (!names.iter().any(String::is_empty)).then_some(names)
}

impl Options {
    /// Parses `-o` arguments; each may hold several comma-separated options.
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Options, OptionError> {
        let mut o = Options::default();
        for arg in args {
            for opt in split_escaped(arg.as_ref(), ',')
                .into_iter()
                .filter(|s| !s.is_empty())
            {
                o.apply(opt)?;
            }
        }
        o.check()?;
        Ok(o)
    }

    fn apply(&mut self, opt: &str) -> Result<(), OptionError> {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        if let Some(done) = self.apply_flag(key, value) {
            return done;
        }
        if is_generic(key) {
            return Ok(());
        }
        let Some(value) = value else {
            return Err(match KNOWN.contains(&key) {
                true => OptionError(format!("mount option {key} needs a value: {key}=VALUE")),
                false => unknown(key),
            });
        };
        if self.apply_content(key, value)? || self.apply_runtime(key, value)? {
            return Ok(());
        }
        Err(unknown(key))
    }

    /// A flag option (`name`, `name=true`, `name=off`…); `None` if `key` is not one.
    fn apply_flag(&mut self, key: &str, value: Option<&str>) -> Option<Result<(), OptionError>> {
        let flag = |set: &mut bool| match value {
            None | Some("true") | Some("1") | Some("on") => {
                *set = true;
                Ok(())
            }
            Some("false") | Some("0") | Some("off") => {
                *set = false;
                Ok(())
            }
            Some(v) => Err(bad(key, v, "expected no value, true or false")),
        };
        let set = match key {
            "drop_last" => &mut self.drop_last,
            "allow_other" => &mut self.allow_other,
            "auto_unmount" => &mut self.auto_unmount,
            "nonempty" => &mut self.nonempty,
            _ => return None,
        };
        Some(flag(set))
    }

    /// An option of what the mount shows (its tensors, their order, the tree); `false` if `key`
    /// is not one.
    fn apply_content(&mut self, key: &str, value: &str) -> Result<bool, OptionError> {
        match key {
            "batch_size" => self.batch_size = positive(key, value)?,
            "columns" => {
                let cols =
                    names(value, ':').ok_or_else(|| bad(key, value, "expected columns=A:B:C"))?;
                self.columns = Some(cols);
            }
            "seed" => {
                self.seed = value
                    .parse()
                    .map_err(|_| bad(key, value, "expected a whole number"))?
            }
            "shuffle" => {
                self.shuffle = match value {
                    "none" => Shuffle::None,
                    "window" => Shuffle::Window,
                    "block" => Shuffle::Block,
                    "global" => Shuffle::Global,
                    _ => return Err(bad(key, value, "expected none, block, window or global")),
                }
            }
            "shuffle_window" => self.shuffle_window = positive(key, value)?,
            "shuffle_block" => self.shuffle_block = Some(positive(key, value)?),
            "epochs" => self.epochs = positive(key, value)?,
            "partitions" => self.partitions = positive(key, value)?,
            "world_size" => self.world_size = Some(positive(key, value)?),
            "cast" => {
                let (col, dtype) = pair(key, value, "COL:DTYPE")?;
                let dtype = dtype.parse::<DType>().map_err(|e| bad(key, value, e))?;
                self.casts.push((col, dtype));
            }
            "stack" => {
                let (name, cols) = pair(key, value, "NAME:COL1+COL2+…")?;
                let cols = names(cols, '+')
                    .ok_or_else(|| bad(key, value, "expected stack=NAME:COL1+COL2+…"))?;
                self.stacks.push((name, cols));
            }
            "pad" => {
                let (col, len) = pair(key, value, "COL:LENGTH")?;
                let len = positive(key, len).map_err(|_| {
                    bad(
                        key,
                        value,
                        "the length must be a whole number greater than 0",
                    )
                })?;
                self.pads.push((col, len as usize));
            }
            "nulls" => {
                self.nulls = match value {
                    "error" => Nulls::Error,
                    "zero" => Nulls::Zero,
                    _ => return Err(bad(key, value, "expected error or zero")),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// An option of how the mount runs (cache, memory, threads, log, the store's settings);
    /// `false` if `key` is not one.
    fn apply_runtime(&mut self, key: &str, value: &str) -> Result<bool, OptionError> {
        match key {
            "transform" => {
                let Some((target, name)) = value.rsplit_once(':') else {
                    return Err(bad(
                        key,
                        value,
                        "expected transform=FILE.py:NAME or MODULE:NAME",
                    ));
                };
                if target.is_empty() || name.is_empty() {
                    return Err(bad(
                        key,
                        value,
                        "expected transform=FILE.py:NAME or MODULE:NAME",
                    ));
                }
                // A file is found from where the mount was asked, as a shell user means it.
                self.transform = Some(match target.ends_with(".py") {
                    true => {
                        let file = std::path::absolute(target).unwrap_or_else(|_| target.into());
                        format!("{}:{name}", file.display())
                    }
                    false => value.to_string(),
                });
            }
            "transform_path" => {
                if value.is_empty() {
                    return Err(bad(key, value, "expected a directory"));
                }
                self.transform_path =
                    Some(std::path::absolute(value).unwrap_or_else(|_| value.into()));
            }
            "transform_version" => self.transform_version = value.to_string(),
            "transform_columns" => {
                let cols = names(value, ':')
                    .ok_or_else(|| bad(key, value, "expected transform_columns=A:B:C"))?;
                self.transform_columns = Some(cols);
            }
            "transform_workers" => self.transform_workers = Some(positive(key, value)? as usize),
            "python" => {
                if value.is_empty() {
                    return Err(bad(key, value, "expected an interpreter, python=PATH"));
                }
                self.python = value.to_string();
            }
            "cache_dir" => {
                if value.is_empty() {
                    return Err(bad(key, value, "expected a directory"));
                }
                // Absolute, as the paths it gives out (gds/ links, user.tensorfs.path) must be.
                self.cache_dir = std::path::absolute(value).unwrap_or_else(|_| value.into());
            }
            "cache_size" => {
                self.cache_size = Some(
                    parse_size(value)
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad(key, value, "expected a size such as 200G"))?,
                )
            }
            "prefetch" => {
                self.prefetch = value
                    .parse()
                    .map_err(|_| bad(key, value, "expected a whole number"))?
            }
            "memory_limit" => {
                self.memory_limit = parse_size(value)
                    .filter(|&n| n >= 1 << 20)
                    .ok_or_else(|| bad(key, value, "expected a size of at least 1M, such as 2G"))?
            }
            "threads" => self.threads = positive(key, value)? as usize,
            "passthrough" => {
                self.passthrough = match value {
                    "auto" => Passthrough::Auto,
                    "off" => Passthrough::Off,
                    _ => return Err(bad(key, value, "expected auto or off")),
                }
            }
            "opens" => {
                self.opens = match value {
                    "daemon" => Opens::Daemon,
                    "kernel" => Opens::Kernel,
                    _ => return Err(bad(key, value, "expected daemon or kernel")),
                }
            }
            "log" => {
                tracing_subscriber::EnvFilter::try_new(value).map_err(|e| bad(key, value, e))?;
                self.log = value.into();
            }
            "metrics" => {
                let port = value.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
                if !matches!(port, Some(Ok(_))) {
                    return Err(bad(
                        key,
                        value,
                        "expected ADDR:PORT, such as 127.0.0.1:9100",
                    ));
                }
                self.metrics = Some(value.into());
            }
            "version" => {
                let v = value.parse::<u64>();
                self.version =
                    Some(v.map_err(|_| {
                        bad(key, value, "expected a table version, a whole number")
                    })?);
            }
            "snapshot" => {
                if value.is_empty() {
                    return Err(bad(key, value, "expected a path or URL"));
                }
                self.snapshot = Some(value.into());
            }
            "fingerprint" => {
                let hex = value.to_ascii_lowercase();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad(
                        key,
                        value,
                        "expected the 64 hex digits dataset.json and tensorfs snapshot give",
                    ));
                }
                self.fingerprint = Some(hex);
            }
            _ if STORE_PREFIXES.iter().any(|p| key.starts_with(p)) => {
                self.store.push((key.into(), value.into()));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks between options.
    /// The transform asked for, if any.
    pub fn udf(&self) -> Option<crate::udf::Spec> {
        Some(crate::udf::Spec {
            target: self.transform.clone()?,
            path: self.transform_path.clone(),
            version: self.transform_version.clone(),
            workers: self.transform_workers.unwrap_or(self.threads),
            python: self.python.clone(),
            columns: self.transform_columns.clone().unwrap_or_default(),
        })
    }

    fn check(&self) -> Result<(), OptionError> {
        let needs_transform = [
            ("transform_path", self.transform_path.is_some()),
            ("transform_version", !self.transform_version.is_empty()),
            ("transform_columns", self.transform_columns.is_some()),
            ("transform_workers", self.transform_workers.is_some()),
        ];
        if self.transform.is_none()
            && let Some((key, _)) = needs_transform.iter().find(|(_, given)| *given)
        {
            return Err(OptionError(format!(
                "mount option {key}= is for a transform: give transform=FILE.py:NAME or MODULE:NAME too"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for (col, _) in &self.pads {
            if !seen.insert(col) {
                return Err(OptionError(format!(
                    "mount option pad= names column '{col}' twice"
                )));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (col, _) in &self.casts {
            if !seen.insert(col) {
                return Err(OptionError(format!(
                    "mount option cast= names column '{col}' twice"
                )));
            }
        }
        let mut members = std::collections::HashSet::new();
        for (name, cols) in &self.stacks {
            for c in cols {
                if !members.insert(c) {
                    return Err(OptionError(format!(
                        "mount option stack={name}: column '{c}' is stacked twice"
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn order(&self) -> OrderOptions {
        OrderOptions {
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            shuffle: self.shuffle,
            window: self.shuffle_window,
            block: self.block(),
            seed: self.seed,
            partitions: self.partitions,
        }
    }

    /// Rows per block of `shuffle=block`: as given, else MosaicML Streaming's default block for
    /// as many canonical nodes as partitions.
    pub fn block(&self) -> u64 {
        (self.shuffle_block).unwrap_or_else(|| crate::read::plan::default_block(self.partitions))
    }

    /// The content options, as two values the cache keys are derived from: what decides the
    /// decoded columns, and what decides the order of rows into batches. Every field of
    /// [`Options`] is named here with no `..`, so an option added to the struct does not compile
    /// until it is placed on one side or the other: a content option cannot be left out of the
    /// key, where it would serve stale bytes from a warm cache.
    pub fn content(&self) -> Content {
        use serde_json::json;
        let Options {
            batch_size,
            drop_last,
            columns,
            seed,
            shuffle,
            shuffle_window,
            shuffle_block: _,
            casts,
            stacks,
            pads,
            nulls,
            partitions,
            transform,
            transform_path: _,
            transform_version,
            transform_columns,
            // The function's own identity (its sources' digest) joins the cache keys where
            // they are made, from the transform's workers.
            transform_workers: _,
            python: _,
            // Runtime options: how batches are produced and served, never their bytes.
            epochs: _,
            world_size: _,
            cache_dir: _,
            cache_size: _,
            prefetch: _,
            memory_limit: _,
            threads: _,
            passthrough: _,
            opens: _,
            allow_other: _,
            auto_unmount: _,
            nonempty: _,
            log: _,
            metrics: _,
            // They choose the dataset (or refuse it); its fingerprint is in the key.
            snapshot: _,
            fingerprint: _,
            version: _,
            // The source is named by its fingerprint, not by how it is reached.
            store: _,
        } = self;
        let casts: Vec<(&str, String)> = casts
            .iter()
            .map(|(c, d)| (c.as_str(), d.to_string()))
            .collect();
        Content {
            columns: json!({
                "columns": columns,
                "cast": casts,
                "stack": stacks,
                "pad": pads,
                "nulls": nulls.name(),
                "transform": transform,
                "transform_version": transform_version,
                "transform_columns": transform_columns,
            }),
            order: json!({
                "batch_size": batch_size,
                "drop_last": drop_last,
                "seed": seed,
                "shuffle": shuffle.name(),
                "shuffle_window": shuffle_window,
                "shuffle_block": self.block(),
                "partitions": partitions,
            }),
        }
    }

    /// The options in force, for dataset.json; secrets of the store are left out.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let mut m: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
        m.insert("batch_size", json!(self.batch_size));
        m.insert("drop_last", json!(self.drop_last));
        m.insert("columns", json!(self.columns));
        m.insert("seed", json!(self.seed));
        m.insert("shuffle", json!(self.shuffle.name()));
        m.insert("shuffle_window", json!(self.shuffle_window));
        m.insert("shuffle_block", json!(self.block()));
        m.insert(
            "cast",
            json!(
                self.casts
                    .iter()
                    .map(|(c, d)| format!("{c}:{d}"))
                    .collect::<Vec<_>>()
            ),
        );
        m.insert(
            "stack",
            json!(
                self.stacks
                    .iter()
                    .map(|(n, c)| format!("{n}:{}", c.join("+")))
                    .collect::<Vec<_>>()
            ),
        );
        m.insert(
            "pad",
            json!(
                self.pads
                    .iter()
                    .map(|(c, l)| format!("{c}:{l}"))
                    .collect::<Vec<_>>()
            ),
        );
        m.insert("nulls", json!(self.nulls.name()));
        m.insert("partitions", json!(self.partitions));
        if self.transform.is_some() {
            m.insert("transform", json!(self.transform));
            m.insert("transform_path", json!(self.transform_path));
            m.insert("transform_version", json!(self.transform_version));
            m.insert("transform_columns", json!(self.transform_columns));
            m.insert("transform_workers", json!(self.udf().map(|u| u.workers)));
            m.insert("python", json!(self.python));
        }
        m.insert("epochs", json!(self.epochs));
        m.insert("world_size", json!(self.world_size));
        m.insert("cache_dir", json!(self.cache_dir));
        m.insert("cache_size", json!(self.cache_size));
        m.insert("prefetch", json!(self.prefetch));
        m.insert("memory_limit", json!(self.memory_limit));
        m.insert("threads", json!(self.threads));
        m.insert(
            "passthrough",
            json!(if self.passthrough == Passthrough::Auto {
                "auto"
            } else {
                "off"
            }),
        );
        m.insert(
            "opens",
            json!(match self.opens {
                Opens::Daemon => "daemon",
                Opens::Kernel => "kernel",
            }),
        );
        m.insert("allow_other", json!(self.allow_other));
        m.insert("auto_unmount", json!(self.auto_unmount));
        m.insert("nonempty", json!(self.nonempty));
        m.insert("log", json!(self.log));
        m.insert("metrics", json!(self.metrics));
        m.insert("snapshot", json!(self.snapshot));
        m.insert("fingerprint", json!(self.fingerprint));
        m.insert("version", json!(self.version));
        let store: BTreeMap<&str, &str> = self
            .store
            .iter()
            .filter(|(k, _)| !is_secret(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        m.insert("store", json!(store));
        json!(m)
    }
}

/// Store keys whose values are credentials.
pub fn is_secret(key: &str) -> bool {
    [
        "secret",
        "key",
        "token",
        "password",
        "sas",
        "credential",
        "signature",
    ]
    .iter()
    .any(|s| key.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(args: &[&str]) -> String {
        Options::parse(args).unwrap_err().to_string()
    }

    #[test]
    fn defaults_and_values() {
        let o = Options::parse(&[
            "batch_size=64,drop_last",
            "columns=a:b,seed=7",
            "shuffle=none",
        ])
        .unwrap();
        assert_eq!(o.batch_size, 64);
        assert!(o.drop_last);
        assert_eq!(o.columns, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(o.seed, 7);
        assert_eq!(o.shuffle, Shuffle::None);
        let o = Options::parse(&["cast=a:float16,cast=b:int32,stack=xy:x+y,pad=t:16,nulls=zero"])
            .unwrap();
        assert_eq!(
            o.casts,
            vec![("a".into(), DType::F16), ("b".into(), DType::I32)]
        );
        assert_eq!(o.stacks, vec![("xy".into(), vec!["x".into(), "y".into()])]);
        assert_eq!(o.pads, vec![("t".into(), 16)]);
        assert_eq!(o.nulls, Nulls::Zero);
        let d = Options::parse::<&str>(&[]).unwrap();
        assert_eq!(
            (d.batch_size, d.shuffle, d.shuffle_window, d.epochs),
            (1024, Shuffle::Block, 4, 1)
        );
    }

    #[test]
    fn names_with_separators_are_escaped_with_a_backslash() {
        let o = Options::parse(&[r"columns=a\:b:c,cast=x\,y:float16,stack=s\+t:p\+q+r,pad=l\\:4"])
            .unwrap();
        assert_eq!(o.columns, Some(vec!["a:b".to_string(), "c".to_string()]));
        assert_eq!(o.casts, vec![("x,y".into(), DType::F16)]);
        assert_eq!(
            o.stacks,
            vec![("s+t".into(), vec!["p+q".into(), "r".into()])]
        );
        assert_eq!(o.pads, vec![(r"l\".into(), 4)]);
        for name in [
            "a:b",
            "x,y",
            r"back\slash",
            "p+q=r",
            "plain",
            "é:ü",
            "a\nb\r",
            r"n\n",
        ] {
            assert!(
                !escape(name).contains(['\n', '\r']),
                "{name:?} escaped is one line"
            );
            let o = Options::parse(&[format!("columns={}:z", escape(name))]).unwrap();
            assert_eq!(o.columns, Some(vec![name.to_string(), "z".to_string()]));
        }
    }

    #[test]
    fn an_option_given_twice_takes_its_last_value() {
        let o = Options::parse(&["columns=a:b,batch_size=8", "columns=c,batch_size=16"]).unwrap();
        assert_eq!(o.columns, Some(vec!["c".to_string()]));
        assert_eq!(o.batch_size, 16);
    }

    #[test]
    fn generic_and_store_options() {
        let o = Options::parse(&[
            "defaults,nofail,_netdev,x-systemd.automount,ro,aws_endpoint=http://127.0.0.1:9000,aws_secret_access_key=s3cr3t",
        ])
        .unwrap();
        assert_eq!(o.store.len(), 2);
        let json = o.to_json().to_string();
        assert!(json.contains("127.0.0.1:9000"));
        assert!(!json.contains("s3cr3t"));
    }

    #[test]
    fn bad_values_name_the_option() {
        assert!(err(&["batch_size=0"]).contains("batch_size=0"));
        assert!(err(&["batch_size=abc"]).contains("batch_size"));
        assert!(err(&["shuffle=foo"]).contains("shuffle=foo"));
        assert!(err(&["frobnicate=1"]).contains("'frobnicate'"));
        assert!(err(&["batchsize=8"]).contains("did you mean 'batch_size'"));
        assert!(err(&["partition=8"]).contains("did you mean 'partitions'"));
        assert!(!err(&["frobnicate=1"]).contains("did you mean"));
        assert!(err(&["batch_size"]).contains("batch_size needs a value"));
        assert!(err(&["verbose"]).contains("'verbose'"));
        assert!(err(&["cast=a:float128"]).contains("float128"));
        assert!(err(&["cast=a"]).contains("cast=a"));
        assert!(err(&["pad=t:0"]).contains("pad=t:0"));
        assert!(err(&["stack=s:a+"]).contains("stack"));
        assert!(err(&["memory_limit=lots"]).contains("memory_limit"));
        assert!(err(&["pad=t:4,pad=t:5"]).contains("'t'"));
        assert!(err(&["drop_last=maybe"]).contains("drop_last"));
    }

    proptest::proptest! {
        #[test]
        fn any_option_string_is_parsed_or_refused_in_one_line(s in "\\PC{0,200}") {
            if let Err(e) = Options::parse(&[s.as_str()]) {
                proptest::prop_assert!(!e.to_string().contains('\n'));
            }
        }

        #[test]
        fn known_keys_with_any_value_never_panic(
            key in proptest::sample::select(vec!["batch_size", "columns", "seed", "shuffle", "shuffle_window", "shuffle_block", "epochs", "partitions", "world_size", "cast", "stack", "pad", "nulls", "cache_dir", "cache_size", "prefetch", "memory_limit", "threads", "passthrough", "opens", "log", "drop_last", "allow_other", "nonempty", "aws_region"]),
            value in "[ -+--~]{0,40}",
        ) {
            match Options::parse(&[format!("{key}={value}")]) {
                Ok(o) => proptest::prop_assert!(o.batch_size > 0 && o.shuffle_window > 0 && o.block() > 0),
                Err(e) => proptest::prop_assert!(e.to_string().contains(key)),
            }
        }
    }

    #[test]
    fn every_content_option_enters_the_cache_key_and_no_runtime_option_does() {
        let base = Options::parse::<&str>(&[]).unwrap().content();
        for content in [
            "batch_size=7",
            "drop_last",
            "columns=a:b",
            "seed=3",
            "shuffle=global",
            "shuffle_window=9",
            "cast=a:float16",
            "stack=s:a+b",
            "pad=t:4",
            "nulls=zero",
            "partitions=8",
        ] {
            let c = Options::parse(&[content]).unwrap().content();
            assert_ne!(c, base, "{content} is missing from the cache key");
        }
        for runtime in [
            "epochs=5",
            "world_size=4",
            "cache_dir=/elsewhere",
            "cache_size=1G",
            "prefetch=2",
            "memory_limit=64M",
            "threads=1",
            "passthrough=off",
            "opens=kernel",
            "allow_other",
            "auto_unmount",
            "nonempty",
            "log=debug",
            "snapshot=/pinned/train.snapshot",
            "metrics=127.0.0.1:9100",
            "version=3",
            "fingerprint=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "aws_region=eu-west-1",
        ] {
            let c = Options::parse(&[runtime]).unwrap().content();
            assert_eq!(c, base, "{runtime} would make a new cache");
        }
        // The order alone changes with the partitions: the decoded columns are shared.
        let parted = Options::parse(&["partitions=8"]).unwrap().content();
        assert_eq!(parted.columns, base.columns);
    }

    #[test]
    fn sizes() {
        assert_eq!(human_size(100), "100");
        assert_eq!(human_size(100 << 10), "100.0K");
        assert_eq!(human_size(3 << 29), "1.5G");
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }
}
