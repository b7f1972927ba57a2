//! The parser of the text format: a recursive-descent parser over the tokens of [`super::lexer`]
//! that builds kernels directly in the IR arenas.
//!
//! It checks syntax and names (undefined, out-of-scope and duplicate `%` names); types are left
//! to the verifier, which the caller runs after canonicalizing. Every syntax error carries the
//! line and column of the offending token and says what was expected and what was found. The
//! parser never panics and bounds its recursion by [`MAX_DEPTH`].

use super::lexer::{lex, Tok, Token};
use crate::error::ParseError;
use crate::kernel::{Block, Inst, InstData, Kernel, Loc, Param, ParamKind, Value};
use crate::op::{AtomicOp, BinaryOp, CmpOp, DotPrecision, Op, ReduceOp, UnaryOp};
use crate::types::{DType, Elem, Lit, Shape, Type};
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The deepest nesting of `for`/`if` blocks the parser accepts.
pub(super) const MAX_DEPTH: usize = 64;

type PResult<T> = Result<T, ParseError>;

/// Parses every kernel of `text`, without canonicalizing or verifying them. `after_each` is called
/// on each kernel as soon as it is parsed (so that a type error in an early kernel is reported
/// before a syntax error in a later one); it may stop the parse with an error of its own.
pub(super) fn parse_kernels<E>(
    text: &str,
    file: &str,
    mut after_each: impl FnMut(Kernel) -> Result<(), E>,
) -> Result<(), Result<ParseError, E>> {
    let mut p = Parser { toks: lex(text), pos: 0, file: Arc::from(file), ks: None };
    let mut count = 0;
    loop {
        p.skip_newlines();
        if matches!(p.peek().tok, Tok::Eof) && count > 0 {
            return Ok(());
        }
        let k = p.kernel().map_err(Ok)?;
        count += 1;
        after_each(k).map_err(Err)?;
    }
}

/// Names of the kernel being parsed.
struct KernelState {
    k: Kernel,
    /// Names visible at the current point, with their values.
    visible: HashMap<String, Value>,
    /// Names made visible by each open block, to hide when it closes.
    scopes: Vec<Vec<String>>,
    /// Every name defined (or reserved by a multi-result op) so far in the kernel.
    used: HashSet<String>,
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    file: Arc<str>,
    ks: Option<KernelState>,
}

/// A `%name: type` written before `=` or in a block header, not yet defined.
struct Decl {
    name: String,
    line: u32,
    col: u32,
    ty: Type,
}

fn err<T>(line: u32, col: u32, message: impl Into<String>) -> PResult<T> {
    Err(ParseError { line, col, message: message.into() })
}

impl Parser {
    // ---- tokens ---------------------------------------------------------------------------

    fn peek(&self) -> &Token {
        // `lex` always ends with `Eof` and `bump` never moves past it.
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if !matches!(t.tok, Tok::Eof) {
            self.pos += 1;
        }
        t
    }

    fn skip_newlines(&mut self) {
        while matches!(self.peek().tok, Tok::Newline) {
            self.bump();
        }
    }

    /// The error "expected {what}, found {current token}" (or the lexer's error, if that is
    /// what comes next).
    fn expected<T>(&self, what: &str) -> PResult<T> {
        let t = self.peek();
        match &t.tok {
            Tok::Error(m) => err(t.line, t.col, m.clone()),
            other => err(t.line, t.col, format!("expected {what}, found {}", other.describe())),
        }
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        let yes = self.is_punct(c);
        if yes {
            self.bump();
        }
        yes
    }

