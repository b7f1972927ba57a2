//! What numpy reads from a `.npy` file, for the cases this model is sure of: the header is a
//! Python dict literal with exactly the keys `descr`, `fortran_order` and `shape` (a repeated key:
//! the last wins, as in Python), plain decimal dimensions, and a descr of one of the dtypes
//! tilegrad reads. A mutant that tilegrad accepted must have been read as numpy reads it.

/// The array a `.npy` file holds, as numpy reads it.
#[derive(Debug)]
pub struct View<'a> {
    /// The dtype: `b1`, `i4`, `i8`, `f2`, `f4` or `f8` (little-endian).
    pub dtype: &'static str,
    pub fortran: bool,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

/// The array in `bytes`, or `None` when numpy would refuse it or this model cannot tell.
pub fn view(bytes: &[u8]) -> Option<View<'_>> {
    let rest = bytes.strip_prefix(b"\x93NUMPY")?;
    let (len, start) = match rest.first()? {
        1 => (u16::from_le_bytes([*rest.get(2)?, *rest.get(3)?]) as usize, 10usize),
        2 | 3 => (u32::from_le_bytes(rest.get(2..6)?.try_into().ok()?) as usize, 12),
        _ => return None,
    };
    let header = std::str::from_utf8(bytes.get(start..start.checked_add(len)?)?).ok()?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut p = Parser(header.as_bytes());
    p.eat(b'{')?;
    while p.eat(b'}').is_none() {
        let key = p.string()?;
        p.eat(b':')?;
        match key {
            "descr" => descr = Some(dtype(p.string()?)?),
            "fortran_order" => fortran = Some(p.boolean()?),
            "shape" => shape = Some(p.tuple()?),
            _ => return None,
        }
        if p.eat(b',').is_none() {
            p.eat(b'}')?;
            break;
        }
    }
    p.end()?;
    let (dtype, fortran, shape) = (descr?, fortran?, shape?);
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let data = bytes.get(start + len..)?.get(..n.checked_mul(size(dtype))?)?;
    Some(View { dtype, fortran, shape, data })
}

/// The canonical dtype of a descr numpy reads as one tilegrad supports, `None` for the others.
fn dtype(descr: &str) -> Option<&'static str> {
    Some(match descr {
        "|b1" | "<b1" | "=b1" | "b1" | "?" | "bool" => "b1",
        "<i4" | "=i4" | "i4" | "int32" => "i4",
        "<i8" | "=i8" | "i8" | "int64" => "i8",
        "<f2" | "=f2" | "f2" | "float16" => "f2",
        "<f4" | "=f4" | "f4" | "float32" => "f4",
        "<f8" | "=f8" | "f8" | "float64" => "f8",
        _ => return None,
    })
}

fn size(dtype: &str) -> usize {
    match dtype {
        "b1" => 1,
        "f2" => 2,
        "i4" | "f4" => 4,
        _ => 8,
    }
}

/// A cursor over a Python literal, skipping spaces.
struct Parser<'a>(&'a [u8]);

impl<'a> Parser<'a> {
    fn skip(&mut self) {
        while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = self.0 {
            self.0 = rest;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.skip();
        let rest = self.0.strip_prefix(&[c])?;
        self.0 = rest;
        Some(())
    }

    /// A quoted string without escapes.
    fn string(&mut self) -> Option<&'a str> {
        self.skip();
        let q = *self.0.first().filter(|&&q| q == b'\'' || q == b'"')?;
        let end = self.0[1..].iter().position(|&c| c == q)? + 1;
        let s = std::str::from_utf8(&self.0[1..end]).ok().filter(|s| !s.contains('\\'))?;
        self.0 = &self.0[end + 1..];
        Some(s)
    }

    fn boolean(&mut self) -> Option<bool> {
        self.skip();
        for (word, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if let Some(rest) = self.0.strip_prefix(word).filter(|r| !r.first().is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')) {
                self.0 = rest;
                return Some(v);
            }
        }
        None
    }

