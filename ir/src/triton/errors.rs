//! Conversion errors: a message at a byte offset of the Python source, turned into the crate's
//! [`IrError::Parse`] with line:column once the conversion stops, and the offset-to-line table that
//! also gives every op its [`Loc`].

use crate::{IrError, Loc, ParseError};
use std::sync::Arc;

/// A conversion error at byte offset `off` of the source.
#[derive(Debug)]
pub(crate) struct Fail {
    pub off: u32,
    pub message: String,
}

/// Conversion results.
pub(crate) type R<T> = Result<T, Fail>;

/// An error at `off`.
pub(crate) fn fail<T>(off: u32, message: impl Into<String>) -> R<T> {
    Err(Fail { off, message: message.into() })
}

/// Maps byte offsets of one source file to 1-based line:column (columns count characters).
pub(crate) struct Lines {
    file: Arc<str>,
    src: Arc<str>,
    starts: Vec<usize>,
}

impl Lines {
    pub(crate) fn new(file: &str, src: &str) -> Lines {
        let mut starts = vec![0];
        starts.extend(src.char_indices().filter(|&(_, c)| c == '\n').map(|(i, _)| i + 1));
        Lines { file: Arc::from(file), src: Arc::from(src), starts }
    }

    /// Line and column of byte offset `off`.
    pub(crate) fn line_col(&self, off: u32) -> (u32, u32) {
        let off = (off as usize).min(self.src.len());
        let line = self.starts.partition_point(|&s| s <= off).max(1);
        let start = self.starts[line - 1];
        let col = self.src.get(start..off).map_or(off - start, |s| s.chars().count());
        (line as u32, col as u32 + 1)
    }

    /// The source text from byte `start` to `end`, on one line, shortened to `max` characters.
    pub(crate) fn text(&self, start: u32, end: u32, max: usize) -> String {
        let t = self.src.get(start as usize..end as usize).unwrap_or_default();
        let one: String = t.split_whitespace().collect::<Vec<_>>().join(" ");
        if one.chars().count() <= max {
            return one;
        }
        let cut: String = one.chars().take(max.saturating_sub(3)).collect();
        format!("{cut}...")
    }

    /// The [`Loc`] of byte offset `off`.
    pub(crate) fn loc(&self, off: u32) -> Loc {
        let (line, col) = self.line_col(off);
        Loc { file: self.file.clone(), line, col }
    }

    /// The crate error for `f`.
    pub(crate) fn error(&self, f: Fail) -> IrError {
        let (line, col) = self.line_col(f.off);
        IrError::Parse { file: self.file.to_string(), error: ParseError { line, col, message: f.message } }
    }
}
