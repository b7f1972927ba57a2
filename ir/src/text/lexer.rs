//! The lexer of the text format: turns the text into tokens that carry their line and column, so
//! that every parse error can point at the exact place in the user's file.
//!
//! Newlines are tokens (an op ends at the end of its line); `#` comments and other whitespace are
//! skipped. A lexical error (a stray character, an unterminated string) becomes an
//! [`Tok::Error`] token followed by [`Tok::Eof`], so the parser reports it only when it reaches
//! it: errors come out in text order.

/// What a token is.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// A word: `[A-Za-z_][A-Za-z0-9_]*` (keywords, mnemonics, dtypes, kernel names, `nan`...).
    Ident(String),
    /// A value name: the text after `%`, `[A-Za-z0-9_.]+`.
    Value(String),
    /// A number as written: starts with a digit, then letters, digits, `_`, `.`, and a sign
    /// right after an exponent `e`. The parser validates it.
    Number(String),
    /// A string literal, escapes decoded.
    Str(String),
    /// One of `( ) [ ] { } < > , : = @ -`.
    Punct(char),
    /// End of a line.
    Newline,
    /// End of the text.
    Eof,
    /// A lexical error; nothing follows but `Eof`.
    Error(String),
}

/// A token and where it starts (line and column from 1, columns in characters).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Token {
    /// The token.
    pub tok: Tok,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

impl Tok {
    /// How an error message names this token (`found ...`).
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Value(s) => format!("`%{s}`"),
            Tok::Number(s) => format!("`{s}`"),
            Tok::Str(s) => format!("string \"{}\"", s.escape_debug()),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of input".into(),
            Tok::Error(m) => m.clone(),
        }
    }
}

struct Cursor {
    chars: Vec<char>,
    pos: usize,
    line: u32,
    col: u32,
}

impl Cursor {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek2(&self) -> Option<char> {
        self.chars.get(self.pos + 1).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        if c == '\n' {
            self.line = self.line.saturating_add(1);
            self.col = 1;
        } else {
            self.col = self.col.saturating_add(1);
        }
        Some(c)
    }
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Splits `text` into tokens; the last token is always `Eof`.
pub(super) fn lex(text: &str) -> Vec<Token> {
    let mut cur = Cursor { chars: text.chars().collect(), pos: 0, line: 1, col: 1 };
    let mut out = Vec::new();
    loop {
        let (line, col) = (cur.line, cur.col);
        let Some(c) = cur.peek() else {
            out.push(Token { tok: Tok::Eof, line, col });
            return out;
        };
        let tok = match c {
            ' ' | '\t' | '\r' => {
                cur.bump();
                continue;
            }
            '#' => {
                while cur.peek().is_some_and(|c| c != '\n') {
                    cur.bump();
                }
                continue;
            }
            '\n' => {
                cur.bump();
                Tok::Newline
            }
            '%' => {
                cur.bump();
                let mut s = String::new();
                while let Some(c) = cur.peek().filter(|&c| is_value_char(c)) {
                    s.push(c);
                    cur.bump();
                }
                if s.is_empty() {
                    Tok::Error("expected a value name after `%`".into())
                } else {
                    Tok::Value(s)
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut s = String::new();
                while let Some(c) = cur.peek().filter(|&c| c.is_ascii_alphanumeric() || c == '_') {
                    s.push(c);
                    cur.bump();
                }
                Tok::Ident(s)
            }
            c if c.is_ascii_digit() => {
                let mut s = String::new();
                while let Some(c) = cur.peek() {
                    let exp_sign = (c == '+' || c == '-')
                        && s.ends_with(['e', 'E'])
                        && !s.starts_with("0x")
                        && !s.starts_with("0X")
                        && cur.peek2().is_some_and(|d| d.is_ascii_digit());
                    if !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || exp_sign) {
                        break;
                    }
                    s.push(c);
                    cur.bump();
                }
                Tok::Number(s)
            }
            '"' => lex_string(&mut cur),
            '(' | ')' | '[' | ']' | '{' | '}' | '<' | '>' | ',' | ':' | '=' | '@' | '-' => {
                cur.bump();
                Tok::Punct(c)
            }
            other => Tok::Error(format!("unexpected character `{}`", other.escape_debug())),
        };
        let stop = matches!(tok, Tok::Error(_));
        out.push(Token { tok, line, col });
        if stop {
            out.push(Token { tok: Tok::Eof, line: cur.line, col: cur.col });
            return out;
        }
    }
}

/// Lexes a string literal at the opening quote; escapes are `\"`, `\\`, `\n`, `\r`, `\t` and
/// `\u{HEX}`.
fn lex_string(cur: &mut Cursor) -> Tok {
    cur.bump();
    let mut s = String::new();
    loop {
        match cur.peek() {
            None | Some('\n') => return Tok::Error("unterminated string".into()),
            Some('"') => {
                cur.bump();
                return Tok::Str(s);
            }
            Some('\\') => {
                cur.bump();
                let e = cur.bump();
                match e {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') => s.push('\n'),
                    Some('r') => s.push('\r'),
                    Some('t') => s.push('\t'),
                    Some('u') => {
                        if cur.peek() != Some('{') {
                            return Tok::Error("expected `{` after `\\u` in string".into());
                        }
                        cur.bump();
                        let mut hex = String::new();
                        while let Some(c) = cur.peek().filter(|c| c.is_ascii_hexdigit()) {
                            hex.push(c);
                            cur.bump();
                        }
                        if cur.peek() != Some('}') {
                            return Tok::Error("expected hex digits and `}` in `\\u{...}` escape".into());
                        }
                        cur.bump();
                        match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                            Some(c) => s.push(c),
                            None => return Tok::Error(format!("invalid character code `\\u{{{hex}}}` in string")),
                        }
                    }
                    None | Some('\n') => return Tok::Error("unterminated string".into()),
                    Some(other) => return Tok::Error(format!("unknown escape `\\{}` in string", other.escape_debug())),
                }
            }
            Some(c) => {
                s.push(c);
                cur.bump();
            }
        }
    }
}

/// Writes `s` as a string literal the lexer reads back to `s`.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
