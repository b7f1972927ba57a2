//! Scratch tensors ([`crate::Options::scratch`]: a VJP kernel's tapes) as each program sees
//! them: its own writes, in pages of element bits, over the tensor's initial contents.
//!
//! A scratch tensor is written before it is read, by the program that reads it, and is not
//! needed after the launch. Its writes are then neither logged (no commit, no race check) nor
//! kept as a map per element: a page holds 8 bytes an element, so a program that fills a tape
//! of N elements holds about 8 N bytes, not a log of every store plus a hash map.

use crate::tensor::Data;
use std::collections::HashMap;

/// Elements a page.
const PAGE: i64 = 1024;

/// One program's writes to one scratch tensor.
#[derive(Default)]
pub(crate) struct Pages {
    pages: HashMap<i64, Box<[u64]>>,
}

impl Pages {
    /// Element `o` now holds `bits`; a new page starts from `initial`.
    pub(crate) fn write(&mut self, initial: &Data, o: i64, bits: u64) {
        let (p, at) = (o.div_euclid(PAGE), o.rem_euclid(PAGE) as usize);
        let page = self.pages.entry(p).or_insert_with(|| {
            let start = (p * PAGE) as usize;
            let end = (start + PAGE as usize).min(initial.len());
            (start..start + PAGE as usize).map(|e| if e < end { super::program::bits_of(initial, e) } else { 0 }).collect()
        });
        page[at] = bits;
    }

    /// The bits of element `o`, where this program wrote its page.
    pub(crate) fn get(&self, o: &i64) -> Option<&u64> {
        self.pages.get(&o.div_euclid(PAGE)).map(|p| &p[o.rem_euclid(PAGE) as usize])
    }
}

/// What a load reads over the initial contents: a program's writes to a tensor, as a map (see
/// [`super::program::SlotLog`]) or, for a scratch tensor, as pages.
#[derive(Clone, Copy)]
pub(crate) enum Overlay<'a> {
    Map(&'a HashMap<i64, u64>),
    Pages(&'a Pages),
}

impl<'a> Overlay<'a> {
    /// The bits of element `o`, where the program wrote it (or its page).
    pub(crate) fn get(self, o: &i64) -> Option<&'a u64> {
        match self {
            Overlay::Map(m) => m.get(o),
            Overlay::Pages(p) => p.get(o),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_read_back_writes_over_the_initial_contents() {
        let initial = Data::F64((0..3000).map(|x| x as f64).collect());
        let mut p = Pages::default();
        assert_eq!(p.get(&5), None);
        p.write(&initial, 2100, 7.5f64.to_bits());
        // The page of the write reads the initial contents elsewhere, past the tensor's end 0.
        assert_eq!(p.get(&2100).map(|&b| f64::from_bits(b)), Some(7.5));
        assert_eq!(p.get(&2101).map(|&b| f64::from_bits(b)), Some(2101.0));
        assert_eq!(p.get(&3071), Some(&0));
        assert_eq!(p.get(&5), None);
    }
}
