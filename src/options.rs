//! Mount options: `-o a=1,b=2` strings parsed and checked into [`Options`].
//!
//! Content options change the bytes of batches; runtime options change only how they are
//! produced and served; object_store keys configure the source. Options that mount(8) and
//! fstab pass to every filesystem are accepted and ignored.

use crate::model::dtype::DType;
use crate::model::plan::{OrderOptions, Shuffle};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OptionError(String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nulls {
    Error,
    Zero,
}

impl Nulls {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Nulls::Error => "error",
            Nulls::Zero => "zero",
        }
    }
}

/// The content options (see [`Options::content`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Content {
    /// What decides the decoded columns of a row group.
    pub(crate) columns: serde_json::Value,
    /// What decides which rows form each batch.
    pub(crate) order: serde_json::Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Passthrough {
    Auto,
    Off,
}

/// Who answers an open of a file of the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opens {
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
    pub(crate) drop_last: bool,
    pub(crate) columns: Option<Vec<String>>,
    pub(crate) seed: u64,
    pub shuffle: Shuffle,
    pub(crate) shuffle_window: u64,
    /// Rows per block of `shuffle=block`; `None`: the default for the partitions.
    pub(crate) shuffle_block: Option<u64>,
    pub(crate) casts: Vec<(String, DType)>,
    pub(crate) stacks: Vec<(String, Vec<String>)>,
    pub(crate) pads: Vec<(String, usize)>,
    pub(crate) nulls: Nulls,
    pub(crate) partitions: u64,
    /// `transform=FILE.py:NAME|MODULE:NAME`: the user's function (PRODUCT.md §10).
    pub(crate) transform: Option<String>,
    pub(crate) transform_path: Option<PathBuf>,
    pub(crate) transform_version: String,
    /// The source columns the transform reads (all where unset).
    pub(crate) transform_columns: Option<Vec<String>>,
    // Runtime options.
    /// The transform's worker processes (the cores where unset) and their interpreter.
    pub(crate) transform_workers: Option<usize>,
    pub(crate) python: String,
    pub(crate) epochs: u64,
    pub world_size: Option<u64>,
    pub(crate) cache_dir: PathBuf,
    pub(crate) cache_size: Option<u64>,
    pub(crate) prefetch: u64,
    pub(crate) memory_limit: u64,
    pub threads: usize,
    pub(crate) passthrough: Passthrough,
    pub(crate) opens: Opens,
    pub(crate) allow_other: bool,
    /// Unmount when the daemon dies (through fusermount3; on by default where it exists).
    pub(crate) auto_unmount: bool,
    /// Mount over a directory that is not empty.
    pub nonempty: bool,
    pub log: String,
    /// Where to serve the counters for Prometheus (`ADDR:PORT`).
    pub(crate) metrics: Option<String>,
    /// The snapshot (a path or URL) that pins the dataset mounted.
    pub(crate) snapshot: Option<String>,
    /// The fingerprint the dataset must have.
    pub(crate) fingerprint: Option<String>,
    /// The version of a table to mount (the latest when unset): its own number, or the one
    /// current at a time.
    pub(crate) version: Option<AsOf>,
    /// `where=EXPR`: only the rows EXPR keeps (PRODUCT.md §11), as written (`\,` a comma).
    pub(crate) selection: Option<String>,
    /// `epoch_rows=N`: the rows of an epoch of a mixture (PRODUCT.md §11).
    pub(crate) epoch_rows: Option<u64>,
    /// object_store configuration keys, passed to the store as they are.
    pub(crate) store: Vec<(String, String)>,
}

/// Which version of a table `version=` names: the table's own number (a Delta version, an
/// Iceberg snapshot id, a Hudi instant), or the version current at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsOf {
    Number(u64),
    /// Milliseconds since the Unix epoch, UTC.
    Time(i64),
}

impl AsOf {
    /// A whole number, or an ISO 8601 time: with an offset (`2026-11-01T12:00:00+02:00`, `Z`),
    /// or without one (UTC), or a date alone (its midnight, UTC).
    pub fn parse(v: &str) -> Option<AsOf> {
        if let Ok(n) = v.parse::<u64>() {
            return Some(AsOf::Number(n));
        }
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(v) {
            return Some(AsOf::Time(t.timestamp_millis()));
        }
        let naive = [
            "%Y-%m-%dT%H:%M:%S%.f",
            "%Y-%m-%d %H:%M:%S%.f",
            "%Y-%m-%dT%H:%M",
        ]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(v, f).ok())
        .or_else(|| {
            let d = chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").ok()?;
            d.and_hms_opt(0, 0, 0)
        })?;
        Some(AsOf::Time(naive.and_utc().timestamp_millis()))
    }
}

