//! A row group's tensors as the read path holds them (decoded, or loaded from the local cache),
//! and the gather of a batch's rows from them.
//!
//! Under a shuffle, narrow tensors (scalars and short vectors, at most [`INTERLEAVED_AT_MOST`]
//! bytes a row) are held interleaved, row by row, in one part of the row group; wider ones in a
//! part (a column) each. A shuffled batch takes its rows from all over row groups far larger
//! than the CPU's caches: read from a column per tensor, each row costs a cache line from
//! memory per tensor; interleaved, one or two lines for all of them. The bench's 11 narrow
//! tensors (56 bytes a row) of 2M rows in 40 row groups, gathered in shuffled batches of 1,024:
//! 265 ms from columns, 48 ms interleaved (a loop of each, alone). Unshuffled batches are runs
//! of rows, copied a column at a time: there every tensor keeps a column, unless a transform's
//! output is kept, which is laid out once for every shuffle (PRODUCT.md §10: a remount with
//! another shuffle does not run the function again).

use crate::cache::{ColumnBuf, LoadedColumns};
use crate::model::plan::Shuffle;
use crate::read::produce::tensors::TensorColumn;

/// Tensors of at most this many bytes a row are interleaved (where two or more are).
const INTERLEAVED_AT_MOST: usize = 16;

/// Whether a mount's columns interleave their narrow tensors: under `shuffle`, with or without
/// a `transform`.
fn interleaves(shuffle: Shuffle, transform: bool) -> bool {
    transform || shuffle != Shuffle::None
}

/// Where each tensor's rows are among a row group's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Whether narrow tensors were asked to be interleaved (the rule the cache's key names).
    interleave: bool,
    places: Vec<Place>,
    /// Bytes a row of the interleaved part (part 0); 0 where there is none.
    stride: usize,
    parts: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// A part of its own, its rows of `width` bytes back to back.
    Column { part: usize, width: usize },
    /// `width` bytes at `at` of each row of the interleaved part.
    Interleaved { at: usize, width: usize },
}

impl Placement {
    /// The placement of a mount's tensors of `row_bytes` bytes a row, in tensor order, under
    /// `shuffle`, with or without a `transform`: the one decision of how its row groups' columns
    /// are laid out, for the builder and the cache's key alike.
    pub(crate) fn for_mount(row_bytes: &[usize], shuffle: Shuffle, transform: bool) -> Placement {
        Placement::of(row_bytes, interleaves(shuffle, transform))
    }

