//! tensorfs: a Parquet dataset shown as per-epoch, deterministic tensor batch files.
//!
//! The folders follow the layers, bottom up: `model` holds what every layer shares (the plan
//! that orders rows into batches, element types, the items the cache keeps); `source` reads
//! Parquet through object_store (its objects and footer facts in a catalog, which a snapshot
//! pins for every host) and maps its schema to tensors, beside `cache`, which keeps columns and
//! files on the local SSD; `read` lays out the files, builds them and follows the readers;
//! `requests` is the filesystem core the kernel's requests reach (the tree, open files);
//! `kernel` is the adapter to the kernel, and `mount` ties them together. The tests below hold
//! the layers; docs/dev/architecture.md draws them.

mod cache;
pub mod client;
pub mod daemon;
pub mod error;
mod kernel;
mod metrics;
pub mod model;
pub mod mount;
pub mod options;
pub mod read;
pub mod requests;
pub mod source;
pub mod stats;
mod udf;

/// The parsers of bytes from outside, as the daemon calls them, for the fuzz targets under
/// `fuzz/` (cargo-fuzz builds with `--cfg fuzzing`). Each returns nothing: a target fails only
/// where a parser panics outside the third-party decoders it guards, hangs, or runs out of
/// memory.
#[cfg(fuzzing)]
pub mod fuzz {
    /// A Parquet footer (the bytes before its length): decoded as pyarrow would, re-encoded
    /// where a strict decode fails, and a key-value entry looked up.
    pub fn footer(data: &[u8]) {
        let _ = crate::source::footer::decode(data);
        let _ = crate::source::footer::key_value(data, "petastorm.unischema.v1");
    }

    /// A Petastorm cell: `.npy`, `.npz`, or any codec's bytes as an inferred field.
    pub fn npy(data: &[u8]) {
        let _ = crate::source::petastorm::decode_npy(data);
        let _ = crate::source::petastorm::decode_npz(data);
        let _ = crate::source::petastorm::infer_field("x", true, data);
    }

    /// A Unischema pickle (`_common_metadata`), parsed without running it.
    pub fn unischema(data: &[u8]) {
        let _ = crate::source::petastorm::parse_unischema(data);
    }

    /// A snapshot file.
    pub fn snapshot(data: &[u8]) {
        let _ = crate::source::snapshot::decode(data, "fuzz");
    }
}

thread_local! {
    static CATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into an error carrying the panic's message: for third-party
/// decoders that may panic on malformed input. The panic is logged at debug level only; the
/// caller reports the error.
pub(crate) fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CATCHING.with(|c| c.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(outer));
    result.map_err(panic_text)
}

/// A caught panic's message, on one line.
pub(crate) fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    text.replace('\n', " ")
}

/// Installs the panic hook: a panic inside `catch_panic` is the caller's to report; any other
/// (a worker thread's, which becomes EIO) is logged as one line, and printed as one line where
/// no log is set up yet.
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        if CATCHING.with(|c| c.get()) {
            tracing::debug!("caught: {info}");
        } else if tracing::dispatcher::has_been_set() {
            tracing::error!("internal error: {}", info.to_string().replace('\n', " "));
        } else {
            eprintln!(
                "tensorfs: error: internal error: {}",
                info.to_string().replace('\n', " ")
            );
        }
    }));
}

/// An error and its causes on one line, each cause once: wrapped errors (Parquet's `External`)
/// repeat their source's message, which is left out the second time.
pub(crate) fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// An error as the one line a refused command prints.
pub fn one_line(e: &anyhow::Error) -> String {
    crate::describe(e).replace('\n', " ")
}

#[cfg(test)]
mod tests {
    /// The folders and modules of `src/`, bottom up: each may use only those in layers below
    /// its own (and the functions of this file). Modules of one layer stand beside each other
    /// and use none of the others. docs/dev/architecture.md draws it.
    const LAYERS: &[&[&str]] = &[
        &["model", "stats", "error"],
        &["udf"],
        &["options"],
        &["source", "cache"],
        &["read"],
        &["requests"],
        &["kernel", "metrics", "client"],
        &["mount"],
        &["daemon"],
    ];