    /// Consumes punctuation `c`; otherwise "expected `c` {context}, found ...".
    fn expect_punct(&mut self, c: char, context: &str) -> PResult<()> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            self.expected(&format!("`{c}` {context}"))
        }
    }

    fn is_ident(&self, s: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(i) if i == s)
    }

    /// Consumes the keyword `s`; otherwise "expected `s` {context}, found ...".
    fn expect_keyword(&mut self, s: &str, context: &str) -> PResult<()> {
        if self.is_ident(s) {
            self.bump();
            Ok(())
        } else {
            let sep = if context.is_empty() { "" } else { " " };
            self.expected(&format!("`{s}`{sep}{context}"))
        }
    }

    /// Consumes `name=`.
    fn attr(&mut self, name: &str, context: &str) -> PResult<()> {
        self.expect_keyword(name, context)?;
        self.expect_punct('=', &format!("after `{name}`"))
    }

    fn ident(&mut self, what: &str) -> PResult<(String, u32, u32)> {
        let t = self.peek().clone();
        match t.tok {
            Tok::Ident(s) => {
                self.bump();
                Ok((s, t.line, t.col))
            }
            _ => self.expected(what),
        }
    }

    /// A non-negative integer that fits `T`; `what` names it in errors.
    fn uint<T: TryFrom<u64>>(&mut self, what: &str) -> PResult<T> {
        let t = self.peek().clone();
        let Tok::Number(s) = &t.tok else { return self.expected(what) };
        self.bump();
        match s.parse::<u64>() {
            Ok(n) => match T::try_from(n) {
                Ok(v) => Ok(v),
                Err(_) => err(t.line, t.col, format!("{what} {n} is out of range")),
            },
            Err(_) => err(t.line, t.col, format!("invalid integer `{s}` (expected {what})")),
        }
    }

    /// A signed 64-bit integer, optionally preceded by `-`.
    fn int(&mut self, what: &str) -> PResult<i64> {
        let start = self.peek().clone();
        let neg = self.eat_punct('-');
        let t = self.peek().clone();
        let Tok::Number(s) = &t.tok else { return self.expected(what) };
        self.bump();
        let text = if neg { format!("-{s}") } else { s.clone() };
        text.parse::<i64>().or_else(|_| err(start.line, start.col, format!("invalid integer `{text}` (expected {what})")))
    }

    /// A literal: `true`, `false`, an integer, a float (`1.5`, `-1e-30`, `inf`, `-inf`, `nan`,
    /// `nan(0x<bits>)`).
    fn lit(&mut self) -> PResult<Lit> {
        let start = self.peek().clone();
        let neg = self.eat_punct('-');
        let t = self.peek().clone();
        match &t.tok {
            Tok::Ident(s) if !neg && (s == "true" || s == "false") => {
                self.bump();
                Ok(Lit::Bool(s == "true"))
            }
            Tok::Ident(s) if s == "inf" => {
                self.bump();
                Ok(Lit::Float(if neg { f64::NEG_INFINITY } else { f64::INFINITY }))
            }
            Tok::Ident(s) if s == "nan" && !neg => {
                self.bump();
                if !self.eat_punct('(') {
                    return Ok(Lit::Float(f64::NAN));
                }
                let b = self.peek().clone();
                let bits = match &b.tok {
                    Tok::Number(h) => h.strip_prefix("0x").and_then(|h| u64::from_str_radix(h, 16).ok()),
                    _ => None,
                };
                let Some(bits) = bits else { return self.expected("NaN bits `0x...` after `nan(`") };
                self.bump();
                let x = f64::from_bits(bits);
                if !x.is_nan() {
                    return err(b.line, b.col, format!("0x{bits:016x} is not the bit pattern of a NaN"));
                }
                self.expect_punct(')', "after NaN bits")?;
                Ok(Lit::Float(x))
            }
            Tok::Number(s) => {
                self.bump();
                let text = if neg { format!("-{s}") } else { s.clone() };
                let is_float = !s.starts_with("0x") && s.contains(['.', 'e', 'E']);
                let parsed = if is_float { text.parse::<f64>().ok().map(Lit::Float) } else { text.parse::<i64>().ok().map(Lit::Int) };
                match parsed {
                    Some(l) => Ok(l),
                    None => err(start.line, start.col, format!("invalid number `{text}`")),
                }
            }
            _ => self.expected("a literal (`true`, `false`, an integer or a float)"),
        }
    }

    fn dtype(&mut self) -> PResult<DType> {
        let t = self.peek().clone();
        match &t.tok {
            Tok::Ident(s) => match DType::from_name(s) {
                Some(d) => {
                    self.bump();
                    Ok(d)
                }
                None => err(t.line, t.col, format!("unknown type `{s}`")),
            },
            _ => self.expected("a dtype (`f32`, `i32`, ...)"),
        }
    }

    /// `f32`, `f32[16, 128]`, `ptr<f32>`, `ptr<f32>[128]`.
    fn ty(&mut self) -> PResult<Type> {
        let elem = if self.is_ident("ptr") {
            self.bump();
            self.expect_punct('<', "after `ptr`")?;
            let d = self.dtype()?;
            self.expect_punct('>', "after the pointee dtype")?;
            Elem::Ptr(d)
        } else if matches!(self.peek().tok, Tok::Ident(_)) {
            Elem::Num(self.dtype()?)
        } else {
            return self.expected("a type");
        };
        let mut shape = Shape::new();
        if self.eat_punct('[') {
            loop {
                shape.push(self.uint::<usize>("a dimension")?);
                if self.eat_punct(']') {
                    break;
                }
                self.expect_punct(',', "or `]` in shape")?;
            }
        }
        Ok(Type { elem, shape })
    }

    /// `@ "file":line:col`, if present.
    fn opt_loc(&mut self) -> PResult<Option<Loc>> {
        if !self.eat_punct('@') {
            return Ok(None);
        }
        let t = self.peek().clone();
        let Tok::Str(file) = &t.tok else { return self.expected("a file name string after `@`") };
        self.bump();
        self.expect_punct(':', "after the file name")?;
        let lt = self.peek().clone();
        let line = self.uint::<u32>("a line number")?;
        if line == 0 {
            // Line 0 means "unknown", which the printer writes as no `@` at all.
            return err(lt.line, lt.col, "line numbers count from 1");
        }
        self.expect_punct(':', "after the line number")?;
        let col = self.uint::<u32>("a column number")?;
        Ok(Some(Loc::new(file.as_str(), line, col)))
    }

    fn here_loc(&self, line: u32, col: u32) -> Loc {
        Loc { file: self.file.clone(), line, col }
    }

    // ---- names ----------------------------------------------------------------------------

    fn state(&mut self) -> &mut KernelState {
        self.ks.get_or_insert_with(|| KernelState {
            k: Kernel::new("", Loc::default()),
            visible: HashMap::new(),
            scopes: vec![Vec::new()],
            used: HashSet::new(),
        })
    }

    /// Reserves a name for a definition; "already defined" if it was used before.
    fn reserve(&mut self, name: &str, line: u32, col: u32) -> PResult<()> {
        if !self.state().used.insert(name.to_string()) {
            return err(line, col, format!("%{name} is already defined"));
        }
        Ok(())
    }

    /// Makes a reserved name visible in the innermost scope, as a new value of type `ty`.
    fn bind(&mut self, name: String, ty: Type) -> Value {
        let s = self.state();
        let v = s.k.new_value(ty);
        s.visible.insert(name.clone(), v);
        if let Some(scope) = s.scopes.last_mut() {
            scope.push(name);
        }
        v
    }

    /// Reserves and binds.
    fn define(&mut self, d: Decl) -> PResult<Value> {
        self.reserve(&d.name, d.line, d.col)?;
        Ok(self.bind(d.name, d.ty))
    }

    fn open_scope(&mut self) {
        self.state().scopes.push(Vec::new());
    }

    fn close_scope(&mut self) {
        let s = self.state();
        for name in s.scopes.pop().unwrap_or_default() {
            s.visible.remove(&name);
        }
    }

    /// A `%name` operand.
    fn operand(&mut self, what: &str) -> PResult<Value> {
        let t = self.peek().clone();
        let Tok::Value(name) = &t.tok else { return self.expected(what) };
        self.bump();
        let s = self.state();
        match s.visible.get(name) {
            Some(&v) => Ok(v),
            None if s.used.contains(name) => err(t.line, t.col, format!("%{name} is not in scope here")),
            None => err(t.line, t.col, format!("undefined value %{name}")),
        }
    }

    /// `%name: type`.
    fn decl(&mut self, context: &str) -> PResult<Decl> {
        let t = self.peek().clone();
        let Tok::Value(name) = &t.tok else { return self.expected(&format!("a value name {context}")) };
        self.bump();
        self.expect_punct(':', &format!("after %{name}"))?;
        let ty = self.ty()?;
        Ok(Decl { name: name.clone(), line: t.line, col: t.col, ty })
    }

    // ---- kernels and blocks ---------------------------------------------------------------

    fn kernel(&mut self) -> PResult<Kernel> {
        self.ks = None;
        let start = self.peek().clone();
        self.expect_keyword("kernel", "to start a kernel")?;
        let (name, _, _) = self.ident("a kernel name")?;
        self.state().k.name = name.clone();
        self.expect_punct('(', "after the kernel name")?;
        self.skip_newlines();
        if !self.eat_punct(')') {
            loop {
                self.param()?;
                self.skip_newlines();
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',', "or `)` after parameter")?;
                self.skip_newlines();
            }
        }
        let loc = self.opt_loc()?.unwrap_or_else(|| self.here_loc(start.line, start.col));
        self.state().k.loc = loc;
        let open = self.peek().clone();
        self.expect_punct('{', "to open the kernel body")?;
        let body = self.state().k.body;
        self.block_body(body, 0, &format!("kernel `{name}`"), (open.line, open.col))?;
        self.end_of_line("after the kernel")?;
        match self.ks.take() {
            Some(s) => Ok(s.k),
            None => err(start.line, start.col, "internal error: no kernel state"),
        }
    }

    fn param(&mut self) -> PResult<()> {
        let t = self.peek().clone();
        let Tok::Value(name) = &t.tok else { return self.expected("a parameter `%name: type`") };
        let ident_like = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && !name.contains('.');
        if !ident_like {
            return err(t.line, t.col, format!("parameter names must be identifiers, found `%{name}`"));
        }
        let (_, kind) = self.decl_param_head()?;
        let ty = match &kind {
            ParamKind::Ptr(d) => Type::ptr(*d, &[]),
            ParamKind::Scalar(d) | ParamKind::Constexpr(d, _) => Type::scalar(*d),
        };
        let v = self.define(Decl { name: name.clone(), line: t.line, col: t.col, ty })?;
        self.state().k.params.push(Param { name: name.clone(), kind, value: v });
        Ok(())
    }

    /// `%name: ptr<d>`, `%name: d` or `%name: constexpr d = lit`.
    fn decl_param_head(&mut self) -> PResult<(String, ParamKind)> {
        let t = self.bump();
        let name = match t.tok {
            Tok::Value(n) => n,
            _ => return err(t.line, t.col, "expected a parameter"),
        };
        self.expect_punct(':', &format!("after %{name}"))?;
        if self.is_ident("constexpr") {
            self.bump();
            let d = self.dtype()?;
            self.expect_punct('=', "after the constexpr dtype")?;
            let lit = self.lit()?;
            return Ok((name, ParamKind::Constexpr(d, lit)));
        }
        let ty_tok = self.peek().clone();
        let ty = self.ty()?;
        if !ty.is_scalar() {
            return err(ty_tok.line, ty_tok.col, format!("parameters must be scalars or scalar pointers, found {ty}"));
        }
        Ok((
            name,
            match ty.elem {
                Elem::Ptr(d) => ParamKind::Ptr(d),
                Elem::Num(d) => ParamKind::Scalar(d),
            },
        ))
    }

    /// Parses ops into `block` up to and including its closing `}`. `what` and `open` describe
    /// the block for a missing `}`.
    fn block_body(&mut self, block: Block, depth: usize, what: &str, open: (u32, u32)) -> PResult<()> {
        loop {
            self.skip_newlines();
            let t = self.peek().clone();
            match &t.tok {
                Tok::Punct('}') => {
                    self.bump();
                    return Ok(());
                }
                Tok::Eof => {
                    return self.expected(&format!("`}}` to close {what} (opened at {}:{})", open.0, open.1));
                }
                Tok::Ident(s) if s == "kernel" => {
                    return self.expected(&format!("`}}` to close {what} (opened at {}:{})", open.0, open.1));
                }
                _ => self.op(block, depth)?,
            }
        }
    }

    /// After an op: a newline, or `}` / end of input (left for the block to handle).
    fn end_of_line(&mut self, context: &str) -> PResult<()> {
        match self.peek().tok {
            Tok::Newline => {
                self.bump();
                Ok(())
            }
            Tok::Punct('}') | Tok::Eof => Ok(()),
            _ => self.expected(&format!("end of line {context}")),
        }
    }

    fn push_inst(&mut self, block: Block, op: Op, args: SmallVec<[Value; 4]>, results: SmallVec<[Value; 2]>, loc: Loc) {
        let s = self.state();
        s.k.insts.push(InstData { op, args, results, loc });
        let inst = Inst(s.k.insts.len() as u32 - 1);
        if let Some(b) = s.k.blocks.get_mut(block.index()) {
            b.insts.push(inst);
        }
    }

    // ---- ops ------------------------------------------------------------------------------

    fn op(&mut self, block: Block, depth: usize) -> PResult<()> {
        let start = self.peek().clone();
        let mut results: Vec<Decl> = Vec::new();
        if matches!(start.tok, Tok::Value(_)) {
            loop {
                let d = self.decl("as a result")?;
                if results.iter().any(|r| r.name == d.name) {
                    return err(d.line, d.col, format!("%{} is already defined", d.name));
                }
                if self.state().used.contains(&d.name) {
                    return err(d.line, d.col, format!("%{} is already defined", d.name));
                }
                results.push(d);
                if self.eat_punct('=') {
                    break;
                }
                self.expect_punct(',', "or `=` after result")?;
            }
        }
        let (mnemonic, ml, mc) = self.ident("an op")?;
        let default_loc = self.here_loc(start.line, start.col);
        match mnemonic.as_str() {
            "for" => return self.for_op(block, results, default_loc, depth, (ml, mc)),
            "if" => return self.if_op(block, results, default_loc, depth, (ml, mc)),
            "while" => return self.while_op(block, results, default_loc, depth, (ml, mc)),
            _ => {}
        }
        let (op, args) = self.simple_op(&mnemonic, ml, mc)?;
        let loc = self.opt_loc()?.unwrap_or(default_loc);
        self.end_of_line(&format!("after `{mnemonic}`"))?;
        let mut res = SmallVec::new();
        for d in results {
            res.push(self.define(d)?);
        }
        self.push_inst(block, op, args, res, loc);
        Ok(())
    }

    /// Operand list and attributes of an op without blocks.
    fn simple_op(&mut self, m: &str, line: u32, col: u32) -> PResult<(Op, SmallVec<[Value; 4]>)> {
        let mut args: SmallVec<[Value; 4]> = SmallVec::new();
        let op = match m {
            "program_id" | "num_programs" => {
                let axis = self.uint::<u8>("an axis")?;
                if m == "program_id" {
                    Op::ProgramId { axis }
                } else {
                    Op::NumPrograms { axis }
                }
            }
            "const" => Op::Const { value: self.lit()? },
            "arange" => {
                let start = self.int("the start of the range")?;
                self.expect_punct(',', "after the start of the range")?;
                let end = self.int("the end of the range")?;
                Op::Arange { start, end }
            }
            "broadcast" | "reshape" | "cast" => {
                args.push(self.operand("an operand")?);
                match m {
                    "broadcast" => Op::Broadcast,
                    "reshape" => Op::Reshape,
                    _ => Op::Cast,
                }
            }
            "expand_dims" => {
                args.push(self.operand("an operand")?);
                self.expect_punct(',', "after the operand")?;
                self.attr("axis", "")?;
                Op::ExpandDims { axis: self.uint("an axis")? }
            }
            "permute" => {
                args.push(self.operand("an operand")?);
                self.expect_punct(',', "after the operand")?;
                self.attr("perm", "")?;
                self.expect_punct('[', "to start the permutation")?;
                let mut perm = SmallVec::new();
                if !self.eat_punct(']') {
                    loop {
                        perm.push(self.uint::<u8>("a dimension index")?);
                        if self.eat_punct(']') {
                            break;
                        }
                        self.expect_punct(',', "or `]` in the permutation")?;
                    }
                }
                Op::Permute { perm }
            }
            "cmp" => {
                let t = self.peek().clone();
                let (name, _, _) = self.ident("a comparison (`eq`, `ne`, `lt`, `le`, `gt`, `ge`)")?;
                let Some(c) = CmpOp::from_name(&name) else {
                    return err(t.line, t.col, format!("unknown comparison `{name}`"));
                };
                self.operands(&mut args, 2)?;
                Op::Cmp(c)
            }
            "where" => {
                self.operands(&mut args, 3)?;
                Op::Where
            }
            "reduce" => {
                let t = self.peek().clone();
                let (name, _, _) = self.ident("a reduction (`sum`, `max`, `min`, `argmax`, `argmin`)")?;
                let Some(kind) = ReduceOp::from_name(&name) else {
                    return err(t.line, t.col, format!("unknown reduction `{name}`"));
                };
                args.push(self.operand("an operand")?);
                self.expect_punct(',', "after the operand")?;
                self.attr("axis", "")?;
                let axis = self.uint("an axis")?;
                let keep_dims = self.eat_punct(',');
                if keep_dims {
                    self.expect_keyword("keep_dims", "after `,`")?;
                }
                Op::Reduce { kind, axis, keep_dims }
            }
            "cumsum" => {
                args.push(self.operand("an operand")?);
                self.expect_punct(',', "after the operand")?;
                self.attr("axis", "")?;
                let axis = self.uint("an axis")?;
                let reverse = self.eat_punct(',');
                if reverse {
                    self.expect_keyword("reverse", "after `,`")?;
                }
                Op::Cumsum { axis, reverse }
            }
            "dot" => {
                self.operands(&mut args, 3)?;
                self.expect_punct(',', "after the accumulator")?;
                self.attr("precision", "")?;
                let t = self.peek().clone();
                let (name, _, _) = self.ident("a precision (`ieee` or `tf32`)")?;
                let Some(precision) = DotPrecision::from_name(&name) else {
                    return err(t.line, t.col, format!("unknown precision `{name}`"));
                };
                Op::Dot { precision }
            }
            "addptr" => {
                self.operands(&mut args, 2)?;
                Op::AddPtr
            }
            "load" => {
                args.push(self.operand("a pointer operand")?);
                let (mut mask, mut other) = (false, false);
                if self.eat_punct(',') {
                    if self.is_ident("other") {
                        return self.expected("`mask=` (`other=` requires a mask before it)");
                    }
                    self.attr("mask", "")?;
                    args.push(self.operand("a mask operand")?);
                    mask = true;
                    if self.eat_punct(',') {
                        self.attr("other", "")?;
                        args.push(self.operand("an operand")?);
                        other = true;
                    }
                }
                Op::Load { mask, other }
            }
            "store" | "atomic_add" | "atomic_max" | "atomic_min" | "atomic_and" | "atomic_or" | "atomic_xor" | "atomic_xchg" => {
                self.operands(&mut args, 2)?;
                let mask = self.eat_punct(',');
                if mask {
                    self.attr("mask", "")?;
                    args.push(self.operand("a mask operand")?);
                }
                match m {
                    "store" => Op::Store { mask },
                    "atomic_add" => Op::AtomicAdd { mask },
                    _ => Op::AtomicRmw { kind: AtomicOp::from_name(m).expect("listed above"), mask },
                }
            }
            "atomic_cas" => {
                self.operands(&mut args, 3)?;
                Op::AtomicCas
            }
            "yield" => {
                if matches!(self.peek().tok, Tok::Value(_)) {
                    loop {
                        args.push(self.operand("a value")?);
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                }
                Op::Yield
            }
            other => {
                if let Some(u) = UnaryOp::from_name(other) {
                    args.push(self.operand("an operand")?);
                    Op::Unary(u)
                } else if let Some(b) = BinaryOp::from_name(other) {
                    self.operands(&mut args, 2)?;
                    Op::Binary(b)
                } else {
                    return err(line, col, format!("unknown op `{other}`"));
                }
            }
        };
        Ok((op, args))
    }

    /// `n` operands separated by commas.
    fn operands(&mut self, args: &mut SmallVec<[Value; 4]>, n: usize) -> PResult<()> {
        for i in 0..n {
            if i > 0 {
                self.expect_punct(',', "between operands")?;
            }
            args.push(self.operand("an operand")?);
        }
        Ok(())
    }

    /// Opens a nested block's `{`, checking the depth bound.
    fn open_block(&mut self, depth: usize, what: &str, at: (u32, u32)) -> PResult<(u32, u32)> {
        if depth + 1 > MAX_DEPTH {
            return err(at.0, at.1, format!("`{what}` blocks are nested more than {MAX_DEPTH} deep"));
        }
        let open = self.peek().clone();
        self.expect_punct('{', &format!("to open the `{what}` block"))?;
        Ok((open.line, open.col))
    }

    /// Binds the results of a `for`/`if` after its blocks and appends the op.
    fn finish_region_op(&mut self, block: Block, op: Op, args: SmallVec<[Value; 4]>, results: Vec<Decl>, loc: Loc) -> PResult<()> {
        let mut res = SmallVec::new();
        for d in results {
            res.push(self.bind(d.name, d.ty));
        }
        self.push_inst(block, op, args, res, loc);
        self.end_of_line("after `}`")
    }

    /// Reserves the results of a `for`/`if` so that its blocks cannot redefine them.
    fn reserve_all(&mut self, results: &[Decl]) -> PResult<()> {
        for d in results {
            self.reserve(&d.name, d.line, d.col)?;
        }
        Ok(())
    }

    /// `for %iv: T = %lo to %hi step %st[, max_iters=N], iter_args(...) [@ loc] { ... }`.
    fn for_op(&mut self, block: Block, results: Vec<Decl>, default_loc: Loc, depth: usize, at: (u32, u32)) -> PResult<()> {
        self.reserve_all(&results)?;
        let iv = self.decl("for the induction variable")?;
        self.expect_punct('=', "after the induction variable")?;
        let mut args: SmallVec<[Value; 4]> = SmallVec::new();
        args.push(self.operand("the lower bound")?);
        self.expect_keyword("to", "after the lower bound")?;
        args.push(self.operand("the upper bound")?);
        self.expect_keyword("step", "after the upper bound")?;
        args.push(self.operand("the step")?);
        self.expect_punct(',', "after the step")?;
        let mut max_iters = None;
        if self.is_ident("max_iters") {
            self.attr("max_iters", "")?;
            max_iters = Some(self.uint::<u32>("an iteration count")?);
            self.expect_punct(',', "after max_iters")?;
        }
        let carried = self.iter_args(max_iters.is_some(), &mut args)?;
        let loc = self.opt_loc()?.unwrap_or(default_loc);
        let open = self.open_block(depth, "for", at)?;
        let body = self.state().k.new_block();
        self.open_scope();
        let mut params = vec![self.define(iv)?];
        for d in carried {
            params.push(self.define(d)?);
        }
        if let Some(b) = self.state().k.blocks.get_mut(body.index()) {
            b.params = params;
        }
        self.block_body(body, depth + 1, "the `for` body", open)?;
        self.close_scope();
        self.finish_region_op(block, Op::For { body, max_iters }, args, results, loc)
    }

    /// `iter_args(%a: T = %init, ...)` of a loop: the carried values' declarations, their
    /// initial values pushed onto `args`.
    fn iter_args(&mut self, after_max_iters: bool, args: &mut SmallVec<[Value; 4]>) -> PResult<Vec<Decl>> {
        if !self.is_ident("iter_args") {
            return self.expected(if after_max_iters { "`iter_args`" } else { "`max_iters=` or `iter_args`" });
        }
        self.bump();
        self.expect_punct('(', "after `iter_args`")?;
        let mut carried: Vec<Decl> = Vec::new();
        self.skip_newlines();
        if !self.eat_punct(')') {
            loop {
                carried.push(self.decl("for a carried value")?);
                self.expect_punct('=', "after the carried value")?;
                args.push(self.operand("an initial value")?);
                self.skip_newlines();
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',', "or `)` after the carried value")?;
                self.skip_newlines();
            }
        }
        Ok(carried)
    }

    /// `while [max_iters=N, ]iter_args(%a: T = %init, ...) [@ loc] { cond } do (%b: T, ...) { body }`.
    fn while_op(&mut self, block: Block, results: Vec<Decl>, default_loc: Loc, depth: usize, at: (u32, u32)) -> PResult<()> {
        self.reserve_all(&results)?;
        let mut max_iters = None;
        if self.is_ident("max_iters") {
            self.attr("max_iters", "")?;
            max_iters = Some(self.uint::<u32>("an iteration count")?);
            self.expect_punct(',', "after max_iters")?;
        }
        let mut args: SmallVec<[Value; 4]> = SmallVec::new();
        let carried = self.iter_args(max_iters.is_some(), &mut args)?;
        let loc = self.opt_loc()?.unwrap_or(default_loc);
        let open = self.open_block(depth, "while", at)?;
        let cond = self.state().k.new_block();
        self.open_scope();
        let mut params = Vec::new();
        for d in carried {
            params.push(self.define(d)?);
        }
        if let Some(b) = self.state().k.blocks.get_mut(cond.index()) {
            b.params = params;
        }
        self.block_body(cond, depth + 1, "the `while` condition", open)?;
        self.close_scope();
        self.expect_keyword("do", "after the `while` condition")?;
        self.expect_punct('(', "after `do`")?;
        let mut body_params: Vec<Decl> = Vec::new();
        self.skip_newlines();
        if !self.eat_punct(')') {
            loop {
                body_params.push(self.decl("for a carried value")?);
                self.skip_newlines();
                if self.eat_punct(')') {
                    break;
                }
                self.expect_punct(',', "or `)` after the carried value")?;
                self.skip_newlines();
            }
        }
        let open = self.open_block(depth, "do", at)?;
        let body = self.state().k.new_block();
        self.open_scope();
        let mut params = Vec::new();
        for d in body_params {
            params.push(self.define(d)?);
        }
        if let Some(b) = self.state().k.blocks.get_mut(body.index()) {
            b.params = params;
        }
        self.block_body(body, depth + 1, "the `while` body", open)?;
        self.close_scope();
        self.finish_region_op(block, Op::While { cond, body, max_iters }, args, results, loc)
    }

    /// `if %c [@ loc] { ... } else { ... }`.
    fn if_op(&mut self, block: Block, results: Vec<Decl>, default_loc: Loc, depth: usize, at: (u32, u32)) -> PResult<()> {
        self.reserve_all(&results)?;
        let cond = self.operand("a condition")?;
        let loc = self.opt_loc()?.unwrap_or(default_loc);
        let open = self.open_block(depth, "if", at)?;
        let then_block = self.state().k.new_block();
        self.open_scope();
        self.block_body(then_block, depth + 1, "the `if` block", open)?;
        self.close_scope();
        self.expect_keyword("else", "after the `if` block")?;
        let open = self.open_block(depth, "else", at)?;
        let else_block = self.state().k.new_block();
        self.open_scope();
        self.block_body(else_block, depth + 1, "the `else` block", open)?;
        self.close_scope();
        self.finish_region_op(block, Op::If { then_block, else_block }, smallvec::smallvec![cond], results, loc)
    }
}
