//! The files a mount shows, in one place: the kinds of file a batch directory holds, their
//! names (formatted and parsed), their exact sizes, and their bytes (a header, then tensor
//! data). The local cache stores batch files under the same names, byte for byte, so that the
//! kernel can pass reads through to them.

use crate::model::item::{FileKind, Item};
use crate::model::plan::Batches;
use crate::read::format::{self, TensorLayout};
use crate::source::view::Tensor;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The name of a directory's one-open safetensors file.
pub(crate) const ALL_SAFETENSORS: &str = "all.safetensors";
/// The name of a directory's folder of one-open `.npy` files.
pub(crate) const ALL: &str = "all";

/// Batch `i`'s name, `{i:06d}`: its directory's, and its safetensors file's stem. Six digits, and
/// as many as it has past batch 999999, so that one name never depends on the epoch's length.
pub(crate) fn batch_name(i: u64) -> String {
    format!("{i:06}")
}

/// Entries a listing of a directory gives before its own: `.` and `..`.
pub const DOT_ENTRIES: u64 = 2;

/// Where batch `i`'s `.safetensors` file is among an epoch or rank directory's own entries (its
/// directory of per-tensor files next, the batches in order, then the rest): a listing that
/// seeks to `DOT_ENTRIES + batch_file_entry(i)` starts at it.
pub fn batch_file_entry(i: u64) -> u64 {
    2 * i
}

/// Where batch `i`'s directory of per-tensor files is, as [`batch_file_entry`].
pub(crate) fn batch_dir_entry(i: u64) -> u64 {
    2 * i + 1
}

/// The batch whose file or directory an epoch or rank directory's own entry `k` is (below
/// [`batch_file_entry`] of its batch count), and whether it is the `.safetensors` file.
pub(crate) fn entry_batch(k: u64) -> (u64, bool) {
    (k / 2, k.is_multiple_of(2))
}

/// Batch `i`'s `.safetensors` file.
pub(crate) fn safetensors_name(i: u64) -> String {
    format!("{}.safetensors", batch_name(i))
}

/// The batch whose `.safetensors` file `name` is.
pub(crate) fn parse_safetensors_name(name: &str) -> Option<u64> {
    parse_batch(name.strip_suffix(".safetensors")?)
}

/// The `.npy` file of the tensor named `tensor` (in a batch's directory, or `all/`).
pub(crate) fn npy_file_name(tensor: &str) -> String {
    format!("{tensor}.npy")
}

/// The batch a name is: the name `batch_name` gives it, and no other spelling.
pub(crate) fn parse_batch(s: &str) -> Option<u64> {
    let i = s
        .parse()
        .ok()
        .filter(|_| s.bytes().all(|c| c.is_ascii_digit()))?;
    (batch_name(i) == s).then_some(i)
}