    /// The `crate::` modules each top-level module's code (its tests aside) names, by file.
    fn uses() -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for (rel, code) in code_under("src") {
            let top = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            for path in named_paths(&rel, &code.join("\n")) {
                let name = path.first().cloned().unwrap_or_default();
                if name != top {
                    out.push((rel.clone(), top.clone(), name));
                }
            }
        }
        out
    }

    /// The module path of the file `rel` (relative to `src/`): `read/produce/builder.rs` is
    /// `[read, build, builder]`, a `mod.rs` its folder's, `lib.rs` the crate's root.
    fn module_of(rel: &str) -> Vec<String> {
        let mut parts: Vec<String> = rel.split('/').map(String::from).collect();
        let last = parts.pop().unwrap_or_default();
        match last.as_str() {
            "mod.rs" | "lib.rs" | "main.rs" => {}
            file => parts.push(file.trim_end_matches(".rs").to_string()),
        }
        parts
    }

    /// Every path from the crate's root that `code` (of file `rel`) names through `crate::`
    /// or `super::`, grouped imports (`use crate::{a::b, c::{d, e}}`, over several lines)
    /// expanded: each as its segments.
    fn named_paths(rel: &str, code: &str) -> Vec<Vec<String>> {
        let module = module_of(rel);
        let mut out = Vec::new();
        let bytes = code.as_bytes();
        let word_start = |at: usize| {
            at == 0
                || !(bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
        };
        for (at, _) in code.match_indices("crate::") {
            if word_start(at) {
                out.extend(use_tree(&code[at + 7..]));
            }
        }
        let mut at = 0;
        while let Some(found) = code[at..].find("super::") {
            let start = at + found;
            at = start + 7;
            if !word_start(start) {
                continue;
            }
            let mut ups = 1;
            while code[at..].starts_with("super::") {
                ups += 1;
                at += 7;
            }
            // `super` of an item in a file is its file's module's parent... of the file's own
            // module: a file's code lives in its module, so one `super` leaves it.
            let base: Vec<String> = module[..module.len().saturating_sub(ups)].to_vec();
            for tail in use_tree(&code[at..]) {
                out.push(base.iter().cloned().chain(tail).collect());
            }
        }
        out
    }

    /// The paths of a use tree starting at `s` (right after `crate::`): `a::b::C`,
    /// `a::{b, c::{d}}`, each leaf as its segments.
    fn use_tree(s: &str) -> Vec<Vec<String>> {
        fn tree(s: &[u8], at: &mut usize) -> Vec<Vec<String>> {
            let skip_space = |at: &mut usize| {
                while *at < s.len() && (s[*at] as char).is_whitespace() {
                    *at += 1;
                }
            };
            skip_space(at);
            if *at < s.len() && s[*at] == b'{' {
                *at += 1;
                let mut out = Vec::new();
                loop {
                    skip_space(at);
                    if *at >= s.len() {
                        return out;
                    }
                    if s[*at] == b'}' {
                        *at += 1;
                        return out;
                    }
                    if s[*at] == b',' {
                        *at += 1;
                        continue;
                    }
                    let before = *at;
                    out.extend(tree(s, at));
                    if *at == before {
                        *at += 1;
                    }
                }
            }
            let begin = *at;
            while *at < s.len() && (s[*at].is_ascii_alphanumeric() || s[*at] == b'_') {
                *at += 1;
            }
            let segment = String::from_utf8_lossy(&s[begin..*at]).to_string();
            if segment.is_empty() {
                return Vec::new();
            }
            if s[*at..].starts_with(b"::") {
                *at += 2;
                let rest = tree(s, at);
                if rest.is_empty() {
                    return vec![vec![segment]];
                }
                return (rest.into_iter())
                    .map(|r| std::iter::once(segment.clone()).chain(r).collect())
                    .collect();
            }
            vec![vec![segment]]
        }
        tree(s.as_bytes(), &mut 0)
    }

    #[test]
    fn grouped_imports_and_super_paths_are_seen() {
        let paths = named_paths(
            "read/produce/builder.rs",
            "use crate::{\n    cache::{DiskCache, Item},\n    read::follow::prefetch,\n};\nuse super::super::follow::Event;\nlet x = crate::stats::Stats::add; // pub(super) fn f()",
        );
        let has = |p: &[&str]| {
            paths
                .iter()
                .any(|q| q.iter().map(String::as_str).eq(p.iter().copied()))
        };
        assert!(
            has(&["cache", "DiskCache"]) && has(&["cache", "Item"]),
            "{paths:?}"
        );
        assert!(has(&["read", "follow", "prefetch"]), "{paths:?}");
        assert!(has(&["read", "follow", "Event"]), "{paths:?}");
        assert!(has(&["stats", "Stats", "add"]), "{paths:?}");
        // From a top-level file, `super` is the crate's root.
        let top = named_paths("mount.rs", "use super::kernel::fuse;");
        assert_eq!(top, vec![vec!["kernel".to_string(), "fuse".to_string()]]);
        let nested = named_paths("source/delta.rs", "use super::catalog::Catalog;");
        assert_eq!(
            nested[0][..2],
            ["source".to_string(), "catalog".to_string()]
        );
    }

    #[test]
    fn no_module_uses_one_above_or_beside_it() {
        let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
        let uses = uses();
        // The scan finds what is there: the wiring uses the read path.
        assert!(
            uses.iter()
                .any(|(_, top, used)| top == "mount" && used == "read")
        );
        let mut wrong = Vec::new();
        for (file, top, used) in uses {
            if top == "main" || top == "lib" {
                continue;
            }
            let Some(own) = layer(&top) else {
                wrong.push(format!("{file}: module `{top}` has no layer"));
                continue;
            };
            // A name of no layer is a function of lib.rs (`describe`, `catch_panic`).
            if let Some(theirs) = layer(&used)
                && theirs >= own
            {
                wrong.push(format!("{file} ({top}) uses crate::{used}"));
            }
        }
        wrong.sort();
        wrong.dedup();
        assert!(wrong.is_empty(), "layers broken:\n{}", wrong.join("\n"));
    }

    /// Inside `read/`: `build` uses nothing of `follow`, and the folder's own modules (layout,
    /// format, readers) neither.
    #[test]
    fn the_read_path_builds_below_what_follows_readers() {
        let mut wrong = Vec::new();
        for (rel, code) in code_under("src/read") {
            let paths = named_paths(&format!("read/{rel}"), &code.join("\n"));
            let uses = |what: &[&str]| {
                (paths.iter()).any(|p| p.len() >= 2 && p[0] == what[0] && p[1] == what[1])
            };
            let below = match rel.split('/').next().unwrap() {
                "follow" => [["read", "follow"]].as_slice(),
                "build" => [["read", "follow"]].as_slice(),
                _ => [["read", "follow"], ["read", "build"]].as_slice(),
            };
            if rel.starts_with("follow") {
                continue;
            }
            for what in below.iter().filter(|w| uses(w.as_slice())) {
                wrong.push(format!("read/{rel} uses crate::{}", what.join("::")));
            }
        }
        assert!(
            wrong.is_empty(),
            "read/ layers broken:\n{}",
            wrong.join("\n")
        );
    }

    /// Inside `requests/`: the serving facade is keyed by the file a reader reads, never by an
    /// inode: it uses nothing of the tree (which says what an inode is), and takes an inode only
    /// where a store into the kernel's page cache of a file being opened names it.
    #[test]
    fn the_serving_facade_knows_files_not_inodes() {
        let (_, code) = (code_under("src/requests").into_iter())
            .find(|(rel, _)| rel == "serve.rs")
            .expect("requests/serve.rs");
        assert!(!code.iter().any(|l| l.contains("crate::requests::fs")));
        let takes_ino: Vec<&String> = (code.iter()).filter(|l| l.contains("ino: u64")).collect();
        assert_eq!(takes_ino.len(), 2, "{takes_ino:?}");
        assert!(
            code.iter()
                .any(|l| l.contains("fn store_at_hand(&self, f: BatchFile, ino: u64"))
        );
    }

    /// Each `.rs` file under `dir` (of the crate), relative to it, with its lines of code: those
    /// before its `tests` module, comments cut off.
    fn code_under(dir: &str) -> Vec<(String, Vec<String>)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut out = Vec::new();
        for path in walk(&root) {
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            let lines = code
                .lines()
                .map(|l| l.split("//").next().unwrap().to_string());
            out.push((rel, lines.collect()));
        }
        out
    }

    /// Every `.rs` file under `dir`.
    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
        out
    }

    #[test]
    fn causes_are_described_once() {
        let inner = anyhow::anyhow!("object 'a' changed");
        let e = inner
            .context("External: object 'a' changed")
            .context("file 'a' row group 2");
        assert_eq!(
            super::describe(&e),
            "file 'a' row group 2: External: object 'a' changed"
        );
    }
}
