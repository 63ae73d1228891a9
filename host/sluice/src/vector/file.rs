//! Reading and writing float32 vector sets. `.fvecs` (the TEXMEX format: each vector is a
//! little-endian i32 dimension followed by that many f32s) and `.npy` (NumPy's format: a 2-D
//! C-order array of `<f4`, or `<f8` converted to f32). A vector's id is its row number.

use std::io::Write;
use std::path::Path;

/// The largest file read, so a wrong path cannot exhaust memory.
const MAX_FILE_BYTES: u64 = 8 << 30;
const MAX_DIMENSIONS: usize = sluice_model::VECTOR_MAX_DIMENSIONS;

#[derive(Debug, thiserror::Error)]
pub enum VectorFileError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Format { path: String, reason: String },
}

/// Rows of `dim` numbers, row after row.
#[derive(Clone, Debug, PartialEq)]
pub struct Vectors {
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Vectors {
    pub fn len(&self) -> usize {
        self.data.len() / self.dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn row(&self, index: usize) -> &[f32] {
        &self.data[index * self.dim..(index + 1) * self.dim]
    }
}

/// Reads `path` by its extension: `.fvecs` or `.npy`.
pub fn read_vectors(path: &Path) -> Result<Vectors, VectorFileError> {
    let name = path.display().to_string();
    let format = |reason: String| VectorFileError::Format {
        path: name.clone(),
        reason,
    };
    let size = std::fs::metadata(path)
        .map_err(|source| VectorFileError::Io {
            path: name.clone(),
            source,
        })?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(format(format!("{size} bytes; at most {MAX_FILE_BYTES}")));
    }
    let bytes = std::fs::read(path).map_err(|source| VectorFileError::Io {
        path: name.clone(),
        source,
    })?;
    let vectors = match path.extension().and_then(|e| e.to_str()) {
        Some("fvecs") => parse_fvecs(&bytes),
        Some("npy") => parse_npy(&bytes),
        _ => Err("the file name must end in .fvecs or .npy".to_owned()),
    }
    .map_err(format)?;
    if vectors.data.iter().any(|x| !x.is_finite()) {
        return Err(format("holds a NaN or infinite number".into()));
    }
    Ok(vectors)
}

fn parse_fvecs(bytes: &[u8]) -> Result<Vectors, String> {
    let Some(head) = bytes.get(..4) else {
        return Err("empty file".into());
    };
    let dim = i32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let dim = usize::try_from(dim)
        .ok()
        .filter(|d| (1..=MAX_DIMENSIONS).contains(d))
        .ok_or_else(|| format!("dimension {dim} is not 1 to {MAX_DIMENSIONS}"))?;
    let row_bytes = 4 + 4 * dim;
    if bytes.len() % row_bytes != 0 {
        return Err(format!(
            "{} bytes is not a whole number of {dim}-dimensional rows",
            bytes.len()
        ));
    }
    let mut data = Vec::with_capacity(bytes.len() / row_bytes * dim);
    for (number, row) in bytes.chunks_exact(row_bytes).enumerate() {
        if row[..4] != head[..] {
            return Err(format!("row {number} has another dimension"));
        }
        data.extend(
            row[4..]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    Ok(Vectors { dim, data })
}

fn parse_npy(bytes: &[u8]) -> Result<Vectors, String> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (bad magic)".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        version => return Err(format!("unsupported .npy version {version}")),
    };
    let header = bytes
        .get(start..start + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or("truncated or non-text header")?;
    let descr = header_value(header, "descr").ok_or("the header has no descr")?;
    let dtype = descr
        .strip_prefix('\'')
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or(descr);
    let width = match dtype {
        "<f4" => 4,
        "<f8" => 8,
        other => return Err(format!("dtype {other}; only <f4 and <f8 are read")),
    };
    if header_value(header, "fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err("Fortran-order arrays are not read; save in C order".into());
    }
    let shape = header_value(header, "shape").ok_or("the header has no shape")?;
    let dims: Vec<usize> = shape
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape {shape}")))
        .collect::<Result<_, _>>()?;
    let [rows, dim] = dims[..] else {
        return Err(format!("shape {shape} is not 2-D"));
    };
    if !(1..=MAX_DIMENSIONS).contains(&dim) {
        return Err(format!("dimension {dim} is not 1 to {MAX_DIMENSIONS}"));
    }
    let body = &bytes[start + header_len..];
    let expected = rows
        .checked_mul(dim)
        .and_then(|n| n.checked_mul(width))
        .ok_or("shape too large")?;
    if body.len() != expected {
        return Err(format!(
            "{} data bytes; shape {shape} needs {expected}",
            body.len()
        ));
    }
    let data = if width == 4 {
        body.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    } else {
        body.chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect()
    };
    Ok(Vectors { dim, data })
}

/// The text after `'key':` in a .npy header dict, to the end of the header.
fn header_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))?;
    let rest = header[at + key.len() + 2..]
        .trim_start()
        .strip_prefix(':')?;
    Some(rest.trim_start())
}

pub fn write_fvecs(path: &Path, vectors: &Vectors) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let dim = vectors.dim as i32;
    for row in vectors.data.chunks_exact(vectors.dim.max(1)) {
        out.write_all(&dim.to_le_bytes())?;
        for x in row {
            out.write_all(&x.to_le_bytes())?;
        }
    }
    out.flush()
}

pub fn write_npy(path: &Path, vectors: &Vectors) -> std::io::Result<()> {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        vectors.len(),
        vectors.dim
    );
    // The header (with magic and length) pads to a multiple of 64 and ends in a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    out.write_all(b"\x93NUMPY\x01\x00")?;
    out.write_all(&(header.len() as u16).to_le_bytes())?;
    out.write_all(header.as_bytes())?;
    for x in &vectors.data {
        out.write_all(&x.to_le_bytes())?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_round_trip_and_bad_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let vectors = Vectors {
            dim: 3,
            data: vec![1.0, 2.0, 3.0, -4.0, 5.5, 6.25],
        };
        for name in ["v.fvecs", "v.npy"] {
            let path = dir.path().join(name);
            if name.ends_with("fvecs") {
                write_fvecs(&path, &vectors).unwrap();
            } else {
                write_npy(&path, &vectors).unwrap();
            }
            assert_eq!(read_vectors(&path).unwrap(), vectors, "{name}");
        }
        let truncated = dir.path().join("t.fvecs");
        let bytes = std::fs::read(dir.path().join("v.fvecs")).unwrap();
        std::fs::write(&truncated, &bytes[..bytes.len() - 2]).unwrap();
        assert!(read_vectors(&truncated).is_err());
        let text = dir.path().join("t.npy");
        std::fs::write(&text, b"not numpy").unwrap();
        assert!(read_vectors(&text).is_err());
        assert!(read_vectors(&dir.path().join("v.csv")).is_err());
        assert!(read_vectors(&dir.path().join("missing.npy")).is_err());
    }
}
