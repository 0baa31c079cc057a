//! A mixture's sources, as a `.toml` SOURCE lists them (PRODUCT.md §11):
//!
//! ```toml
//! [[source]]
//! url = "s3://bucket/web/"
//! where = "lang = 'en'"
//! proportion = 3
//!
//! [[source]]
//! url = "books/"          # a local path is relative to the .toml file's directory
//! version = 12
//! proportion = 1
//! ```
//!
//! Each source is opened as a SOURCE of its own under the mount's options; its `where` joins
//! the mount's (both hold). How many of its rows an epoch draws is [`crate::model::mix`]'s.

use crate::model::mix::Size;
use crate::options::AsOf;
use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

/// One `[[source]]` of a mixture.
#[derive(Clone, Debug)]
pub struct SourceSpec {
    /// The SOURCE as written (for messages and dataset.json).
    pub url: String,
    /// Where it is opened: a relative local path joined to the `.toml`'s directory.
    pub location: String,
    pub selection: Option<String>,
    pub version: Option<AsOf>,
    pub snapshot: Option<String>,
    pub size: Size,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    source: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    url: String,
    #[serde(rename = "where")]
    selection: Option<String>,
    version: Option<toml::Value>,
    snapshot: Option<String>,
    proportion: Option<f64>,
    repeat: Option<f64>,
    choose: Option<u64>,
}

/// Whether SOURCE names a mixture: a `.toml` file.
pub fn names_one(source: &str) -> bool {
    source.ends_with(".toml")
}

/// The sources the `.toml` at `path` lists, read from the local file system.
pub fn read(path: &str) -> Result<Vec<SourceSpec>> {
    let file = path.strip_prefix("file://").unwrap_or(path);
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("mixture '{path}' cannot be read"))?;
    let dir = std::path::Path::new(file)
        .parent()
        .unwrap_or(std::path::Path::new(""));
    parse(&text, dir).map_err(|e| anyhow!("mixture '{path}': {e}"))
}

/// The sources of a mixture's text; relative local paths are joined to `dir`.
fn parse(text: &str, dir: &std::path::Path) -> Result<Vec<SourceSpec>> {
    let file: File = toml::from_str(text).map_err(|e| {
        // toml's message spans lines (the line quoted, a caret): one line here.
        let first = e.message().lines().next().unwrap_or("").to_string();
        match e.span() {
            Some(at) => {
                let line = text[..at.start.min(text.len())].matches('\n').count() + 1;
                anyhow!("line {line}: {first}")
            }
            None => anyhow!("{first}"),
        }
    })?;
    if file.source.is_empty() {
        bail!("lists no [[source]]");
    }
    (file.source.into_iter().enumerate())
        .map(|(i, e)| spec(e, dir).map_err(|why| anyhow!("source {}: {why}", i + 1)))
        .collect()
}

fn spec(e: Entry, dir: &std::path::Path) -> Result<SourceSpec> {
    let size = match (e.proportion, e.repeat, e.choose) {
        (None, None, None) => Size::Repeat(1.0),
        (Some(p), None, None) if p.is_finite() && p >= 0.0 => Size::Proportion(p),
        (None, Some(r), None) if r.is_finite() && r >= 0.0 => Size::Repeat(r),
        (None, None, Some(c)) => Size::Choose(c),
        (Some(_), None, None) | (None, Some(_), None) => {
            bail!("proportion and repeat are numbers of 0 or more")
        }
        _ => bail!("give one of proportion, repeat and choose, not several"),
    };
    let version = match e.version {
        None => None,
        Some(v) => {
            let text = match &v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                other => other.to_string(),
            };
            Some(AsOf::parse(&text).ok_or_else(|| {
                anyhow!(
                    "version = {v}: expected a table version (a whole number) or an ISO 8601 time"
                )
            })?)
        }
    };
    if e.url.trim().is_empty() {
        bail!("url is empty");
    }
    // A local path that is not absolute is the .toml's neighbour, wherever the mount runs.
    let beside = |at: &str| match !at.contains("://") && !at.starts_with('/') {
        true => dir.join(at).to_string_lossy().into_owned(),
        false => at.to_string(),
    };
    Ok(SourceSpec {
        location: beside(&e.url),
        url: e.url,
        selection: e.selection.filter(|s| !s.trim().is_empty()),
        version,
        snapshot: e.snapshot.as_deref().map(beside),
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn sources_parse_with_their_sizes() {
        let text = r#"
[[source]]
url = "a/"
where = "x > 1"
proportion = 3

[[source]]
url = "s3://b/c/"
version = "2026-01-01T00:00:00Z"
proportion = 1.5
"#;
        let s = parse(text, Path::new("/d")).unwrap();
        assert_eq!(s[0].location, "/d/a/");
        assert_eq!(s[0].size, Size::Proportion(3.0));
        assert_eq!(s[0].selection.as_deref(), Some("x > 1"));
        assert_eq!(s[1].location, "s3://b/c/");
        assert!(matches!(s[1].version, Some(AsOf::Time(_))));
    }

    #[test]
    fn mistakes_are_one_line() {
        let d = Path::new("/");
        for (text, says) in [
            (
                "[[source]]\nurl = 'a'\nrepeat = 2\nchoose = 3\n",
                "source 1: give one of",
            ),
            (
                "[[source]]\nurl = 'a'\nweight = 2\n",
                "line 3: unknown field `weight`",
            ),
            ("[[source]]\nproportion = 1\n", "missing field `url`"),
            ("", "missing field `source`"),
            (
                "[[source]]\nurl = 'a'\nversion = 'soon'\n",
                "version = \"soon\"",
            ),
        ] {
            let e = parse(text, d).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