    /// How columns files are laid out, in words: part of the key of the cache's columns files
    /// (files laid out otherwise are another key's).
    pub(crate) fn rule(&self) -> &'static str {
        match self.interleave {
            true => "tensors of 1 to 16 bytes a row interleaved in part 0",
            false => "a part per tensor",
        }
    }

    /// The placement of tensors of `row_bytes` bytes a row, in tensor order, narrow ones
    /// interleaved or not.
    pub(crate) fn of(row_bytes: &[usize], interleave: bool) -> Placement {
        let narrow = |w: usize| (1..=INTERLEAVED_AT_MOST).contains(&w);
        let interleaved = interleave && row_bytes.iter().filter(|&&w| narrow(w)).count() >= 2;
        let (mut stride, mut parts) = (0, usize::from(interleaved));
        let places = (row_bytes.iter())
            .map(|&width| match interleaved && narrow(width) {
                true => {
                    stride += width;
                    Place::Interleaved {
                        at: stride - width,
                        width,
                    }
                }
                false => {
                    parts += 1;
                    Place::Column {
                        part: parts - 1,
                        width,
                    }
                }
            })
            .collect();
        Placement {
            interleave,
            places,
            stride,
            parts,
        }
    }

    /// How many parts a row group's columns have.
    pub(crate) fn parts(&self) -> usize {
        self.parts
    }

    pub(crate) fn place(&self, tensor: usize) -> Place {
        self.places[tensor]
    }

    /// A row group's parts from its `rows` rows of each tensor, back to back (as transformed).
    /// A tensor Arrow holds is copied once, into its interleaved part or its own column.
    pub(crate) fn parts_of(&self, tensors: Vec<TensorColumn>, rows: usize) -> Vec<Vec<u8>> {
        if self.stride == 0 {
            return tensors.into_iter().map(TensorColumn::into_vec).collect();
        }
        let mut parts = vec![Vec::new(); self.parts];
        let mut narrow = Vec::new();
        for (tensor, &place) in tensors.into_iter().zip(&self.places) {
            match place {
                Place::Column { part, .. } => parts[part] = tensor.into_vec(),
                Place::Interleaved { width, .. } => {
                    assert_eq!(tensor.len(), rows * width, "a tensor of {rows} rows");
                    narrow.push((tensor, width));
                }
            }
        }
        // A few hundred rows at a time, laid out in a stage that stays in the CPU's first
        // cache, a tensor at a time, each by a loop of its width (row by row, a call per value
        // was a fifth of the transform workers' CPU in a cold epoch of the bench's transform);
        // then appended to the part, which is so written once, never zeroed first. The narrow
        // tensors make up the stride: every byte of a staged row is written.
        let mut rowwise = Vec::with_capacity(rows * self.stride);
        let mut stage = vec![0; INTERLEAVE_ROWS.min(rows) * self.stride];
        for first in (0..rows).step_by(INTERLEAVE_ROWS) {
            let n = INTERLEAVE_ROWS.min(rows - first);
            let out = &mut stage[..n * self.stride];
            let mut at = 0;
            for (tensor, width) in narrow.iter().map(|(t, w)| (t, *w)) {
                let values = &tensor[first * width..(first + n) * width];
                match width {
                    1 => interleave::<1>(values, out, at, self.stride),
                    2 => interleave::<2>(values, out, at, self.stride),
                    4 => interleave::<4>(values, out, at, self.stride),
                    8 => interleave::<8>(values, out, at, self.stride),
                    _ => {
                        let rows = out.chunks_exact_mut(self.stride);
                        for (value, row) in values.chunks_exact(width).zip(rows) {
                            row[at..at + width].copy_from_slice(value);
                        }
                    }
                }
                at += width;
            }
            rowwise.extend_from_slice(out);
        }
        parts[0] = rowwise;
        parts
    }
}

/// Rows interleaved at a time by [`Placement::parts_of`].
const INTERLEAVE_ROWS: usize = 256;

/// Copies `values` (`W` bytes each) to bytes `at..at + W` of the rows (`stride` bytes each)
/// of `out`, one value a row.
fn interleave<const W: usize>(values: &[u8], out: &mut [u8], at: usize, stride: usize) {
    for (value, row) in values.chunks_exact(W).zip(out.chunks_exact_mut(stride)) {
        let value: &[u8; W] = value.try_into().expect("W bytes");
        row[at..at + W].copy_from_slice(value);
    }
}

/// One row group's tensors in the parts of a [`Placement`], as decoded or as loaded from the
/// local cache.
pub(crate) struct Columns {
    data: ColumnData,
}

enum ColumnData {
    Owned(Vec<Vec<u8>>),
    Loaded(LoadedColumns),
}

impl Columns {
    pub(crate) fn owned(parts: Vec<Vec<u8>>) -> Columns {
        Columns {
            data: ColumnData::Owned(parts),
        }
    }

    pub(crate) fn loaded(l: LoadedColumns) -> Columns {
        Columns {
            data: ColumnData::Loaded(l),
        }
    }

    /// Part `p`'s bytes.
    fn part(&self, p: usize) -> &[u8] {
        match &self.data {
            ColumnData::Owned(v) => &v[p],
            ColumnData::Loaded(l) => &l.buf[l.ranges[p].clone()],
        }
    }

