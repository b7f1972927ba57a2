//! `.npy` files (NumPy's format, version 1.0 and 2.0): ground-truth gradients and outputs go out
//! as `.npy` so that NumPy and PyTorch users can compare in their own harness, and inputs can come
//! in from them. Little-endian C-order arrays of bool, int32, int64, float16, float32 and float64.

use std::io::Write;
use std::path::Path;
use tilegrad_ir::DType;
use tilegrad_reference::{Data, HostTensor};

/// Why a `.npy` file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// An I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not an array tilegrad reads.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Writes `t` as a `.npy` file in its own dtype (bf16, which NumPy lacks, as float32).
pub fn write(path: &Path, t: &HostTensor) -> Result<(), NpyError> {
    let descr = match (t.dtype(), t.data()) {
        (DType::I1, Data::I1(_)) => "|b1",
        (DType::I32, Data::I32(_)) => "<i4",
        (DType::I64, Data::I64(_)) => "<i8",
        (DType::F16, Data::F32(_)) => "<f2",
        (_, Data::F32(_)) => "<f4",
        (_, Data::F64(_)) => "<f8",
        (d, _) => return Err(NpyError::Format { path: path.display().to_string(), message: format!("cannot write {d}") }),
    };
    let shape: Vec<String> = t.shape().iter().map(|s| s.to_string()).collect();
    let shape = if shape.len() == 1 { format!("({},)", shape[0]) } else { format!("({})", shape.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Version 1.0 has a 16-bit header length; a longer header (a shape of very high rank) needs 2.0.
    let v2 = header.len() + 64 > usize::from(u16::MAX);
    let prefix = MAGIC.len() + if v2 { 6 } else { 4 };
    // Pad so that the data starts on a 64-byte boundary, ending the header with a newline.
    while (prefix + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut head = Vec::with_capacity(prefix + header.len());
    head.extend_from_slice(MAGIC);
    if v2 {
        let len = u32::try_from(header.len()).map_err(|_| NpyError::Format {
            path: path.display().to_string(),
            message: "the shape is too long for a .npy header".into(),
        })?;
        head.extend_from_slice(&[2, 0]);
        head.extend_from_slice(&len.to_le_bytes());
    } else {
        head.extend_from_slice(&[1, 0]);
        head.extend_from_slice(&(header.len() as u16).to_le_bytes());
    }
    head.extend_from_slice(header.as_bytes());
    let io = |source| NpyError::Io { path: path.display().to_string(), source };
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&head).map_err(io)?;
    // The body in chunks of a few hundred KiB, converted to little-endian bytes as it goes (no
    // copy of the whole tensor).
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 19);
    macro_rules! body {
        ($v:expr, $bytes:expr) => {
            for chunk in $v.chunks(1 << 16) {
                buf.clear();
                for x in chunk {
                    buf.extend_from_slice(&$bytes(x));
                }
                f.write_all(&buf).map_err(io)?;
            }
        };
    }
    match (t.dtype(), t.data()) {
        (_, Data::I1(v)) => body!(v, |b: &bool| [*b as u8]),
        (_, Data::I32(v)) => body!(v, |x: &i32| x.to_le_bytes()),
        (_, Data::I64(v)) => body!(v, |x: &i64| x.to_le_bytes()),
        (DType::F16, Data::F32(v)) => body!(v, |x: &f32| half::f16::from_f32(*x).to_le_bytes()),
        (_, Data::F32(v)) => body!(v, |x: &f32| x.to_le_bytes()),
        (_, Data::F64(v)) => body!(v, |x: &f64| x.to_le_bytes()),
    }
    Ok(())
}

/// Reads a `.npy` file.
pub fn read(path: &Path) -> Result<HostTensor, NpyError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io { path: p.clone(), source })?;
    parse(&bytes).map_err(|message| NpyError::Format { path: p, message })
}

