//! The cells Petastorm's codecs wrote: `NdarrayCodec` one `.npy` file,
//! `CompressedNdarrayCodec` a zip holding `arr.npy`, `CompressedImageCodec` a PNG or JPEG
//! (decoded by the system libjpeg-turbo, the decoder OpenCV uses, so pixels are equal).

use crate::model::dtype::DType;
use crate::source::petastorm::{Codec, Field};
use anyhow::{Context, Result, anyhow, bail};

/// A decoded cell: its dtype, shape and little-endian C-order bytes.
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<u8>,
}

/// A `.npy` file's array.
pub(crate) fn decode_npy(b: &[u8]) -> Result<Cell> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        bail!("not a .npy cell");
    }
    let (header_len, at) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes(b[8..12].try_into()?) as usize, 12),
        v => bail!(".npy version {v} is not read"),
    };
    let header = std::str::from_utf8(
        b.get(at..at + header_len)
            .ok_or_else(|| anyhow!("a .npy header runs past the cell"))?,
    )?;
    let descr = quoted_after(header, "'descr'").ok_or_else(|| anyhow!("no descr in a .npy"))?;
    let fortran = header
        .split("'fortran_order'")
        .nth(1)
        .is_some_and(|s| s.trim_start_matches([':', ' ']).starts_with("True"));
    let shape_text = header
        .split("'shape'")
        .nth(1)
        .and_then(|s| s.split_once('(').map(|(_, r)| r))
        .and_then(|s| s.split_once(')').map(|(l, _)| l))
        .ok_or_else(|| anyhow!("no shape in a .npy"))?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<_, _>>()?;
    // The byte order, then the kind: a descr too short (or not ASCII) for that is no dtype.
    let Some((order, kind)) = descr.split_at_checked(1) else {
        bail!("a .npy of dtype '{descr}', which has no tensor mapping");
    };
    let dtype = match kind {
        "b1" => DType::Bool,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        _ => bail!("a .npy of dtype '{descr}', which has no tensor mapping"),
    };
    let size = dtype.size();
    // Sizes from the header are checked: a header claiming more elements than a usize holds
    // is a short cell, never a wrapped length.
    let end = (shape.iter())
        .try_fold(size, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_add(at + header_len));
    let Some(end) = end else {
        bail!("a .npy cell's shape {shape:?} is too large");
    };
    let data = b
        .get(at + header_len..end)
        .ok_or_else(|| anyhow!("a .npy cell is shorter than its shape"))?;
    let mut data = data.to_vec();
    if order == ">" && size > 1 {
        for e in data.chunks_exact_mut(size) {
            e.reverse();
        }
    }
    if fortran && shape.len() > 1 {
        data = fortran_to_c(&data, &shape, size);
    }
    Ok(Cell { dtype, shape, data })
}

fn quoted_after<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let rest = header.split(key).nth(1)?;
    let rest = rest.split_once('\'')?.1;
    Some(rest.split_once('\'')?.0)
}

/// Reorders column-major elements into row-major order.
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let mut out = vec![0; data.len()];
    let mut idx = vec![0usize; shape.len()];
    for c in 0..n {
        // idx: the C-order multi-index of element c; its Fortran offset is sum idx[k] * stride_f[k].
        let mut f = 0;
        let mut stride = 1;
        for (k, &d) in shape.iter().enumerate() {
            f += idx[k] * stride;
            stride *= d;
        }
        out[c * size..(c + 1) * size].copy_from_slice(&data[f * size..(f + 1) * size]);
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

/// An `.npz` cell's `arr` member (or its only member).
pub(crate) fn decode_npz(b: &[u8]) -> Result<Cell> {
    use std::io::Read;
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(b)).context("not a zip cell")?;
    let index = zip.index_for_name("arr.npy").unwrap_or(0);
    let mut member = zip.by_index(index).context("the zip cell has no member")?;
    let mut npy = Vec::with_capacity(member.size() as usize);
    member.read_to_end(&mut npy)?;
    decode_npy(&npy)
}