    /// Whether these are a mapped file that changed under the mapping: rows gathered from it
    /// since may be zeros, not the file's.
    pub(crate) fn poisoned(&self) -> bool {
        matches!(&self.data, ColumnData::Loaded(l) if l.buf.poisoned())
    }

    /// Whether the columns are a mapped file of the local cache.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(&self.data, ColumnData::Loaded(l) if matches!(l.buf, ColumnBuf::Mapped(_)))
    }

    /// Bytes held in the daemon's memory (mapped pages belong to the page cache).
    pub(crate) fn bytes(&self) -> usize {
        match &self.data {
            ColumnData::Owned(v) => v.iter().map(Vec::len).sum(),
            ColumnData::Loaded(l) => match &l.buf {
                ColumnBuf::Read(v) => v.len(),
                ColumnBuf::Mapped(_) => 0,
            },
        }
    }
}

/// A batch's rows in its row groups.
pub(crate) enum Rows {
    /// Each row: (index into the batch's row groups, row in that row group).
    Each(Vec<(usize, usize)>),
    /// Runs of consecutive rows of one row group, where the rows come so (an unshuffled
    /// order): copied a run at a time, not a row at a time.
    Runs(Vec<Run>),
}

impl Rows {
    /// `rows` (as [`Rows::Each`] holds them), as runs where they average at least [`MIN_RUN`]
    /// rows (an unshuffled batch is one run per row group it spans).
    pub(crate) fn of(rows: Vec<(usize, usize)>) -> Rows {
        match runs_of(&rows) {
            Some(runs) => Rows::Runs(runs),
            None => Rows::Each(rows),
        }
    }

    /// Bytes held.
    pub(crate) fn weight(&self) -> usize {
        match self {
            Rows::Each(rows) => rows.len() * std::mem::size_of::<(usize, usize)>(),
            Rows::Runs(runs) => runs.len() * std::mem::size_of::<Run>(),
        }
    }

    /// Tensors `wanted` (placed as `placement` says) of these rows of row groups `from`, each
    /// onto the end of its buffer in `outs`.
    pub(crate) fn gather(
        &self,
        placement: &Placement,
        from: &[&Columns],
        wanted: &[usize],
        outs: &mut [Vec<u8>],
    ) {
        let mut interleaved = Vec::new();
        for (&t, out) in wanted.iter().zip(outs) {
            match (placement.place(t), self) {
                (Place::Interleaved { at, width }, _) => interleaved.push(Slot { at, width, out }),
                (Place::Column { part, width }, Rows::Each(rows)) => {
                    gather_column(part, width, from, rows, out)
                }
                (Place::Column { part, width }, Rows::Runs(runs)) => {
                    gather_runs(part, width, from, runs, out)
                }
            }
        }
        if interleaved.is_empty() {
            return;
        }
        match self {
            Rows::Each(rows) => gather_interleaved(placement.stride, from, rows, &mut interleaved),
            Rows::Runs(runs) => {
                gather_interleaved_runs(placement.stride, from, runs, &mut interleaved)
            }
        }
    }
}

/// How many rows ahead of the one copied a gather asks the memory for: a shuffled batch's rows
/// lie scattered over row groups far larger than the CPU's caches, and asking ahead lets their
/// loads overlap instead of waiting for each in turn (1.3x in a tight loop on the bench's rows).
const GATHER_AHEAD: usize = 16;

