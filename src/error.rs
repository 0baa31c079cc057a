//! One error type for the filesystem core: the errno the kernel gets, the level it is logged at,
//! what happened, and its cause. The core returns it; the FUSE adapter logs it, once, when it
//! replies (after mountpoint-s3's `fs/error.rs`).

use tracing::Level;

#[derive(Debug)]
pub struct Error {
    errno: i32,
    level: Level,
    message: String,
    source: Option<anyhow::Error>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The object behind a file was replaced or removed since the dataset was read (under the
/// mount, or since the snapshot that pinned it): what was read can't be mixed with what would
/// be read now. Readers get `EIO`, as for any remote failure (PRODUCT.md §7); the log says what
/// happened.
#[derive(Debug, thiserror::Error)]
#[error("object '{location}' changed {since}: {how}")]
pub(crate) struct ObjectChanged {
    pub(crate) location: String,
    /// "under the mount", "since the snapshot", …
    pub(crate) since: &'static str,
    /// How it is known: "it is no longer version …", "it no longer exists", …
    pub(crate) how: String,
}

impl Error {
    /// An expected answer (ENOENT for a name that is not there, EISDIR, …): logged at debug.
    pub(crate) fn answer(errno: i32) -> Error {
        Error {
            errno,
            level: Level::DEBUG,
            message: String::new(),
            source: None,
        }
    }

    /// A failure of the work behind a file: EIO, logged as an error (a warning when an object
    /// changed under the mount: nothing is wrong with the daemon). `what` names the file or
    /// batch.
    pub(crate) fn failed(what: impl Into<String>, cause: anyhow::Error) -> Error {
        let changed = cause.chain().any(|c| c.is::<ObjectChanged>());
        Error {
            errno: libc::EIO,
            level: if changed { Level::WARN } else { Level::ERROR },
            message: what.into(),
            source: Some(cause),
        }
    }

    /// A limit of the daemon (too many directories looked up, …): a warning.
    pub(crate) fn limit(errno: i32, message: impl Into<String>) -> Error {
        Error {
            errno,
            level: Level::WARN,
            message: message.into(),
            source: None,
        }
    }

    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// Logs the error at its level, as one line.
    pub(crate) fn log(&self, op: &str) {
        let text = self.to_string();
        match self.level {
            Level::ERROR => tracing::error!("{op}: {text}"),
            Level::WARN => tracing::warn!("{op}: {text}"),
            Level::INFO => tracing::info!("{op}: {text}"),
            _ => tracing::debug!(
                "{op}: {} ({text})",
                std::io::Error::from_raw_os_error(self.errno)
            ),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(cause) = &self.source {
            if !self.message.is_empty() {
                f.write_str(": ")?;
            }
            f.write_str(&crate::describe(cause))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e.as_ref() as _)
    }
}

/// `Error::answer(libc::ENOENT)` and its kin, for the `?` of plain answers.
pub(crate) fn enoent() -> Error {
    Error::answer(libc::ENOENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_eio_and_say_what_failed() {
        let changed = anyhow::Error::new(ObjectChanged {
            location: "a.parquet".into(),
            since: "under the mount",
            how: "it is no longer version \"e1\"".into(),
        })
        .context("file 'a.parquet' row group 2");
        let e = Error::failed("epoch 0 batch 3", changed);
        assert_eq!(e.errno(), libc::EIO);
        assert_eq!(e.level, Level::WARN);
        assert!(
            e.to_string()
                .starts_with("epoch 0 batch 3: file 'a.parquet' row group 2")
        );
        assert!(e.to_string().contains("changed under the mount"));
        let e = Error::failed("epoch 0 batch 3", anyhow::anyhow!("connection reset"));
        assert_eq!(e.errno(), libc::EIO);
        assert_eq!(e.level, Level::ERROR);
        assert_eq!(Error::answer(libc::ENOENT).errno(), libc::ENOENT);
    }
}