/// A decimal number as names write it: digits, no leading zero.
pub(crate) fn number(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// `epoch-N`, and `epoch-N/rank-R-of-W` for a rank view: its path under the mount point.
pub(crate) fn dir_name(b: Batches) -> String {
    match b {
        Batches::Epoch(e) => epoch_name(e),
        Batches::Rank { epoch, rank, world } => {
            format!("{}/{}", epoch_name(epoch), rank_name(rank, world))
        }
    }
}

/// The directory of the cache's batch files that keeps one-open files built ahead.
pub(crate) const KEPT_ALL: &str = "all";

/// A kept one-open file's name: `epoch-N[.rank-R-of-W].safetensors`, or `….tT.npy` for tensor
/// T (tensor names may hold any character; their index is fixed by the cache key).
fn all_name(dir: Batches, kind: FileKind) -> String {
    let dir = match dir {
        Batches::Epoch(e) => epoch_name(e),
        Batches::Rank { epoch, rank, world } => {
            format!("{}.{}", epoch_name(epoch), rank_name(rank, world))
        }
    };
    match kind {
        FileKind::Safetensors => format!("{dir}.safetensors"),
        FileKind::Npy(t) => format!("{dir}.t{t}.npy"),
    }
}

pub(crate) fn epoch_name(epoch: u64) -> String {
    format!("epoch-{epoch}")
}

/// The last epoch a mount shows: `epoch-N` resolves for any N up to it (2^63 - 1). Bounded so
/// that the epochs after one (a prefetcher looks ahead into them) never overflow.
pub(crate) const MAX_EPOCH: u64 = i64::MAX as u64;

pub(crate) fn parse_epoch(name: &str) -> Option<u64> {
    name.strip_prefix("epoch-")
        .and_then(number)
        .filter(|&e| e <= MAX_EPOCH)
}

pub(crate) fn rank_name(rank: u64, world: u64) -> String {
    format!("rank-{rank}-of-{world}")
}

/// `rank-R-of-W` with R < W.
pub(crate) fn parse_rank(name: &str) -> Option<(u64, u64)> {
    name.strip_prefix("rank-")
        .and_then(|s| s.split_once("-of-"))
        .and_then(|(r, w)| Some((number(r)?, number(w)?)))
        .filter(|&(r, w)| r < w)
}

impl crate::model::item::ItemNames for Layout {
    fn item_path(&self, item: Item) -> PathBuf {
        Layout::item_path(self, item)
    }

    fn parse_batch_file(&self, epoch: u64, batch_dir: Option<&str>, name: &str) -> Option<Item> {
        Layout::parse_batch_file(self, epoch, batch_dir, name)
    }

    fn parse_all_name(&self, name: &str) -> Option<Item> {
        Layout::parse_all_name(self, name)
    }

    fn parse_epoch(&self, name: &str) -> Option<u64> {
        parse_epoch(name)
    }

    fn kept_all(&self) -> &'static str {
        KEPT_ALL
    }
}

/// The files of a mount: names and sizes from the tensor view alone.
pub(crate) struct Layout {
    tensors: Vec<Tensor>,
    /// Headers made, by file kind and rows: an epoch's batches have one or two lengths, and a
    /// header was made for each batch built and each size asked for (a safetensors header's
    /// JSON, and its allocations, were 2% of a cold epoch's CPU).
    headers: Mutex<HashMap<(FileKind, u64), Header>>,
}

/// A file's header, made once (see [`Layout::header`]).
type Header = Arc<[u8]>;

/// Headers kept at most: beyond it they are forgotten and made again (so many lengths come
/// only from many rank views or tensors).
const HEADERS_KEPT: usize = 1024;

impl Layout {
    pub(crate) fn new(tensors: Vec<Tensor>) -> Layout {
        Layout {
            tensors,
            headers: Mutex::default(),
        }
    }

    pub(crate) fn tensors(&self) -> usize {
        self.tensors.len()
    }

    pub(crate) fn tensor_name(&self, t: usize) -> &str {
        &self.tensors[t].name
    }

    /// The tensor a `NAME.npy` file name is.
    pub(crate) fn parse_npy(&self, file: &str) -> Option<usize> {
        let name = file.strip_suffix(".npy")?;
        self.tensors.iter().position(|t| t.name == name)
    }

    pub(crate) fn npy_name(&self, t: usize) -> String {
        npy_file_name(self.tensor_name(t))
    }

    pub(crate) fn file_name(&self, i: u64, kind: FileKind) -> String {
        match kind {
            FileKind::Safetensors => safetensors_name(i),
            FileKind::Npy(t) => format!("{}/{}", batch_name(i), self.npy_name(t)),
        }
    }

    /// Where the cache keeps an item, relative to its directory of columns or of batches.
    pub(crate) fn item_path(&self, item: Item) -> PathBuf {
        match item {
            Item::Columns { .. } => unreachable!("the cache names columns files by object"),
            Item::Batch { epoch, batch, kind } => {
                PathBuf::from(epoch_name(epoch)).join(self.file_name(batch, kind))
            }
            Item::All { dir, kind } => PathBuf::from(KEPT_ALL).join(all_name(dir, kind)),
        }
    }