/// Parses the bytes of a `.npy` file.
pub fn parse(bytes: &[u8]) -> Result<HostTensor, String> {
    if !bytes.starts_with(MAGIC) || bytes.len() < 10 {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes.get(start..start + hlen).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    let field = |key: &str| -> Result<&str, String> {
        let quoted = format!("'{key}'");
        let i = header.find(&quoted).ok_or(format!("header has no '{key}'"))?;
        // numpy reads a header as a Python dict, where the last of a repeated key wins.
        if header.matches(&quoted).count() > 1 {
            return Err(format!("header repeats '{key}' (numpy would read the last, this reader the first)"));
        }
        let rest = header[i + key.len() + 2..].trim_start().strip_prefix(':').ok_or("malformed header")?;
        Ok(rest.trim_start())
    };
    let descr = field("descr")?;
    let descr = descr.get(1..).and_then(|d| d.split(['\'', '"']).next()).ok_or("malformed descr")?;
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran-order arrays are not supported (save with np.ascontiguousarray)".into());
    }
    let sh = field("shape")?;
    let sh = sh.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or("malformed shape")?;
    let shape: Vec<usize> = sh
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad dimension `{s}`")))
        .collect::<Result<_, _>>()?;
    let n = tilegrad_reference::checked_numel(&shape)?;
    let body = &bytes[start + hlen..];
    let need = |size: usize| -> Result<&[u8], String> {
        let bytes = n.checked_mul(size).ok_or_else(|| format!("shape {shape:?} of {descr} needs more bytes than fit 64 bits"))?;
        body.get(..bytes).ok_or_else(|| format!("{} data bytes for {n} elements of {descr}, need {bytes}", body.len()))
    };
    let (dtype, data) = match descr {
        "|b1" | "<b1" => (DType::I1, Data::I1(need(1)?.iter().map(|&b| b != 0).collect())),
        "|u1" => {
            return Err("unsupported dtype `|u1` (uint8): tilegrad has no 8-bit integers (read as bool it would lose every value \
                        above 1); save it as bool or int32 (`a.astype(numpy.int32)`)"
                .into())
        }
        "<i4" => (DType::I32, Data::I32(need(4)?.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())),
        "<i8" => (DType::I64, Data::I64(need(8)?.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect())),
        "<f2" => (DType::F16, Data::F32(need(2)?.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect())),
        "<f4" => (DType::F32, Data::F32(need(4)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())),
        "<f8" => (DType::F64, Data::F64(need(8)?.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect())),
        d => return Err(format!("unsupported dtype `{d}` (bool, <i4, <i8, <f2, <f4, <f8 are)")),
    };
    HostTensor::new(dtype, &shape, data).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        let dir = std::env::temp_dir().join(format!("tilegrad-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            HostTensor::from_f32(&[2, 3], vec![1.5, -2.0, 3.25, 0.0, 1e-7, -4.0]),
            HostTensor::from_f64(&[5], vec![0.1, 0.2, -0.3, 1e300, -1e-300]),
            HostTensor::from_i32(&[3, 1], vec![-1, 7, i32::MAX]),
            HostTensor::from_i64(&[2], vec![i64::MIN, 42]),
            HostTensor::from_f64_as(DType::F16, &[3], &[0.5, -1.25, 3.0]),
            HostTensor::from_f64_as(DType::I1, &[4], &[1.0, 0.0, 0.0, 1.0]),
        ];
        for (i, t) in cases.iter().enumerate() {
            let p = dir.join(format!("{i}.npy"));
            write(&p, t).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + hlen) % 64, 0, "data aligned");
            assert_eq!(&read(&p).unwrap(), t, "case {i}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_what_numpy_writes_and_rejects_garbage() {
        // np.save of np.arange(3, dtype='<f4').reshape(1, 3), header as NumPy pads it.
        let mut b = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }".to_vec();
        b.resize(10 + 0x76 - 1, b' ');
        b.push(b'\n');
        for x in [0.0f32, 1.0, 2.0] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(parse(&b).unwrap(), HostTensor::from_f32(&[1, 3], vec![0.0, 1.0, 2.0]));
        assert!(parse(&b[..b.len() - 1]).unwrap_err().contains("data bytes"));
        assert!(parse(b"hello").unwrap_err().contains("magic"));
        let at = b.windows(5).position(|w| w == b"False").unwrap();
        b[at..at + 5].copy_from_slice(b"True ");
        assert!(parse(&b).unwrap_err().contains("Fortran"));
    }

    #[test]
    fn a_repeated_header_key_is_refused_not_read_as_the_first() {
        // numpy reads this as f64 [4]: the last of a repeated key wins.
        let mut b =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (8,), 'descr': '<f8', 'shape': (4,), }".to_vec();
        b.resize(10 + 0x76 - 1, b' ');
        b.push(b'\n');
        b.extend_from_slice(&[0; 32]);
        let e = parse(&b).unwrap_err();
        assert!(e.contains("repeats 'descr'"), "{e}");
    }

    #[test]
    fn uint8_is_refused_not_read_as_bool() {
        let mut b = b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }".to_vec();
        b.resize(10 + 0x76 - 1, b' ');
        b.push(b'\n');
        b.extend_from_slice(&[0, 1, 2, 255]);
        let e = parse(&b).unwrap_err();
        assert!(e.contains("|u1") && e.contains("int32"), "{e}");
    }

    #[test]
    fn shapes_that_overflow_are_refused_not_wrapped() {
        // Each would wrap to a small element count (2, 0, 0) that the data bytes then satisfy.
        for shape in ["(3, 6148914691236517206)", "(4294967296, 4294967296)", "(0, 4294967296, 4294967296)", "(4611686018427387904,)"] {
            let mut b = [MAGIC, b"\x01\x00__"].concat();
            b.extend_from_slice(format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n").as_bytes());
            let hlen = (b.len() - 10) as u16;
            b[8..10].copy_from_slice(&hlen.to_le_bytes());
            b.extend_from_slice(&[0u8; 8]);
            let e = parse(&b).unwrap_err();
            assert!(e.contains("fit 64 bits"), "{shape}: {e}");
        }
    }

    #[test]
    fn a_header_longer_than_64_kib_is_written_as_version_2() {
        let p = std::env::temp_dir().join(format!("tilegrad-npy-v2-{}.npy", std::process::id()));
        let t = HostTensor::from_f32(&[1; 30_000], vec![2.5]);
        write(&p, &t).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes[6], 2);
        let hlen = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        assert_eq!((12 + hlen) % 64, 0, "data aligned");
        assert_eq!(read(&p).unwrap(), t);
        std::fs::remove_file(&p).unwrap();
    }
}