    /// A tuple of plain decimal integers: `()`, `(n,)`, `(a, b)` or `(a, b,)`.
    fn tuple(&mut self) -> Option<Vec<usize>> {
        self.eat(b'(')?;
        let mut v = Vec::new();
        let mut comma = false;
        loop {
            if self.eat(b')').is_some() {
                return (v.len() != 1 || comma).then_some(v);
            }
            self.skip();
            let digits = self.0.iter().take_while(|c| c.is_ascii_digit()).count();
            let d = std::str::from_utf8(&self.0[..digits]).ok()?;
            if d.is_empty()
                || (d.len() > 1 && d.starts_with('0'))
                || self.0.get(digits).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'.')
            {
                return None;
            }
            v.push(d.parse().ok()?);
            self.0 = &self.0[digits..];
            comma = self.eat(b',').is_some();
            if !comma {
                // `(6)` is a number, not a tuple.
                self.eat(b')')?;
                return (v.len() != 1).then_some(v);
            }
        }
    }

    fn end(&mut self) -> Option<()> {
        self.skip();
        self.0.is_empty().then_some(())
    }
}

/// Element `i` (row-major) of `v` as comparable bits: truthiness for bools, the value for
/// numbers (every NaN alike).
fn element(v: &View, i: usize) -> u64 {
    let at = if v.fortran && v.shape.len() > 1 { fortran_index(&v.shape, i) } else { i };
    let b = &v.data[at * size(v.dtype)..(at + 1) * size(v.dtype)];
    let float = |x: f64| if x.is_nan() { u64::MAX } else { x.to_bits() };
    match v.dtype {
        "b1" => (b[0] != 0) as u64,
        "i4" => i32::from_le_bytes(b.try_into().unwrap()) as i64 as u64,
        "i8" => u64::from_le_bytes(b.try_into().unwrap()),
        "f2" => float(half::f16::from_le_bytes([b[0], b[1]]).to_f64()),
        "f4" => float(f32::from_le_bytes(b.try_into().unwrap()) as f64),
        _ => float(f64::from_le_bytes(b.try_into().unwrap())),
    }
}

/// Where row-major element `i` of an array of `shape` lies in column-major order.
fn fortran_index(shape: &[usize], mut i: usize) -> usize {
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        idx[k] = i % d.max(1);
        i /= d.max(1);
    }
    let (mut at, mut stride) = (0, 1);
    for (k, &d) in shape.iter().enumerate() {
        at += idx[k] * stride;
        stride *= d;
    }
    at
}

/// Whether `written` (what tilegrad wrote back) holds the array numpy reads from `mutant`; fine
/// when the model cannot tell what numpy reads.
pub fn same_array(mutant: &[u8], written: &[u8]) -> Result<(), String> {
    let Some(m) = view(mutant) else { return Ok(()) };
    let w = view(written).ok_or("tilegrad wrote a file numpy cannot read")?;
    if m.dtype != w.dtype || m.shape != w.shape {
        return Err(format!("numpy reads {} {:?}, tilegrad read {} {:?}", m.dtype, m.shape, w.dtype, w.shape));
    }
    let n = m.shape.iter().product::<usize>();
    match (0..n).find(|&i| element(&m, i) != element(&w, i)) {
        Some(i) => Err(format!("element {i} (row-major) differs from numpy's (fortran_order {})", m.fortran)),
        None => Ok(()),
    }
}

#[test]
fn the_model_reads_as_numpy_does() {
    let file = |header: &str, data: &[u8]| {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    };
    let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let c = file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", &data);
    let v = view(&c).unwrap();
    assert_eq!((v.dtype, v.fortran, v.shape.clone()), ("f4", false, vec![2, 3]));
    // The last of a repeated key wins; a one-element tuple needs its comma; unknown keys are refused.
    assert_eq!(view(&file("{'descr': '<f4', 'shape': (2, 3), 'fortran_order': False, 'descr': '<i4'}", &data)).unwrap().dtype, "i4");
    assert!(view(&file("{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", &data)).is_none());
    assert!(view(&file("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", &data)).is_none());
    // Column-major data, read back row-major, is a different array.
    let f = file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", &data);
    assert!(same_array(&f, &c).is_err());
    assert!(same_array(&c, &c).is_ok());
    assert_eq!(fortran_index(&[2, 3], 1), 2);
}