    /// The one-open file a name in the cache's [`KEPT_ALL`] directory is ([`all_name`]).
    pub(crate) fn parse_all_name(&self, name: &str) -> Option<Item> {
        let (stem, kind) = match name.strip_suffix(".safetensors") {
            Some(stem) => (stem, FileKind::Safetensors),
            None => {
                let (stem, t) = name.strip_suffix(".npy")?.rsplit_once(".t")?;
                let t = number(t).filter(|&t| (t as usize) < self.tensors.len())?;
                (stem, FileKind::Npy(t as usize))
            }
        };
        let dir = match stem.split_once('.') {
            None => Batches::Epoch(parse_epoch(stem)?),
            Some((epoch, rank)) => {
                let (rank, world) = parse_rank(rank)?;
                let epoch = parse_epoch(epoch)?;
                Batches::Rank { epoch, rank, world }
            }
        };
        (all_name(dir, kind) == name).then_some(Item::All { dir, kind })
    }

    /// The batch file a path below an epoch's directory names (`NNNNNN.safetensors`, or
    /// `NNNNNN/NAME.npy` as `dir` and `name`), if any.
    pub(crate) fn parse_batch_file(
        &self,
        epoch: u64,
        dir: Option<&str>,
        name: &str,
    ) -> Option<Item> {
        let (batch, kind) = match dir {
            None => (parse_safetensors_name(name)?, FileKind::Safetensors),
            Some(dir) => (parse_batch(dir)?, FileKind::Npy(self.parse_npy(name)?)),
        };
        Some(Item::Batch { epoch, batch, kind })
    }