/// Gathers the rows (`width` bytes each) of part `part` onto the end of `out`: row k is row
/// `rows[k].1` of the row group `from[rows[k].0]`.
fn gather_column(
    part: usize,
    width: usize,
    from: &[&Columns],
    rows: &[(usize, usize)],
    out: &mut Vec<u8>,
) {
    let columns: Vec<&[u8]> = from.iter().map(|c| c.part(part)).collect();
    // Filled row by row, never zeroed first; rows of a scalar's width are copied as a value of
    // that width, not by a call to memcpy per row (most of a gather of 4-byte rows).
    out.reserve(rows.len() * width);
    match width {
        0 => {}
        1 => gather_fixed::<1>(&columns, rows, out),
        2 => gather_fixed::<2>(&columns, rows, out),
        4 => gather_fixed::<4>(&columns, rows, out),
        8 => gather_fixed::<8>(&columns, rows, out),
        16 => gather_fixed::<16>(&columns, rows, out),
        _ => {
            for (i, &(k, r)) in rows.iter().enumerate() {
                if let Some(&(k_ahead, r_ahead)) = rows.get(i + GATHER_AHEAD) {
                    ask_for(&columns[k_ahead][r_ahead * width..(r_ahead + 1) * width]);
                }
                out.extend_from_slice(&columns[k][r * width..(r + 1) * width]);
            }
        }
    }
}

/// Rows `start..start + len` of the row group at index `k` of a batch's row groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) k: usize,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// `rows` as runs of consecutive rows of one row group, where they average at least
/// [`MIN_RUN`] rows; else `None`.
fn runs_of(rows: &[(usize, usize)]) -> Option<Vec<Run>> {
    let mut runs: Vec<Run> = Vec::new();
    for &(k, r) in rows {
        match runs.last_mut() {
            Some(run) if run.k == k && run.start + run.len == r => run.len += 1,
            _ => {
                if (runs.len() + 1) * MIN_RUN > rows.len() {
                    return None;
                }
                runs.push(Run {
                    k,
                    start: r,
                    len: 1,
                });
            }
        }
    }
    Some(runs)
}

/// The average run length below which [`gather_column`]'s copy of row by row is kept.
const MIN_RUN: usize = 16;

/// As [`gather_column`], rows given as runs ([`runs_of`]): a copy per run.
fn gather_runs(part: usize, width: usize, from: &[&Columns], runs: &[Run], out: &mut Vec<u8>) {
    out.reserve(runs.iter().map(|r| r.len).sum::<usize>() * width);
    for run in runs {
        let column = from[run.k].part(part);
        out.extend_from_slice(&column[run.start * width..(run.start + run.len) * width]);
    }
}

/// [`gather_column`] for rows of `N` bytes.
fn gather_fixed<const N: usize>(columns: &[&[u8]], rows: &[(usize, usize)], out: &mut Vec<u8>) {
    for (i, &(k, r)) in rows.iter().enumerate() {
        if let Some(&(k_ahead, r_ahead)) = rows.get(i + GATHER_AHEAD) {
            ask_for(&columns[k_ahead][r_ahead * N..(r_ahead + 1) * N]);
        }
        let row: &[u8; N] = (columns[k][r * N..(r + 1) * N].try_into()).expect("N bytes");
        out.extend_from_slice(row);
    }
}

/// An interleaved tensor being gathered: its bytes of a row, and its buffer.
struct Slot<'a> {
    at: usize,
    width: usize,
    out: &'a mut Vec<u8>,
}

/// The interleaved tensors `slots` of the rows `rows` (as in [`gather_column`]), from the
/// interleaved parts (`stride` bytes a row) of row groups `from`: each row's bytes read once
/// for all of them. The rows are copied whole into a stage of [`STAGE_ROWS`], which is then
/// split a tensor at a time: handing each row's bytes to every tensor as the row comes took
/// twice as long (a loop over the tensors, and a buffer's length kept per tensor, for every
/// row).
fn gather_interleaved(
    stride: usize,
    from: &[&Columns],
    rows: &[(usize, usize)],
    slots: &mut [Slot],
) {
    let interleaved: Vec<&[u8]> = from.iter().map(|c| c.part(0)).collect();
    for s in slots.iter_mut() {
        s.out.reserve(rows.len() * s.width);
    }
    let mut stage = Vec::with_capacity(STAGE_ROWS.min(rows.len()) * stride);
    for (c, chunk) in rows.chunks(STAGE_ROWS).enumerate() {
        stage.clear();
        for (i, &(k, r)) in chunk.iter().enumerate() {
            if let Some(&(k_ahead, r_ahead)) = rows.get(c * STAGE_ROWS + i + GATHER_AHEAD) {
                let row = &interleaved[k_ahead][r_ahead * stride..(r_ahead + 1) * stride];
                // Its first and last line: a row may straddle two.
                ask_for(&row[..1]);
                ask_for(&row[stride - 1..]);
            }
            stage.extend_from_slice(&interleaved[k][r * stride..(r + 1) * stride]);
        }
        for s in slots.iter_mut() {
            deinterleave(&stage, stride, s);
        }
    }
}