impl std::fmt::Display for AsOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AsOf::Number(n) => write!(f, "{n}"),
            AsOf::Time(ms) => match chrono::DateTime::from_timestamp_millis(*ms) {
                Some(t) => write!(f, "{}", t.format("%Y-%m-%dT%H:%M:%S%.3fZ")),
                None => write!(f, "{ms} ms"),
            },
        }
    }
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
/// Keys passed to the store (and `iceberg_`, a REST catalog's: source/iceberg_rest.rs).
const STORE_PREFIXES: &[&str] = &["aws_", "google_", "azure_", "http_", "client_", "iceberg_"];

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
pub(crate) fn find_in_path(name: &str) -> bool {
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
            selection: None,
            epoch_rows: None,
            store: Vec::new(),
        }
    }
}

/// Edits (insertions, deletions, substitutions) between two names.
pub(crate) fn distance(a: &str, b: &str) -> usize {
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
    let near = (SPECS.iter())
        .map(|s| (distance(key, s.name), s.name))
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
pub(crate) fn parse_size(value: &str) -> Option<u64> {
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
pub(crate) fn human_size(bytes: u64) -> String {
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
pub(crate) fn escape(name: &str) -> String {
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

/// What an option decides, and so which cache key it enters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The decoded columns of every row group: the column cache's key.
    Columns,
    /// Which rows form each batch: the batch cache's key (with the columns').
    Order,
    /// How batches are produced and served, never their bytes.
    Runtime,
    /// Which dataset is mounted, or refused; its fingerprint is in the keys.
    Dataset,
}

impl Role {
    /// The heading of `--help` and of docs/options.md that lists options of this role.
    pub(crate) fn section(self) -> (&'static str, &'static str) {
        match self {
            Role::Columns | Role::Order => ("content", "## Content options"),
            Role::Runtime => ("runtime", "## Runtime options"),
            Role::Dataset => ("dataset", "## Which dataset"),
        }
    }
}

/// How an option takes its value.
#[derive(Clone, Copy)]
enum Setter {
    /// On when named; `=true|false`, `=1|0`, `=on|off` too.
    Flag(fn(&mut Options) -> &mut bool),
    /// `NAME=VALUE`: checks VALUE (`key` names the option in the error) and sets it.
    Value(fn(&mut Options, &str, &str) -> Result<(), OptionError>),
}

/// One mount option, declared once: parsing, the cache keys, `dataset.json`, `--help` and the
/// test against docs/options.md's tables all come from [`SPECS`].
pub(crate) struct OptionSpec {
    pub(crate) name: &'static str,
    /// How `--help` and docs/options.md write it: `batch_size=N`, `drop_last`.
    pub(crate) form: &'static str,
    pub(crate) role: Role,
    /// The default as docs/options.md's table writes it: a value in backticks, or words.
    pub(crate) default: &'static str,
    /// One line for `--help`; docs/options.md says the rest.
    pub(crate) help: &'static str,
    /// A value that is not the default, for the tests that each option reaches its key (kept
    /// beside its option so that a new option cannot be added without one).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) example: &'static str,
    set: Setter,
    /// Its value in `dataset.json`, and in the cache key where its role is one.
    get: fn(&Options) -> serde_json::Value,
}

impl std::fmt::Debug for OptionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn whole(key: &str, value: &str) -> Result<u64, OptionError> {
    value
        .parse()
        .map_err(|_| bad(key, value, "expected a whole number"))
}

fn not_empty<'a>(key: &str, value: &'a str, what: &str) -> Result<&'a str, OptionError> {
    match value.is_empty() {
        true => Err(bad(key, value, what)),
        false => Ok(value),
    }
}

/// One of `choices` (value, name): the value named, or an error listing the names.
fn choice<T: Copy>(key: &str, value: &str, choices: &[(T, &str)]) -> Result<T, OptionError> {
    match choices.iter().find(|(_, name)| *name == value) {
        Some(&(v, _)) => Ok(v),
        None => {
            let names: Vec<&str> = choices.iter().map(|(_, n)| *n).collect();
            let (last, first) = names.split_last().unwrap_or((&"", &[]));
            let list = match first.is_empty() {
                true => last.to_string(),
                false => format!("{} or {last}", first.join(", ")),
            };
            Err(bad(key, value, format!("expected {list}")))
        }
    }
}

const SHUFFLES: &[(Shuffle, &str)] = &[
    (Shuffle::None, "none"),
    (Shuffle::Block, "block"),
    (Shuffle::Window, "window"),
    (Shuffle::Global, "global"),
];
const NULLS: &[(Nulls, &str)] = &[(Nulls::Error, "error"), (Nulls::Zero, "zero")];
const PASSTHROUGHS: &[(Passthrough, &str)] =
    &[(Passthrough::Auto, "auto"), (Passthrough::Off, "off")];
const OPENS: &[(Opens, &str)] = &[(Opens::Daemon, "daemon"), (Opens::Kernel, "kernel")];

fn name_of<T: Copy + PartialEq>(v: T, choices: &[(T, &'static str)]) -> &'static str {
    choices.iter().find(|(c, _)| *c == v).map_or("", |(_, n)| n)
}

/// A list of `COL:REST` pairs as options write them, names escaped: `cast=` pasted back gives
/// the same pairs, and two different lists never write the same value (the cache keys).
fn pairs<T: std::fmt::Display>(list: &[(String, T)]) -> serde_json::Value {
    let v: Vec<String> = list
        .iter()
        .map(|(c, x)| format!("{}:{x}", escape(c)))
        .collect();
    serde_json::json!(v)
}

fn absolute(value: &str) -> PathBuf {
    std::path::absolute(value).unwrap_or_else(|_| value.into())
}

/// Every option tensorfs itself takes (object_store keys and mount(8)'s generic ones aside), in
/// the order `--help` and docs/options.md list them.
pub(crate) static SPECS: &[OptionSpec] = &[
    OptionSpec {
        name: "batch_size",
        form: "batch_size=N",
        role: Role::Order,
        default: "`1024`",
        help: "rows per batch file",
        example: "7",
        set: Setter::Value(|o, k, v| {
            o.batch_size = positive(k, v)?;
            Ok(())
        }),
        get: |o| json!(o.batch_size),
    },
    OptionSpec {
        name: "drop_last",
        form: "drop_last",
        role: Role::Order,
        default: "off",
        help: "drop the epoch's final partial batch",
        example: "",
        set: Setter::Flag(|o| &mut o.drop_last),
        get: |o| json!(o.drop_last),
    },
    OptionSpec {
        name: "columns",
        form: "columns=A:B:C",
        role: Role::Columns,
        default: "all columns",
        help: "the columns served, in this order",
        example: "a:b",
        set: Setter::Value(|o, k, v| {
            let cols = names(v, ':').ok_or_else(|| bad(k, v, "expected columns=A:B:C"))?;
            {
                o.columns = Some(cols);
                Ok(())
            }
        }),
        get: |o| json!(o.columns),
    },
    OptionSpec {
        name: "seed",
        form: "seed=N",
        role: Role::Order,
        default: "`0`",
        help: "seed of the order, combined with the epoch",
        example: "3",
        set: Setter::Value(|o, k, v| {
            o.seed = whole(k, v)?;
            Ok(())
        }),
        get: |o| json!(o.seed),
    },
    OptionSpec {
        name: "epoch_rows",
        form: "epoch_rows=N",
        role: Role::Order,
        default: "the sources' rows",
        help: "the rows of an epoch of a mixture of sources (a .toml SOURCE)",
        example: "1000000",
        set: Setter::Value(|o, k, v| {
            o.epoch_rows = Some(whole(k, v)?);
            Ok(())
        }),
        get: |o| json!(o.epoch_rows),
    },
    OptionSpec {
        name: "shuffle",
        form: "shuffle=block|window|global|none",
        role: Role::Order,
        default: "`block`",
        help: "how each epoch's rows are mixed",
        example: "global",
        set: Setter::Value(|o, k, v| {
            o.shuffle = choice(k, v, SHUFFLES)?;
            Ok(())
        }),
        get: |o| json!(name_of(o.shuffle, SHUFFLES)),
    },
    OptionSpec {
        name: "shuffle_block",
        form: "shuffle_block=ROWS",
        role: Role::Order,
        default: "`max(4000000 / P, 262144)`",
        help: "rows per block of shuffle=block",
        example: "1000",
        set: Setter::Value(|o, k, v| {
            o.shuffle_block = Some(positive(k, v)?);
            Ok(())
        }),
        get: |o| json!(o.block()),
    },
    OptionSpec {
        name: "shuffle_window",
        form: "shuffle_window=K",
        role: Role::Order,
        default: "`4`",
        help: "row groups per window of shuffle=window",
        example: "9",
        set: Setter::Value(|o, k, v| {
            o.shuffle_window = positive(k, v)?;
            Ok(())
        }),
        get: |o| json!(o.shuffle_window),
    },
    OptionSpec {
        name: "cast",
        form: "cast=COL:DTYPE",
        role: Role::Columns,
        default: "none",
        help: "serve COL (or a stack= NAME) as DTYPE; repeat for more",
        example: "a:float16",
        set: Setter::Value(|o, k, v| {
            let (col, dtype) = pair(k, v, "COL:DTYPE")?;
            let dtype = dtype.parse::<DType>().map_err(|e| bad(k, v, e))?;
            {
                o.casts.push((col, dtype));
                Ok(())
            }
        }),
        get: |o| pairs(&o.casts),
    },
    OptionSpec {
        name: "stack",
        form: "stack=NAME:C1+C2+…",
        role: Role::Columns,
        default: "none",
        help: "scalar columns of one dtype as one tensor NAME [B, k]",
        example: "s:a+b",
        set: Setter::Value(|o, k, v| {
            let (name, cols) = pair(k, v, "NAME:COL1+COL2+…")?;
            let cols =
                names(cols, '+').ok_or_else(|| bad(k, v, "expected stack=NAME:COL1+COL2+…"))?;
            {
                o.stacks.push((name, cols));
                Ok(())
            }
        }),
        get: |o| {
            let v: Vec<String> = (o.stacks.iter())
                .map(|(n, cols)| {
                    let cols: Vec<String> = cols.iter().map(|c| escape(c)).collect();
                    format!("{}:{}", escape(n), cols.join("+"))
                })
                .collect();
            json!(v)
        },
    },
    OptionSpec {
        name: "pad",
        form: "pad=COL:L",
        role: Role::Columns,
        default: "none",
        help: "a list column as [B, L], zero-padded, plus COL.len",
        example: "t:4",
        set: Setter::Value(|o, k, v| {
            let (col, len) = pair(k, v, "COL:LENGTH")?;
            let len = positive(k, len)
                .map_err(|_| bad(k, v, "the length must be a whole number greater than 0"))?;
            {
                o.pads.push((col, len as usize));
                Ok(())
            }
        }),
        get: |o| pairs(&o.pads),
    },
    OptionSpec {
        name: "partitions",
        form: "partitions=P",
        role: Role::Order,
        default: "`1`",
        help: "fixed partitions of the rows, one share per host",
        example: "8",
        set: Setter::Value(|o, k, v| {
            o.partitions = positive(k, v)?;
            Ok(())
        }),
        get: |o| json!(o.partitions),
    },
    OptionSpec {
        name: "nulls",
        form: "nulls=error|zero",
        role: Role::Columns,
        default: "`error`",
        help: "refuse columns with nulls, or serve them as 0 with COL.mask",
        example: "zero",
        set: Setter::Value(|o, k, v| {
            o.nulls = choice(k, v, NULLS)?;
            Ok(())
        }),
        get: |o| json!(o.nulls.name()),
    },
    OptionSpec {
        name: "transform",
        form: "transform=FILE.py:NAME|MODULE:NAME",
        role: Role::Columns,
        default: "unset",
        help: "your function (or a Petastorm TransformSpec), run once per row group",
        example: "other.py:g",
        set: Setter::Value(|o, k, v| {
            let expected = "expected transform=FILE.py:NAME or MODULE:NAME";
            let (target, name) = v.rsplit_once(':').ok_or_else(|| bad(k, v, expected))?;
            if target.is_empty() || name.is_empty() {
                return Err(bad(k, v, expected));
            }
            // A file is found from where the mount was asked, as a shell user means it.
            o.transform = Some(match target.ends_with(".py") {
                true => format!("{}:{name}", absolute(target).display()),
                false => v.to_string(),
            });
            Ok(())
        }),
        get: |o| json!(o.transform),
    },
    OptionSpec {
        name: "transform_path",
        form: "transform_path=DIR",
        role: Role::Columns,
        default: "unset",
        help: "where transform=MODULE:NAME is imported from",
        example: "/elsewhere",
        set: Setter::Value(|o, k, v| {
            o.transform_path = Some(absolute(not_empty(k, v, "expected a directory")?));
            Ok(())
        }),
        get: |o| json!(o.transform_path),
    },
    OptionSpec {
        name: "transform_version",
        form: "transform_version=STR",
        role: Role::Columns,
        default: "empty",
        help: "a version that joins the function's digest",
        example: "2",
        set: Setter::Value(|o, _, v| {
            o.transform_version = v.to_string();
            Ok(())
        }),
        get: |o| json!(o.transform_version),
    },
    OptionSpec {
        name: "transform_columns",
        form: "transform_columns=A:B:C",
        role: Role::Columns,
        default: "every column",
        help: "the source columns the transform is given",
        example: "a:b",
        set: Setter::Value(|o, k, v| {
            let cols =
                names(v, ':').ok_or_else(|| bad(k, v, "expected transform_columns=A:B:C"))?;
            {
                o.transform_columns = Some(cols);
                Ok(())
            }
        }),
        get: |o| json!(o.transform_columns),
    },
    OptionSpec {
        name: "epochs",
        form: "epochs=E",
        role: Role::Runtime,
        default: "`1`",
        help: "epochs readdir lists",
        example: "5",
        set: Setter::Value(|o, k, v| {
            o.epochs = positive(k, v)?;
            Ok(())
        }),
        get: |o| json!(o.epochs),
    },
    OptionSpec {
        name: "world_size",
        form: "world_size=W",
        role: Role::Runtime,
        default: "unset",
        help: "list rank-R-of-W/ in each epoch",
        example: "4",
        set: Setter::Value(|o, k, v| {
            o.world_size = Some(positive(k, v)?);
            Ok(())
        }),
        get: |o| json!(o.world_size),
    },
    OptionSpec {
        name: "nonempty",
        form: "nonempty",
        role: Role::Runtime,
        default: "off",
        help: "mount over a directory that is not empty",
        example: "",
        set: Setter::Flag(|o| &mut o.nonempty),
        get: |o| json!(o.nonempty),
    },
    OptionSpec {
        name: "threads",
        form: "threads=N",
        role: Role::Runtime,
        default: "cores",
        help: "the daemon's threads that decode, cast and gather",
        example: "97",
        set: Setter::Value(|o, k, v| {
            o.threads = positive(k, v)? as usize;
            Ok(())
        }),
        get: |o| json!(o.threads),
    },
    OptionSpec {
        name: "transform_workers",
        form: "transform_workers=N",
        role: Role::Runtime,
        default: "`threads=`",
        help: "the transform's worker processes",
        example: "97",
        set: Setter::Value(|o, k, v| {
            o.transform_workers = Some(positive(k, v)? as usize);
            Ok(())
        }),
        get: |o| json!(o.udf().map(|u| u.workers)),
    },
    OptionSpec {
        name: "python",
        form: "python=PATH",
        role: Role::Runtime,
        default: "`python3`",
        help: "the interpreter of the transform's workers",
        example: "python3.99",
        set: Setter::Value(|o, k, v| {
            o.python = not_empty(k, v, "expected an interpreter, python=PATH")?.to_string();
            Ok(())
        }),
        get: |o| json!(o.python),
    },
    OptionSpec {
        name: "memory_limit",
        form: "memory_limit=SIZE",
        role: Role::Runtime,
        default: "`2G`",
        help: "the daemon's memory: footers, decoded row groups, built batches",
        example: "64M",
        set: Setter::Value(|o, k, v| {
            o.memory_limit = parse_size(v)
                .filter(|&n| n >= 1 << 20)
                .ok_or_else(|| bad(k, v, "expected a size of at least 1M, such as 2G"))?;
            Ok(())
        }),
        get: |o| json!(o.memory_limit),
    },
    OptionSpec {
        name: "allow_other",
        form: "allow_other",
        role: Role::Runtime,
        default: "off",
        help: "let other users read the mount",
        example: "",
        set: Setter::Flag(|o| &mut o.allow_other),
        get: |o| json!(o.allow_other),
    },
    OptionSpec {
        name: "auto_unmount",
        form: "auto_unmount",
        role: Role::Runtime,
        default: "on where `fusermount3` exists",
        help: "unmount when the daemon dies (auto_unmount=off: not)",
        example: "",
        set: Setter::Flag(|o| &mut o.auto_unmount),
        get: |o| json!(o.auto_unmount),
    },
    OptionSpec {
        name: "metrics",
        form: "metrics=ADDR:PORT",
        role: Role::Runtime,
        default: "off",
        help: "serve the counters for Prometheus at http://ADDR:PORT/metrics",
        example: "127.0.0.1:9100",
        set: Setter::Value(|o, k, v| {
            let port = v.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
            if !matches!(port, Some(Ok(_))) {
                return Err(bad(k, v, "expected ADDR:PORT, such as 127.0.0.1:9100"));
            }
            {
                o.metrics = Some(v.into());
                Ok(())
            }
        }),
        get: |o| json!(o.metrics),
    },
    OptionSpec {
        name: "log",
        form: "log=LEVEL",
        role: Role::Runtime,
        default: "`info`",
        help: "tracing filter: error, warn, info, debug, trace",
        example: "debug",
        set: Setter::Value(|o, k, v| {
            tracing_subscriber::EnvFilter::try_new(v).map_err(|e| bad(k, v, e))?;
            {
                o.log = v.into();
                Ok(())
            }
        }),
        get: |o| json!(o.log),
    },
    OptionSpec {
        name: "cache_dir",
        form: "cache_dir=PATH",
        role: Role::Runtime,
        default: "`/var/cache/tensorfs` as root, else `$XDG_CACHE_HOME/tensorfs` (`~/.cache/tensorfs`)",
        help: "the local SSD cache",
        example: "/elsewhere",
        set: Setter::Value(|o, k, v| {
            // Absolute, as the paths it gives out (gds/ links, user.tensorfs.path) must be.
            {
                o.cache_dir = absolute(not_empty(k, v, "expected a directory")?);
                Ok(())
            }
        }),
        get: |o| json!(o.cache_dir),
    },
    OptionSpec {
        name: "cache_size",
        form: "cache_size=SIZE",
        role: Role::Runtime,
        default: "80% of the free space of `cache_dir`'s filesystem at mount",
        help: "bound on what the cache holds",
        example: "1G",
        set: Setter::Value(|o, k, v| {
            let size = parse_size(v).filter(|&n| n > 0);
            {
                o.cache_size = Some(size.ok_or_else(|| bad(k, v, "expected a size such as 200G"))?);
                Ok(())
            }
        }),
        get: |o| json!(o.cache_size),
    },
    OptionSpec {
        name: "passthrough",
        form: "passthrough=auto|off",
        role: Role::Runtime,
        default: "`auto`",
        help: "hand files the cache keeps to the kernel at open",
        example: "off",
        set: Setter::Value(|o, k, v| {
            o.passthrough = choice(k, v, PASSTHROUGHS)?;
            Ok(())
        }),
        get: |o| json!(name_of(o.passthrough, PASSTHROUGHS)),
    },
    OptionSpec {
        name: "opens",
        form: "opens=daemon|kernel",
        role: Role::Runtime,
        default: "`daemon`",
        help: "who answers an open: the daemon, or the kernel alone",
        example: "kernel",
        set: Setter::Value(|o, k, v| {
            o.opens = choice(k, v, OPENS)?;
            Ok(())
        }),
        get: |o| json!(name_of(o.opens, OPENS)),
    },
    OptionSpec {
        name: "prefetch",
        form: "prefetch=N",
        role: Role::Runtime,
        default: "`8`",
        help: "batches built ahead of each reader (0: none)",
        example: "2",
        set: Setter::Value(|o, k, v| {
            o.prefetch = whole(k, v)?;
            Ok(())
        }),
        get: |o| json!(o.prefetch),
    },
    OptionSpec {
        name: "snapshot",
        form: "snapshot=PATH|URL",
        role: Role::Dataset,
        default: "unset",
        help: "mount what `tensorfs snapshot` pinned",
        example: "/pinned/train.snapshot",
        set: Setter::Value(|o, k, v| {
            o.snapshot = Some(not_empty(k, v, "expected a path or URL")?.into());
            Ok(())
        }),
        get: |o| json!(o.snapshot),
    },
    OptionSpec {
        name: "version",
        form: "version=N|TIME",
        role: Role::Dataset,
        default: "the latest",
        help: "a table's version: Delta version, Iceberg snapshot id, Hudi instant, or an ISO 8601 time",
        example: "3",
        set: Setter::Value(|o, k, v| {
            let at = AsOf::parse(v).ok_or_else(|| {
                bad(
                    k,
                    v,
                    "expected a table version (a whole number) or an ISO 8601 time, as 2026-11-01T00:00:00Z",
                )
            })?;
            o.version = Some(at);
            Ok(())
        }),
        get: |o| match o.version {
            Some(AsOf::Number(n)) => json!(n),
            Some(AsOf::Time(ms)) => json!(AsOf::Time(ms).to_string()),
            None => json!(null),
        },
    },
    OptionSpec {
        name: "where",
        form: "where=EXPR",
        role: Role::Dataset,
        default: "unset",
        help: "only the rows for which EXPR holds (SQL: = != < <= > >= in between is null and or not, bucket(COL\\, N)); a comma is \\,",
        example: "day >= '2026-01-01'",
        set: Setter::Value(|o, k, v| {
            // Parsed when the dataset's columns are known; a comma came escaped.
            let expr = v.replace("\\,", ",");
            o.selection = Some(not_empty(k, &expr, "expected an expression, as x > 3")?.into());
            Ok(())
        }),
        get: |o| json!(o.selection),
    },
    OptionSpec {
        name: "fingerprint",
        form: "fingerprint=HEX",
        role: Role::Dataset,
        default: "unset",
        help: "refuse the mount unless the dataset's fingerprint is HEX",
        example: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        set: Setter::Value(|o, k, v| {
            let hex = v.to_ascii_lowercase();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                let why = "expected the 64 hex digits dataset.json and tensorfs snapshot give";
                return Err(bad(k, v, why));
            }
            {
                o.fingerprint = Some(hex);
                Ok(())
            }
        }),
        get: |o| json!(o.fingerprint),
    },
];

/// The option named `key`, if tensorfs takes it.
pub(crate) fn spec(key: &str) -> Option<&'static OptionSpec> {
    SPECS.iter().find(|s| s.name == key)
}

/// What `tensorfs mount --help` lists of `-o`: each option's form, default and line.
pub fn help() -> String {
    let mut out =
        String::from("Mount options (-o, comma-separated; docs/options.md describes each):\n");
    let mut heading = "";
    for s in SPECS {
        let (section, _) = s.role.section();
        if section != heading {
            out.push_str(&format!("{section}:\n"));
            heading = section;
        }
        let default = s.default.replace('`', "");
        out.push_str(&format!("  {:<36} {} [{default}]\n", s.form, s.help));
    }
    out.push_str(
        "store:\n  object_store keys: aws_endpoint=URL, aws_region=…, google_…, azure_…;\n  \
         HTTP: client_…, http_username=U, http_password=P, http_bearer_token=T\n\
         Names with ':', ',', '+' or '=' escape them with a backslash: columns=a\\:b:c",
    );
    out
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
        match (spec(key).map(|s| s.set), value) {
            (Some(Setter::Flag(field)), value) => {
                *field(self) = match value {
                    None | Some("true" | "1" | "on") => true,
                    Some("false" | "0" | "off") => false,
                    Some(v) => return Err(bad(key, v, "expected no value, true or false")),
                };
                Ok(())
            }
            (Some(Setter::Value(set)), Some(v)) => set(self, key, v),
            (Some(Setter::Value(_)), None) => Err(OptionError(format!(
                "mount option {key} needs a value: {key}=VALUE"
            ))),
            (None, _) if is_generic(key) => Ok(()),
            (None, Some(v)) if STORE_PREFIXES.iter().any(|p| key.starts_with(p)) => {
                self.store.push((key.into(), v.into()));
                Ok(())
            }
            (None, _) => Err(unknown(key)),
        }
    }

    /// The transform asked for, if any.
    pub(crate) fn udf(&self) -> Option<crate::udf::TransformOptions> {
        Some(crate::udf::TransformOptions {
            target: self.transform.clone()?,
            path: self.transform_path.clone(),
            version: self.transform_version.clone(),
            workers: self.transform_workers.unwrap_or(self.threads),
            python: self.python.clone(),
            columns: self.transform_columns.clone().unwrap_or_default(),
        })
    }

    /// Checks between options.
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

    pub(crate) fn order(&self) -> OrderOptions {
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
    pub(crate) fn block(&self) -> u64 {
        (self.shuffle_block).unwrap_or_else(|| crate::model::plan::default_block(self.partitions))
    }

    /// The content options, as two values the cache keys are derived from: what decides the
    /// decoded columns, and what decides the order of rows into batches. Each option's [`Role`]
    /// places it, and a test checks that each option changes its key and only its key: a
    /// content option left out would serve stale bytes from a warm cache.
    pub(crate) fn content(&self) -> Content {
        let keyed = |role: Role| {
            let values = SPECS.iter().filter(|s| s.role == role);
            serde_json::Value::Object(values.map(|s| (s.name.into(), (s.get)(self))).collect())
        };
        Content {
            columns: keyed(Role::Columns),
            order: keyed(Role::Order),
        }
    }

    /// The options in force, for dataset.json; secrets of the store are left out.
    /// The options that decide which rows batch i of an epoch holds (the column and order
    /// roles): what a reader's saved place must agree with to resume.
    pub(crate) fn order_option_names() -> Vec<&'static str> {
        (SPECS.iter())
            .filter(|s| matches!(s.role, Role::Columns | Role::Order))
            .map(|s| s.name)
            .collect()
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        let mut m: serde_json::Map<String, serde_json::Value> = (SPECS.iter())
            .map(|s| (s.name.into(), (s.get)(self)))
            .collect();
        let store: BTreeMap<&str, &str> = (self.store.iter())
            .filter(|(k, _)| !is_secret(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        m.insert("store".into(), json!(store));
        serde_json::Value::Object(m)
    }
}

/// Store keys whose values are credentials.
pub(crate) fn is_secret(key: &str) -> bool {
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

    #[test]
    fn a_version_is_a_number_or_a_time() {
        assert_eq!(AsOf::parse("42"), Some(AsOf::Number(42)));
        let noon = Some(AsOf::Time(1_761_998_400_000));
        assert_eq!(AsOf::parse("2025-11-01T12:00:00Z"), noon);
        assert_eq!(AsOf::parse("2025-11-01T14:00:00+02:00"), noon);
        assert_eq!(AsOf::parse("2025-11-01 12:00:00"), noon);
        assert_eq!(AsOf::parse("2025-11-01T12:00:00.000"), noon);
        assert_eq!(
            AsOf::parse("2025-11-01"),
            Some(AsOf::Time(1_761_955_200_000))
        );
        assert_eq!(AsOf::parse("yesterday"), None);
        assert_eq!(
            AsOf::Time(1_761_998_400_000).to_string(),
            "2025-11-01T12:00:00.000Z"
        );
    }

    fn err(args: &[&str]) -> String {
        Options::parse(args).unwrap_err().to_string()
    }

    #[test]
    fn store_keys_are_those_of_a_store_and_no_other_prefix() {
        let o = Options::parse(&["aws_region=us-east-1,client_timeout=60s"]).unwrap();
        assert_eq!(o.store.len(), 2);
        let e = Options::parse(&["object_store_timeout=60s"]).unwrap_err();
        assert!(e.to_string().contains("unknown mount option"), "{e}");
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
            key in proptest::sample::select(SPECS.iter().map(|s| s.name).chain(["aws_region"]).collect::<Vec<_>>()),
            value in "[ -+--~]{0,40}",
        ) {
            match Options::parse(&[format!("{key}={value}")]) {
                Ok(o) => proptest::prop_assert!(o.batch_size > 0 && o.shuffle_window > 0 && o.block() > 0),
                Err(e) => proptest::prop_assert!(e.to_string().contains(key)),
            }
        }
    }

    /// Two parses that differ in option `s` alone: off and on for a flag, the default and the
    /// example for a value. A transform is given, as the `transform_` options need one.
    fn differing(s: &OptionSpec) -> (Options, Options) {
        let base = "transform=t.py:f";
        let parse = |opt: String| Options::parse(&[base, opt.as_str()]).unwrap();
        match s.set {
            Setter::Flag(_) => (parse(format!("{}=off", s.name)), parse(s.name.into())),
            Setter::Value(_) => (
                parse(String::new()),
                parse(format!("{}={}", s.name, s.example)),
            ),
        }
    }

    #[test]
    fn every_option_shows_in_dataset_json_and_content_options_change_their_key_alone() {
        for s in SPECS {
            let (a, b) = differing(s);
            assert_ne!(
                a.to_json()[s.name],
                b.to_json()[s.name],
                "{s:?} in dataset.json"
            );
            let (a, b) = (a.content(), b.content());
            let keyed = matches!(s.role, Role::Columns | Role::Order);
            assert_eq!(
                a != b,
                keyed,
                "{s:?} is {:?} but the cache key says otherwise",
                s.role
            );
            assert_eq!(a.columns != b.columns, s.role == Role::Columns, "{s:?}");
        }
        let store = Options::parse(&["aws_region=eu-west-1"]).unwrap().content();
        assert_eq!(
            store,
            Options::default().content(),
            "a store key is no content"
        );
        // Names that join with a separator never make two lists write one key.
        let a = Options::parse(&[r"stack=s:a\+b"]).unwrap().content();
        let b = Options::parse(&["stack=s:a+b"]).unwrap().content();
        assert_ne!(a, b);
    }

    #[test]
    fn defaults_in_backticks_are_what_a_mount_without_the_option_has() {
        let d = Options::default().to_json();
        let mut checked = 0;
        for s in SPECS {
            let literal = (s.default.strip_prefix('`'))
                .and_then(|v| v.strip_suffix('`'))
                .filter(|v| !v.contains('`'));
            let given = match (s.set, literal) {
                (Setter::Flag(_), _) if s.default == "off" => format!("{}=off", s.name),
                (Setter::Value(_), Some(v)) => format!("{}={v}", s.name),
                _ => continue,
            };
            // A default written as a formula (`max(…)`, `threads=`) parses as no value.
            if let Ok(o) = Options::parse(&[given.as_str()]) {
                assert_eq!(
                    o.to_json()[s.name],
                    d[s.name],
                    "{s:?}'s default is {}",
                    s.default
                );
                checked += 1;
            }
        }
        assert!(checked >= 15, "{checked} defaults checked");
    }

    #[test]
    fn docs_options_md_lists_each_option_with_its_form_default_and_section() {
        let docs = include_str!("../docs/options.md");
        let mut rows = Vec::new();
        let mut section = "";
        for line in docs.lines() {
            if line.starts_with("## ") {
                section = line;
            }
            let Some(row) = line.strip_prefix("| `") else {
                continue;
            };
            // A `|` inside a cell is written `\|`.
            let cells: Vec<String> = (row.replace("\\|", "\u{1}").split('|'))
                .map(|c| c.trim().replace('\u{1}', "|"))
                .collect();
            let form = cells[0].trim_end_matches('`').to_string();
            rows.push((section, form, cells[1].clone()));
        }
        let ours = |section: &str| {
            [Role::Columns, Role::Runtime, Role::Dataset]
                .iter()
                .any(|r| section.starts_with(r.section().1))
        };
        for s in SPECS {
            let found: Vec<_> = rows.iter().filter(|(_, form, _)| form == s.form).collect();
            assert_eq!(
                found.len(),
                1,
                "docs/options.md has no one row for `{}`",
                s.form
            );
            let (section, _, default) = found[0];
            assert!(
                section.starts_with(s.role.section().1),
                "{s:?} is under {section}"
            );
            assert_eq!(default, s.default, "{s:?}'s default in docs/options.md");
        }
        for (section, form, _) in rows.iter().filter(|(section, ..)| ours(section)) {
            assert!(
                SPECS.iter().any(|s| s.form == form),
                "{form} ({section}) is no option"
            );
        }
        for s in SPECS {
            assert!(help().contains(s.form), "--help misses {s:?}");
        }
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