    /// Every tensor's layout in a batch of `rows` rows, in file order.
    pub(crate) fn layouts(&self, rows: u64) -> Vec<TensorLayout<'_>> {
        self.tensors
            .iter()
            .map(|t| TensorLayout {
                name: &t.name,
                dtype: t.dtype,
                shape: t.shape(rows),
            })
            .collect()
    }

    /// The header of a file of `rows` rows: a batch file, or a directory's one-open file
    /// (`Npy` of every row of the tensor, `Safetensors` of every tensor).
    pub(crate) fn header(&self, kind: FileKind, rows: u64) -> Arc<[u8]> {
        if let Some(h) = self.headers.lock().unwrap().get(&(kind, rows)) {
            return h.clone();
        }
        let header: Arc<[u8]> = match kind {
            FileKind::Safetensors => format::safetensors_header(&self.layouts(rows)),
            FileKind::Npy(t) => {
                let tensor = &self.tensors[t];
                format::npy_header(tensor.dtype, &tensor.shape(rows))
            }
        }
        .into();
        let mut headers = self.headers.lock().unwrap();
        if headers.len() >= HEADERS_KEPT {
            headers.clear();
        }
        headers.insert((kind, rows), header.clone());
        header
    }

    /// The tensors a file holds, in order.
    pub(crate) fn tensors_of(&self, kind: FileKind) -> std::ops::Range<usize> {
        match kind {
            FileKind::Safetensors => 0..self.tensors(),
            FileKind::Npy(t) => t..t + 1,
        }
    }

    /// Bytes of one row of tensor `t`.
    pub(crate) fn row_bytes(&self, t: usize) -> u64 {
        self.tensors[t].row_bytes() as u64
    }

    /// The exact size of a file of `rows` rows, known before any of its data exists.
    pub(crate) fn size(&self, kind: FileKind, rows: u64) -> u64 {
        let data: u64 = self
            .tensors_of(kind)
            .map(|t| rows * self.row_bytes(t))
            .sum();
        self.header_len(kind, rows) + data
    }

    /// Where tensor `t`'s data lies in a file `kind` of `rows` rows (which must hold it).
    pub(crate) fn tensor_range(&self, kind: FileKind, rows: u64, t: usize) -> std::ops::Range<u64> {
        (self.tensor_ranges(kind, rows))
            .find_map(|(u, range)| (u == t).then_some(range))
            .expect("a tensor of the file")
    }

    /// Each tensor of a file `kind` of `rows` rows, with where its data lies, in file order
    /// (the header, which a safetensors file builds to know its length, built once).
    pub(crate) fn tensor_ranges(
        &self,
        kind: FileKind,
        rows: u64,
    ) -> impl Iterator<Item = (usize, std::ops::Range<u64>)> + '_ {
        let mut start = self.header_len(kind, rows);
        self.tensors_of(kind).map(move |t| {
            let range = start..start + rows * self.row_bytes(t);
            start = range.end;
            (t, range)
        })
    }

    /// What a read of `size` bytes at `offset` of one-open file `kind` of `rows` rows (batches
    /// of `batch_size`) spans: its header's bytes, then each batch's rows of each tensor it
    /// reaches, in file order (each tensor's rows of every batch lie in batch order).
    pub(crate) fn spans(
        &self,
        kind: FileKind,
        rows: u64,
        batch_size: u64,
        offset: u64,
        size: u32,
    ) -> Vec<Span> {
        let end = offset + size as u64;
        let header = self.header_len(kind, rows);
        let mut out = Vec::new();
        if offset < header {
            out.push(Span::Header(offset..end.min(header)));
        }
        for (t, range) in self.tensor_ranges(kind, rows) {
            let per_batch = batch_size * self.row_bytes(t);
            let mut at = offset.max(range.start);
            while at < end.min(range.end) {
                let batch = (at - range.start) / per_batch;
                let batch_start = range.start + batch * per_batch;
                let to = end.min(range.end).min(batch_start + per_batch);
                out.push(Span::Rows {
                    t,
                    batch,
                    within: at - batch_start..to - batch_start,
                });
                at = to;
            }
        }
        out
    }

    fn header_len(&self, kind: FileKind, rows: u64) -> u64 {
        (match kind {
            FileKind::Safetensors => self.header(kind, rows).len(),
            FileKind::Npy(t) => {
                let tensor = &self.tensors[t];
                format::npy_header_len(tensor.dtype, &tensor.shape(rows))
            }
        }) as u64
    }

    /// A batch file's bytes: its header, then its tensors' data.
    pub(crate) fn parts<'a>(
        &self,
        kind: FileKind,
        header: &'a [u8],
        tensors: &'a [Vec<u8>],
    ) -> Vec<&'a [u8]> {
        std::iter::once(header)
            .chain(self.tensors_of(kind).map(|t| tensors[t].as_slice()))
            .collect()
    }
}

/// A piece of a read of a one-open file ([`Layout::spans`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Span {
    /// These bytes of its header.
    Header(std::ops::Range<u64>),
    /// These bytes of batch `batch`'s rows of tensor `t`.
    Rows {
        t: usize,
        batch: u64,
        within: std::ops::Range<u64>,
    },
}

impl Span {
    /// How many bytes of the file it spans.
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Span::Header(range) => range.end - range.start,
            Span::Rows { within, .. } => within.end - within.start,
        }
    }
}