/// Rows a shuffled gather of interleaved tensors stages at a time: 14 KB at the bench's
/// 56-byte rows, well within the CPU's first caches.
const STAGE_ROWS: usize = 256;

/// As [`gather_interleaved`], rows given as runs: each run's rows lie together as a stage's
/// do, and are split where they lie.
fn gather_interleaved_runs(stride: usize, from: &[&Columns], runs: &[Run], slots: &mut [Slot]) {
    let rows: usize = runs.iter().map(|r| r.len).sum();
    for s in slots.iter_mut() {
        s.out.reserve(rows * s.width);
    }
    for run in runs {
        let part = &from[run.k].part(0)[run.start * stride..(run.start + run.len) * stride];
        for s in slots.iter_mut() {
            deinterleave(part, stride, s);
        }
    }
}

/// Appends slot `s`'s bytes of each of the interleaved `rows` (`stride` bytes each) to its
/// buffer; a scalar's width copied as a value of that width, not by a call to memcpy.
fn deinterleave(rows: &[u8], stride: usize, s: &mut Slot) {
    match s.width {
        1 => deinterleave_fixed::<1>(rows, stride, s.at, s.out),
        2 => deinterleave_fixed::<2>(rows, stride, s.at, s.out),
        4 => deinterleave_fixed::<4>(rows, stride, s.at, s.out),
        8 => deinterleave_fixed::<8>(rows, stride, s.at, s.out),
        16 => deinterleave_fixed::<16>(rows, stride, s.at, s.out),
        w => {
            for row in rows.chunks_exact(stride) {
                s.out.extend_from_slice(&row[s.at..s.at + w]);
            }
        }
    }
}

/// [`deinterleave`] of a tensor of `N` bytes a row, at `at` of each row.
fn deinterleave_fixed<const N: usize>(rows: &[u8], stride: usize, at: usize, out: &mut Vec<u8>) {
    let start = out.len();
    // Zeroed then written: a few kilobytes in the first caches, where an unsafe length set
    // before writing would save next to nothing.
    out.resize(start + rows.len() / stride * N, 0);
    for (value, row) in out[start..]
        .chunks_exact_mut(N)
        .zip(rows.chunks_exact(stride))
    {
        let from: &[u8; N] = row[at..at + N].try_into().expect("N bytes");
        value.copy_from_slice(from);
    }
}