/// A PNG cell: 8-bit gray `[H, W]` or RGB `[H, W, 3]` (RGBA `[H, W, 4]`), as OpenCV's
/// `IMREAD_UNCHANGED` and Petastorm's channel swap give it.
pub(crate) fn decode_png(b: &[u8]) -> Result<Cell> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(b));
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().context("not a PNG cell")?;
    let mut buf = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let info = reader
        .next_frame(&mut buf)
        .context("a PNG cell cannot be decoded")?;
    buf.truncate(info.buffer_size());
    let (h, w) = (info.height as usize, info.width as usize);
    let (channels, dtype) = match (info.color_type, info.bit_depth) {
        (png::ColorType::Grayscale, png::BitDepth::Eight) => (1, DType::U8),
        (png::ColorType::Rgb, png::BitDepth::Eight) => (3, DType::U8),
        (png::ColorType::Rgba, png::BitDepth::Eight) => (4, DType::U8),
        (png::ColorType::Grayscale, png::BitDepth::Sixteen) => (1, DType::U16),
        (png::ColorType::Rgb, png::BitDepth::Sixteen) => (3, DType::U16),
        (c, d) => bail!("a PNG cell of {c:?} at {d:?} bits, which has no tensor mapping"),
    };
    if dtype == DType::U16 {
        // PNG stores samples big-endian; tensors are little-endian.
        for e in buf.chunks_exact_mut(2) {
            e.swap(0, 1);
        }
    }
    let shape = if channels == 1 {
        vec![h, w]
    } else {
        vec![h, w, channels]
    };
    Ok(Cell {
        dtype,
        shape,
        data: buf,
    })
}

/// A JPEG cell, decoded by libjpeg-turbo's decoder (as MozJPEG carries it, built from source
/// by its crate): gray `[H, W]` or RGB `[H, W, 3]`, with libjpeg's defaults (the accurate
/// integer IDCT, fancy upsampling), as OpenCV decodes for Petastorm. A malformed cell is an
/// error: libjpeg's fatal errors unwind out of the decoder and are caught here.
pub(crate) fn decode_jpeg(b: &[u8]) -> Result<Cell> {
    let decode = || -> std::io::Result<Cell> {
        let d = mozjpeg::Decompress::new_mem(b)?;
        let gray = d.color_space() == mozjpeg::ColorSpace::JCS_GRAYSCALE;
        let mut image = match gray {
            true => d.grayscale()?,
            false => d.rgb()?,
        };
        let (h, w, channels) = (image.height(), image.width(), if gray { 1 } else { 3 });
        let data = image.read_scanlines::<u8>()?;
        image.finish()?;
        if data.len() != h * w * channels {
            return Err(std::io::Error::other(format!(
                "{} of its {} bytes of pixels decoded",
                data.len(),
                h * w * channels
            )));
        }
        let shape = match channels {
            1 => vec![h, w],
            _ => vec![h, w, channels],
        };
        Ok(Cell {
            dtype: DType::U8,
            shape,
            data,
        })
    };
    match crate::catch_panic(decode) {
        Ok(Ok(cell)) => Ok(cell),
        Ok(Err(e)) => Err(anyhow!("a JPEG cell cannot be decoded: {e}")),
        Err(why) => Err(anyhow!("a JPEG cell cannot be decoded: {why}")),
    }
}

/// Decodes a cell of `field` into its tensor's row bytes, checking it against the Unischema.
pub(crate) fn decode_cell(field: &Field, codec: Codec, cell: &[u8]) -> Result<Vec<u8>> {
    let decoded = match codec {
        Codec::Ndarray => decode_npy(cell)?,
        Codec::CompressedNdarray => decode_npz(cell)?,
        Codec::Png => decode_png(cell)?,
        Codec::Jpeg => decode_jpeg(cell)?,
        Codec::Scalar => bail!("a scalar field has no cells"),
    };
    let want_shape = field.fixed_shape().unwrap_or_default();
    if Some(decoded.dtype) != field.dtype || decoded.shape != want_shape {
        let dims: Vec<String> = decoded.shape.iter().map(|d| d.to_string()).collect();
        bail!(
            "the cell is {} ({}) where the Unischema says {} {}",
            decoded.dtype.name(),
            dims.join(", "),
            field.numpy,
            field.shape_text()
        );
    }
    Ok(decoded.data)
}