/// `size` bytes at `offset` of the concatenation of `parts`.
pub(crate) fn slice(parts: &[&[u8]], offset: u64, size: u32) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity((size as usize).min(total.saturating_sub(offset as usize)));
    let (mut start, end) = (offset as usize, offset as usize + size as usize);
    let mut base = 0usize;
    for p in parts {
        let p_end = base + p.len();
        if start < p_end && start < end {
            let to = end.min(p_end);
            out.extend_from_slice(&p[start - base..to - base]);
            start = to;
        }
        base = p_end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical_numbers() {
        assert_eq!(number("0"), Some(0));
        assert_eq!(number("17"), Some(17));
        assert_eq!(number("017"), None);
        assert_eq!(number(""), None);
        assert_eq!(number("1x"), None);
        assert_eq!(parse_epoch("epoch-12"), Some(12));
        assert_eq!(parse_epoch("epoch-9223372036854775807"), Some(MAX_EPOCH));
        assert_eq!(parse_epoch("epoch-9223372036854775808"), None);
        assert_eq!(parse_epoch("epoch-012"), None);
        assert_eq!(parse_rank("rank-1-of-4"), Some((1, 4)));
        assert_eq!(parse_rank("rank-4-of-4"), None);
        assert_eq!(
            dir_name(Batches::Rank {
                epoch: 3,
                rank: 1,
                world: 2
            }),
            "epoch-3/rank-1-of-2"
        );
        assert_eq!(batch_name(7), "000007");
        assert_eq!(batch_name(1_234_567), "1234567");
        assert_eq!(parse_batch("000007"), Some(7));
        assert_eq!(parse_batch("1234567"), Some(1_234_567));
        for wrong in ["7", "0000007", "01234567", "+00007", "00000a", ""] {
            assert_eq!(parse_batch(wrong), None, "{wrong}");
        }
    }

    #[test]
    fn a_read_of_a_one_open_file_spans_its_header_then_each_tensors_batches() {
        let tensor = |name: &str, dtype, inner: Vec<usize>| Tensor {
            name: name.into(),
            dtype,
            inner,
            feature: 0,
            part: crate::source::view::Part::Data,
            unit: None,
        };
        let layout = Layout::new(vec![
            tensor("a", crate::model::dtype::DType::I64, vec![]),
            tensor("b", crate::model::dtype::DType::F32, vec![2]),
        ]);
        // 10 rows in batches of 4 (the last of 2): a is 8 B a row, b 8 B a row.
        let kind = FileKind::Safetensors;
        let (a, b) = (
            layout.tensor_range(kind, 10, 0),
            layout.tensor_range(kind, 10, 1),
        );
        assert_eq!((a.end - a.start, b.start), (80, a.end));
        let whole = layout.spans(kind, 10, 4, 0, layout.size(kind, 10) as u32);
        let rows = |t, batch, within: std::ops::Range<u64>| Span::Rows { t, batch, within };
        assert_eq!(
            whole,
            vec![
                Span::Header(0..a.start),
                rows(0, 0, 0..32),
                rows(0, 1, 0..32),
                rows(0, 2, 0..16),
                rows(1, 0, 0..32),
                rows(1, 1, 0..32),
                rows(1, 2, 0..16),
            ]
        );
        // From the middle of a's batch 1 to the start of b's batch 1.
        let part = layout.spans(
            kind,
            10,
            4,
            a.start + 40,
            (b.start + 33 - a.start - 40) as u32,
        );
        assert_eq!(
            part,
            vec![
                rows(0, 1, 8..32),
                rows(0, 2, 0..16),
                rows(1, 0, 0..32),
                rows(1, 1, 0..1)
            ]
        );
        assert_eq!(layout.spans(kind, 10, 4, b.end, 100), vec![]);
        let npy = FileKind::Npy(1);
        let start = layout.tensor_range(npy, 10, 1).start;
        assert_eq!(
            layout.spans(npy, 10, 4, start - 2, 4),
            vec![Span::Header(start - 2..start), rows(1, 0, 0..2)]
        );
    }

    #[test]
    fn slices_cross_parts() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"defg"];
        assert_eq!(slice(&parts, 0, 100), b"abcdefg");
        assert_eq!(slice(&parts, 2, 3), b"cde");
        assert_eq!(slice(&parts, 6, 10), b"g");
        assert_eq!(slice(&parts, 7, 10), b"");
        assert_eq!(slice(&parts, 50, 10), b"");
    }
}