/// Asks the CPU to bring `bytes` (their first 512) into its caches, without waiting for them.
#[inline(always)]
fn ask_for(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64).take(8) {
        // SAFETY: a prefetch hint reads nothing and cannot fault; the address is in `bytes`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathered(t: usize, rb: usize, from: &[&Columns], rows: &[(usize, usize)]) -> Vec<u8> {
        let mut out = vec![0xee; 3];
        gather_column(t, rb, from, rows, &mut out);
        assert_eq!(out[..3], [0xee; 3], "the bytes before are kept");
        out.split_off(3)
    }

    #[test]
    fn a_gather_takes_each_row_from_its_row_group_in_batch_order() {
        // Two row groups of two tensors: 8 bytes a row (the row's number, by row group) and
        // 200 bytes a row (longer than the lines a gather asks for ahead).
        let group = |base: u64, rows: u64| {
            let narrow = (0..rows).flat_map(|r| (base + r).to_le_bytes()).collect();
            let wide = (0..rows)
                .flat_map(|r| std::iter::repeat_n((base + r) as u8, 200))
                .collect();
            Columns::owned(vec![narrow, wide])
        };
        let (a, b) = (group(0, 40), group(100, 30));
        let rows: Vec<(usize, usize)> = (0..50).map(|i| (i % 2, (i * 7) % 30)).collect();
        let want: Vec<u64> = rows
            .iter()
            .map(|&(k, r)| 100 * k as u64 + r as u64)
            .collect();
        let narrow = gathered(0, 8, &[&a, &b], &rows);
        let got: Vec<u64> = narrow
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, want);
        let wide = gathered(1, 200, &[&a, &b], &rows);
        assert_eq!(wide.len(), 50 * 200);
        for (row, &w) in wide.chunks(200).zip(&want) {
            assert!(row.iter().all(|&x| x == w as u8));
        }
        assert!(gathered(0, 0, &[&a, &b], &rows).is_empty());
    }

    #[test]
    fn a_gather_of_every_row_width_copies_whole_rows() {
        // The widths copied as values (1, 2, 4, 8, 16) and by slices (3, 12, 24).
        for rb in [1usize, 2, 3, 4, 8, 12, 16, 24] {
            let group = |salt: u8, rows: usize| {
                let bytes = (0..rows * rb)
                    .map(|i| (i as u8).wrapping_mul(31) ^ salt)
                    .collect();
                Columns::owned(vec![bytes])
            };
            let (a, b) = (group(0x55, 37), group(0xaa, 21));
            let rows: Vec<(usize, usize)> = (0..60).map(|i| (i % 2, (i * 11) % 21)).collect();
            let want: Vec<u8> = (rows.iter())
                .flat_map(|&(k, r)| [&a, &b][k].part(0)[r * rb..(r + 1) * rb].to_vec())
                .collect();
            assert_eq!(gathered(0, rb, &[&a, &b], &rows), want, "{rb} bytes a row");
        }
    }

    #[test]
    fn runs_gather_what_rows_gather_and_only_long_runs_are_kept() {
        let group = |salt: u8, rows: usize| {
            let bytes = (0..rows * 12).map(|i| (i as u8) ^ salt).collect();
            Columns::owned(vec![bytes])
        };
        let (a, b) = (group(0x55, 600), group(0xaa, 500));
        // An unshuffled batch across two row groups: two runs.
        let rows: Vec<(usize, usize)> = (500..600)
            .map(|r| (0, r))
            .chain((0..400).map(|r| (1, r)))
            .collect();
        let runs = runs_of(&rows).expect("runs");
        assert_eq!(
            runs,
            [
                Run {
                    k: 0,
                    start: 500,
                    len: 100
                },
                Run {
                    k: 1,
                    start: 0,
                    len: 400
                }
            ]
        );
        let mut out = vec![0xee; 3];
        gather_runs(0, 12, &[&a, &b], &runs, &mut out);
        assert_eq!(out.split_off(3), gathered(0, 12, &[&a, &b], &rows));
        // Shuffled rows make runs of one row: gathered row by row.
        let shuffled: Vec<(usize, usize)> = (0..500).map(|i| (i % 2, (i * 7) % 500)).collect();
        assert_eq!(runs_of(&shuffled), None);
        assert_eq!(runs_of(&[]), Some(vec![]));
    }

    #[test]
    fn narrow_tensors_are_interleaved_where_two_or_more_are() {
        use Place::*;
        let p = Placement::of(&[8, 256, 4, 1, 0, 16, 24], true);
        assert_eq!(
            p.places,
            [
                Interleaved { at: 0, width: 8 },
                Column {
                    part: 1,
                    width: 256
                },
                Interleaved { at: 8, width: 4 },
                Interleaved { at: 12, width: 1 },
                Column { part: 2, width: 0 },
                Interleaved { at: 13, width: 16 },
                Column { part: 3, width: 24 },
            ]
        );
        assert_eq!((p.stride, p.parts()), (29, 4));
        // One narrow tensor alone keeps its column, as every tensor does where the mount does
        // not interleave.
        let one = Placement::of(&[4, 64], true);
        let apart = Placement::of(&[8, 4], false);
        for p in [&one, &apart] {
            assert_eq!(p.stride, 0);
            assert_eq!(p.parts(), 2);
            assert!(matches!(
                p.places[..],
                [Column { part: 0, .. }, Column { part: 1, .. }]
            ));
        }
        // Interleaved under any shuffle; unshuffled only where a transform's output is kept.
        assert!(interleaves(Shuffle::Block, false) && interleaves(Shuffle::Window, false));
        assert!(interleaves(Shuffle::None, true) && !interleaves(Shuffle::None, false));
    }

    #[test]
    fn a_gather_from_parts_gives_each_tensor_its_rows_as_from_columns() {
        // Tensors of every kind of place, row groups of different sizes, rows shuffled and in
        // runs, every tensor or a few in another order: each tensor's rows as a gather from a
        // column of its own would give them.
        let widths = [
            vec![8, 4, 1, 300, 2, 16, 3, 12],
            vec![4, 4],
            vec![24, 8],
            vec![17],
        ];
        for (widths, interleave) in widths.iter().flat_map(|w| [(w, true), (w, false)]) {
            let placement = Placement::of(widths, interleave);
            let sizes = [37usize, 600, 5];
            let tensors: Vec<Vec<Vec<u8>>> = (sizes.iter().enumerate())
                .map(|(g, &rows)| {
                    (widths.iter().enumerate())
                        .map(|(t, &w)| {
                            (0..rows * w)
                                .map(|i| (i * 31 + t * 7 + g * 101) as u8)
                                .collect()
                        })
                        .collect()
                })
                .collect();
            let columns: Vec<Columns> = (tensors.iter().zip(sizes))
                .map(|(t, rows)| {
                    // Every other tensor as Arrow would hold it (a transform's output).
                    let columns = (t.iter().enumerate())
                        .map(|(i, v)| match i % 2 {
                            0 => TensorColumn::Own(v.clone()),
                            _ => TensorColumn::Arrow(arrow::buffer::Buffer::from_vec(v.clone())),
                        })
                        .collect();
                    Columns::owned(placement.parts_of(columns, rows))
                })
                .collect();
            let from: Vec<&Columns> = columns.iter().collect();
            // More rows than a stage holds, twice over and a part.
            let shuffled: Vec<(usize, usize)> = (0..2 * STAGE_ROWS + 100)
                .map(|i| (i % 3, (i * 7919) % sizes[i % 3]))
                .collect();
            let unshuffled: Vec<(usize, usize)> = (500..600)
                .map(|r| (1, r))
                .chain((0..37).map(|r| (0, r)))
                .collect();
            let all: Vec<usize> = (0..widths.len()).collect();
            let few: Vec<usize> = all.iter().rev().step_by(2).copied().collect();
            for (rows, runs) in [(shuffled, false), (unshuffled, true)] {
                let picked = Rows::of(rows.clone());
                assert_eq!(matches!(picked, Rows::Runs(_)), runs);
                for wanted in [&all, &few] {
                    let mut outs = vec![vec![0xee]; wanted.len()];
                    picked.gather(&placement, &from, wanted, &mut outs);
                    for (&t, out) in wanted.iter().zip(&outs) {
                        let w = widths[t];
                        let want: Vec<u8> = (rows.iter())
                            .flat_map(|&(k, r)| tensors[k][t][r * w..(r + 1) * w].to_vec())
                            .collect();
                        assert_eq!(out[0], 0xee, "the bytes before are kept");
                        assert_eq!(out[1..], want, "tensor {t} of widths {widths:?}");
                    }
                }
            }
        }
    }
}
