//! Reading `model.mil`, the program of a compiled model (`.mlmodelc`) as Apple's compiler
//! prints it: `program(1.0)` (every scalar a rank-0 tensor, `tensor<int32, []>(1)`) or
//! `program(1.3)` (bare scalars, `int32(1)`), an optional `[buildInfo = ...]`, then
//! `func NAME<iosNN>(params) [attributes] { statements } -> (outputs);` per function.
//! Values are typed literals: C99 hex floats, `inf`/`nan`, strings, nested lists, tuples
//! `(a, b)`, dicts `{{k, v}}` and `BLOBFILE(path = ..., offset = ...)` references into
//! `weights/weight.bin` (the package blob format). Nested blocks (`cond`, `while_loop`)
//! follow an op's attributes as `(params) { statements } -> (outputs)`.
//!
//! The reader builds the same IR the package loader builds and checks it the same way, op
//! by op as it reads: every op must exist in its function's opset, every input must be
//! defined before use, and every output type is inferred again and must agree with the
//! declared one. Every error names the file, line and column.

use super::blob::{pack_i4, pack_sub_byte, BlobReader};
use super::convert::{blob_dtype, value_from_proto, value_type_to_proto, BlobSource, MAX_ELEMENTS};
use super::load::agrees;
use crate::ir::{
    Arg, Block, Bytes, DType, Dim, Function, Operation, Opset, Program, Tensor, TensorType, Value,
    ValueType, Var,
};
use crate::ops::builder::infer_op;
use crate::proto::mil;
use anyhow::{anyhow, bail, Result};
use half::{bf16, f16};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// The largest dimension a type may declare (`2^31 - 1`, Core ML's limit for a tensor
/// dimension the runtime allocates).
pub const MAX_DIM: u64 = (1 << 31) - 1;

/// Where a `BLOBFILE` reference reads its bytes: the weight file, or nothing (its absence
/// explained), in which case every referenced constant is read as zeros of its declared
/// type so that the program can still be inspected and verified.
pub enum Weights {
    File(BlobReader),
    Absent(String),
}

/// What [`parse_program`] returns: the checked program, the printer dialect it was written
/// in (`1.0` or `1.3`) and each function's attributes (e.g. `FlexibleShapeInformation`).
pub struct ParsedProgram {
    pub program: Program,
    pub version: String,
    pub function_attributes: BTreeMap<String, BTreeMap<String, Value>>,
    /// Whether any constant is a `BLOBFILE` reference.
    pub references_blobs: bool,
}

/// A parse or check error at a place in the text.
#[derive(Debug)]
pub struct TextError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.msg)
    }
}

impl std::error::Error for TextError {}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Num(String),
    Str(String),
    Punct(char),
    Arrow,
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "`{s}`"),
            Tok::Num(s) => write!(f, "number `{s}`"),
            Tok::Str(s) => write!(f, "string {s:?}"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::Eof => f.write_str("the end of the file"),
        }
    }
}

struct Token {
    tok: Tok,
    line: usize,
    col: usize,
}

fn lex(text: &str, file: &str) -> Result<Vec<Token>, TextError> {
    let b = text.as_bytes();
    let (mut i, mut line, mut col) = (0usize, 1usize, 1usize);
    let mut out = Vec::new();
    let err = |line, col, msg: String| TextError {
        file: file.to_string(),
        line,
        col,
        msg,
    };
    while i < b.len() {
        let c = b[i];
        let (tl, tc) = (line, col);
        if c == b'\n' {
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            col += 1;
            continue;
        }
        let start = i;
        let tok = if c == b'"' {
            i += 1;
            let mut s = Vec::new();
            loop {
                let Some(&d) = b.get(i) else {
                    return Err(err(tl, tc, "string literal is not closed".into()));
                };
                i += 1;
                match d {
                    b'"' => break,
                    b'\n' => return Err(err(tl, tc, "string literal runs past the line".into())),
                    b'\\' => {
                        let Some(&e) = b.get(i) else {
                            return Err(err(tl, tc, "string literal is not closed".into()));
                        };
                        i += 1;
                        s.push(match e {
                            b'n' => b'\n',
                            b't' => b'\t',
                            b'r' => b'\r',
                            b'0' => 0,
                            b'"' | b'\\' | b'\'' => e,
                            _ => {
                                return Err(err(
                                    tl,
                                    tc,
                                    format!("unknown escape `\\{}` in a string", e as char),
                                ))
                            }
                        });
                    }
                    _ => s.push(d),
                }
            }
            let s = String::from_utf8(s)
                .map_err(|_| err(tl, tc, "string literal is not UTF-8".into()))?;
            Tok::Str(s)
        } else if c == b'-' && b.get(i + 1) == Some(&b'>') {
            i += 2;
            Tok::Arrow
        } else if c.is_ascii_digit()
            || ((c == b'-' || c == b'+')
                && b.get(i + 1)
                    .is_some_and(|d| d.is_ascii_digit() || *d == b'i' || *d == b'n'))
        {
            i += 1;
            while i < b.len() {
                let d = b[i];
                let prev = b[i - 1];
                if d.is_ascii_alphanumeric()
                    || d == b'.'
                    || ((d == b'-' || d == b'+') && matches!(prev, b'p' | b'P' | b'e' | b'E'))
                {
                    i += 1;
                } else {
                    break;
                }
            }
            Tok::Num(text[start..i].to_string())
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b'@' {
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            Tok::Ident(text[start..i].to_string())
        } else if b"()[]{}<>,=;?".contains(&c) {
            i += 1;
            Tok::Punct(c as char)
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(err(tl, tc, format!("unexpected character {ch:?}")));
        };
        col += text[start..i].chars().count();
        out.push(Token {
            tok,
            line: tl,
            col: tc,
        });
    }
    out.push(Token {
        tok: Tok::Eof,
        line,
        col,
    });
    Ok(out)
}

type Scope = HashMap<String, (ValueType, Option<Value>)>;

/// A literal before its type gives it meaning.
#[derive(Debug)]
enum Lit {
    Num(String, usize, usize),
    Word(String, usize, usize),
    Str(String),
    /// `[...]`
    List(Vec<Lit>, usize, usize),
    /// `(...)`
    Paren(Vec<Lit>, usize, usize),
    /// `{...}`
    Brace(Vec<Lit>, usize, usize),
    Blob(BTreeMap<String, (ValueType, Lit)>, usize, usize),
}

struct Parser<'a> {
    toks: Vec<Token>,
    pos: usize,
    file: &'a str,
    weights: &'a Weights,
    used_blob: std::cell::Cell<bool>,
}

impl BlobSource for Weights {
    fn get(&self, offset: u64) -> Result<(super::blob::BlobDType, Bytes)> {
        match self {
            Weights::File(r) => r.read(offset),
            Weights::Absent(why) => bail!("the weights are absent: {why}"),
        }
    }
}

/// Parses a C99 hex float (`0x1.8p+1`, `-0x0p+0`) or a decimal number, or `inf`/`nan`.
pub fn parse_float(s: &str) -> Option<f64> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let v = if lower == "inf" || lower == "infinity" {
        f64::INFINITY
    } else if lower == "nan" {
        f64::NAN
    } else if let Some(h) = lower.strip_prefix("0x") {
        let (mant, exp) = match h.split_once('p') {
            Some((m, e)) => (m, e.parse::<i64>().ok()?),
            None => (h, 0),
        };
        let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let mut m: u128 = 0;
        let mut e2 = exp;
        let mut sig = 0;
        for (k, c) in int.chars().chain(frac.chars()).enumerate() {
            let d = c.to_digit(16)? as u128;
            let in_frac = k >= int.len();
            if sig < 28 {
                m = m * 16 + d;
                if m != 0 {
                    sig += 1;
                }
                if in_frac {
                    e2 -= 4;
                }
            } else if !in_frac {
                e2 += 4;
            }
        }
        ldexp(m as f64, e2)
    } else {
        if !body
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'-' | b'+'))
        {
            return None;
        }
        body.parse::<f64>().ok()?
    };
    Some(if neg { -v } else { v })
}

/// `m * 2^e` without intermediate overflow or underflow.
fn ldexp(mut m: f64, mut e: i64) -> f64 {
    if m == 0.0 {
        return 0.0;
    }
    while e > 1000 {
        m *= 2f64.powi(1000);
        e -= 1000;
        if m.is_infinite() {
            return m;
        }
    }
    while e < -1000 {
        m *= 2f64.powi(-1000);
        e += 1000;
        if m == 0.0 {
            return 0.0;
        }
    }
    m * 2f64.powi(e as i32)
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }
    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.pos + k).min(self.toks.len() - 1)].tok
    }
    fn here(&self) -> (usize, usize) {
        let t = &self.toks[self.pos];
        (t.line, t.col)
    }
    fn err_at(&self, (line, col): (usize, usize), msg: impl Into<String>) -> anyhow::Error {
        TextError {
            file: self.file.to_string(),
            line,
            col,
            msg: msg.into(),
        }
        .into()
    }
    fn err(&self, msg: impl Into<String>) -> anyhow::Error {
        self.err_at(self.here(), msg)
    }
    fn next(&mut self) -> Tok {
        let t = self.toks[self.pos].tok.clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }
    fn eat(&mut self, c: char) -> bool {
        if *self.peek() == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char, what: &str) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err(format!("expected `{c}` {what}, found {}", self.peek())))
        }
    }
    fn ident(&mut self, what: &str) -> Result<String> {
        match self.peek().clone() {
            Tok::Ident(s) => {
                self.next();
                Ok(s)
            }
            t => Err(self.err(format!("expected {what}, found {t}"))),
        }
    }
    fn keyword(&mut self, k: &str) -> Result<()> {
        match self.peek() {
            Tok::Ident(s) if s == k => {
                self.next();
                Ok(())
            }
            t => Err(self.err(format!("expected `{k}`, found {t}"))),
        }
    }

    /// `tensor<fp16, [1, ?]>`, `state<...>`, `list<T, N|?>`, `tuple<...>`, `dict<K, V>` or a
    /// bare dtype (a scalar).
    fn ty(&mut self) -> Result<ValueType> {
        let at = self.here();
        let name = self.ident("a type")?;
        Ok(match name.as_str() {
            "tensor" => {
                self.expect('<', "after `tensor`")?;
                let dt = self.dtype()?;
                self.expect(',', "after the tensor's dtype")?;
                self.expect('[', "to open the tensor's shape")?;
                let mut shape = vec![];
                if !self.eat(']') {
                    loop {
                        shape.push(self.dim()?);
                        if self.eat(']') {
                            break;
                        }
                        self.expect(',', "between dimensions")?;
                    }
                }
                self.expect('>', "to close the tensor type")?;
                let known = shape.iter().try_fold(1u64, |n, d| match d {
                    Dim::Fixed(k) => n.checked_mul(*k as u64),
                    Dim::Unknown => Some(n),
                });
                if known.is_none_or(|n| n > MAX_ELEMENTS) {
                    return Err(self.err_at(
                        at,
                        format!("a tensor type of more than {MAX_ELEMENTS} elements"),
                    ));
                }
                ValueType::Tensor(TensorType { dtype: dt, shape })
            }
            "state" => {
                self.expect('<', "after `state`")?;
                let inner = self.ty()?;
                self.expect('>', "to close the state type")?;
                match inner {
                    ValueType::Tensor(t) => ValueType::State(t),
                    o => return Err(self.err_at(at, format!("a state of {o}, not of a tensor"))),
                }
            }
            "list" => {
                self.expect('<', "after `list`")?;
                let elem = self.ty()?;
                self.expect(',', "after the list's element type")?;
                let len = match self.dim()? {
                    Dim::Fixed(n) => Some(n),
                    Dim::Unknown => None,
                };
                self.expect('>', "to close the list type")?;
                ValueType::List {
                    elem: Box::new(elem),
                    len,
                }
            }
            "tuple" => {
                self.expect('<', "after `tuple`")?;
                let mut ts = vec![];
                if !self.eat('>') {
                    loop {
                        ts.push(self.ty()?);
                        if self.eat('>') {
                            break;
                        }
                        self.expect(',', "between tuple element types")?;
                    }
                }
                ValueType::Tuple(ts)
            }
            "dict" => {
                self.expect('<', "after `dict`")?;
                let k = self.ty()?;
                self.expect(',', "after the dict's key type")?;
                let v = self.ty()?;
                self.expect('>', "to close the dict type")?;
                ValueType::Dict {
                    key: Box::new(k),
                    value: Box::new(v),
                }
            }
            other => match DType::from_name(other) {
                Some(d) => ValueType::Tensor(TensorType::scalar(d)),
                None => return Err(self.err_at(at, format!("unknown type `{other}`"))),
            },
        })
    }

    fn dtype(&mut self) -> Result<DType> {
        let at = self.here();
        let n = self.ident("a dtype")?;
        DType::from_name(&n).ok_or_else(|| self.err_at(at, format!("unknown dtype `{n}`")))
    }

    fn dim(&mut self) -> Result<Dim> {
        if self.eat('?') {
            return Ok(Dim::Unknown);
        }
        let at = self.here();
        match self.next() {
            Tok::Num(s) => {
                let n: u64 = s
                    .parse()
                    .map_err(|_| self.err_at(at, format!("dimension `{s}` is not a size")))?;
                if n > MAX_DIM {
                    return Err(self.err_at(
                        at,
                        format!("dimension {n} is larger than the largest allowed, {MAX_DIM}"),
                    ));
                }
                Ok(Dim::Fixed(n as usize))
            }
            t => Err(self.err_at(at, format!("expected a dimension or `?`, found {t}"))),
        }
    }

    /// A literal: a number, word, string, `[...]`, `(...)`, `{...}` or `BLOBFILE(...)`.
    fn lit(&mut self) -> Result<Lit> {
        let (l, c) = self.here();
        match self.next() {
            Tok::Num(s) => Ok(Lit::Num(s, l, c)),
            Tok::Str(s) => Ok(Lit::Str(s)),
            Tok::Ident(w) if w == "BLOBFILE" => {
                self.expect('(', "after BLOBFILE")?;
                let mut fields = BTreeMap::new();
                loop {
                    let k = self.ident("a BLOBFILE field")?;
                    self.expect('=', "after a BLOBFILE field")?;
                    let t = self.ty()?;
                    self.expect('(', "to open a value")?;
                    let v = self.lit()?;
                    self.expect(')', "to close a value")?;
                    fields.insert(k, (t, v));
                    if self.eat(')') {
                        break;
                    }
                    self.expect(',', "between BLOBFILE fields")?;
                }
                Ok(Lit::Blob(fields, l, c))
            }
            Tok::Ident(w) => Ok(Lit::Word(w, l, c)),
            Tok::Punct(open @ ('[' | '(' | '{')) => {
                let close = match open {
                    '[' => ']',
                    '(' => ')',
                    _ => '}',
                };
                let mut items = vec![];
                if !self.eat(close) {
                    loop {
                        items.push(self.lit()?);
                        if self.eat(close) {
                            break;
                        }
                        self.expect(',', "between literal elements")?;
                    }
                }
                Ok(match open {
                    '[' => Lit::List(items, l, c),
                    '(' => Lit::Paren(items, l, c),
                    _ => Lit::Brace(items, l, c),
                })
            }
            t => Err(self.err_at((l, c), format!("expected a literal, found {t}"))),
        }
    }

    /// `TYPE(literal)`.
    fn typed_value(&mut self) -> Result<Value> {
        let at = self.here();
        let t = self.ty()?;
        self.expect('(', "to open a value")?;
        let lit = self.lit()?;
        self.expect(')', "to close a value")?;
        self.value(&t, lit, at)
    }

    fn value(&self, t: &ValueType, lit: Lit, at: (usize, usize)) -> Result<Value> {
        match (t, lit) {
            (ValueType::Tensor(tt), Lit::Blob(fields, l, c)) => self.blob(tt, fields, (l, c)),
            (ValueType::Tensor(tt), lit) => self.tensor(tt, lit, at),
            (ValueType::List { elem, len }, Lit::List(items, l, c)) => {
                if let Some(n) = len {
                    if *n != items.len() {
                        return Err(self.err_at(
                            (l, c),
                            format!("a list of {} elements for {t}", items.len()),
                        ));
                    }
                }
                let values = items
                    .into_iter()
                    .map(|i| self.value(elem, i, (l, c)))
                    .collect::<Result<_>>()?;
                Ok(Value::List {
                    elem: (**elem).clone(),
                    values,
                })
            }
            (ValueType::Tuple(ts), Lit::Paren(items, l, c)) => {
                if ts.len() != items.len() {
                    return Err(self.err_at(
                        (l, c),
                        format!("a tuple of {} elements for {t}", items.len()),
                    ));
                }
                Ok(Value::Tuple(
                    ts.iter()
                        .zip(items)
                        .map(|(t, i)| self.value(t, i, (l, c)))
                        .collect::<Result<_>>()?,
                ))
            }
            (ValueType::Dict { key, value }, Lit::Brace(items, l, c)) => {
                let mut entries = vec![];
                for item in items {
                    let Lit::Brace(kv, l2, c2) = item else {
                        return Err(self.err_at((l, c), "a dict entry is `{key, value}`"));
                    };
                    let [k, v]: [Lit; 2] = kv.try_into().map_err(|_| {
                        self.err_at((l2, c2), "a dict entry is `{key, value}`: two elements")
                    })?;
                    entries.push((
                        self.value(key, k, (l2, c2))?,
                        self.value(value, v, (l2, c2))?,
                    ));
                }
                Ok(Value::Dict {
                    key: (**key).clone(),
                    value: (**value).clone(),
                    entries,
                })
            }
            (t, lit) => Err(self.err_at(lit_at(&lit, at), format!("this literal is not a {t}"))),
        }
    }

    fn blob(
        &self,
        tt: &TensorType,
        fields: BTreeMap<String, (ValueType, Lit)>,
        at: (usize, usize),
    ) -> Result<Value> {
        let mut path = None;
        let mut offset = None;
        for (k, (t, lit)) in fields {
            match (k.as_str(), self.value(&t, lit, at)?) {
                ("path", v) => {
                    path = Some(
                        v.as_str()
                            .ok_or_else(|| self.err_at(at, "BLOBFILE path is not a string"))?
                            .to_string(),
                    )
                }
                ("offset", Value::Tensor(o)) if o.dtype.is_int() && o.shape.is_empty() => {
                    let o = o.to_f64_vec()?[0];
                    offset = Some(o as u64);
                }
                (k, _) => return Err(self.err_at(at, format!("unknown BLOBFILE field `{k}`"))),
            }
        }
        let (Some(path), Some(offset)) = (path, offset) else {
            return Err(self.err_at(at, "BLOBFILE needs a path and an integer offset"));
        };
        self.used_blob.set(true);
        if let Weights::Absent(_) = self.weights {
            let shape = tt.fixed_shape().ok_or_else(|| {
                self.err_at(at, format!("blob constant {tt} has a `?` dimension"))
            })?;
            let n: usize = shape.iter().product();
            return Ok(Value::Tensor(Tensor::new(
                tt.dtype,
                shape,
                zeros(tt.dtype.storage_bytes(n)).map_err(|e| self.err_at(at, e.to_string()))?,
            )?));
        }
        let proto = mil::Value {
            doc_string: String::new(),
            r#type: Some(value_type_to_proto(&ValueType::Tensor(tt.clone()))),
            value: Some(mil::value::Value::BlobFileValue(
                mil::value::BlobFileValue {
                    file_name: path,
                    offset,
                },
            )),
        };
        value_from_proto(&proto, self.weights).map_err(|e| self.err_at(at, format!("{e:#}")))
    }

    fn tensor(&self, tt: &TensorType, lit: Lit, at: (usize, usize)) -> Result<Value> {
        // Flatten the nested lists, recording the shape they have.
        let mut flat = vec![];
        let mut shape = vec![];
        flatten(lit, 0, &mut shape, &mut flat, &mut |at, m| {
            self.err_at(at, m)
        })?;
        if tt.shape.is_empty() && !shape.is_empty() {
            // A scalar is written bare; accept a one-element list too.
            if flat.len() != 1 {
                return Err(self.err_at(at, format!("{} elements for a scalar {tt}", flat.len())));
            }
            shape.clear();
        }
        // A fully known declared shape of another rank but the same element count (a flat
        // list for a tensor of rank > 1) takes the declared shape.
        let n = flat.len();
        let shape: Vec<usize> = match tt.fixed_shape() {
            Some(s) if s.iter().product::<usize>() == n => s,
            Some(s) => {
                return Err(self.err_at(
                    at,
                    format!(
                        "{n} elements for {tt} ({} expected)",
                        s.iter().product::<usize>()
                    ),
                ))
            }
            None => {
                let fits = shape.len() == tt.shape.len()
                    && shape.iter().zip(&tt.shape).all(|(a, d)| match d {
                        Dim::Fixed(k) => k == a,
                        Dim::Unknown => true,
                    });
                if !fits {
                    return Err(self.err_at(at, format!("a literal of shape {shape:?} for {tt}")));
                }
                shape
            }
        };
        let d = tt.dtype;
        if d == DType::Str {
            let values = flat
                .into_iter()
                .map(|l| match l {
                    Lit::Str(s) => Ok(s),
                    l => Err(self.err_at(lit_at(&l, at), "expected a string")),
                })
                .collect::<Result<_>>()?;
            return Ok(Value::Strings { shape, values });
        }
        let mut bytes = Vec::with_capacity(d.storage_bytes(n));
        let mut codes = vec![];
        for l in flat {
            let lat = lit_at(&l, at);
            let bad = |what: &str| self.err_at(lat, format!("{what} is not a {d} value"));
            let text = match &l {
                Lit::Num(s, ..) | Lit::Word(s, ..) => s.as_str(),
                Lit::Str(_) => return Err(bad("a string")),
                _ => return Err(bad("a nested literal")),
            };
            if d == DType::Bool {
                bytes.push(match text {
                    "true" => 1,
                    "false" => 0,
                    _ => return Err(bad(&format!("`{text}`"))),
                });
            } else if d.is_float() {
                let x = parse_float(text).ok_or_else(|| bad(&format!("`{text}`")))?;
                match d {
                    DType::F16 => bytes.extend(f16::from_f64(x).to_le_bytes()),
                    DType::BF16 => bytes.extend(bf16::from_f64(x).to_le_bytes()),
                    DType::F32 => bytes.extend((x as f32).to_le_bytes()),
                    _ => bytes.extend(x.to_le_bytes()),
                }
            } else {
                let v: i128 = text.parse().map_err(|_| bad(&format!("`{text}`")))?;
                let (lo, hi): (i128, i128) = if d.is_signed_int() {
                    (-(1i128 << (d.bits() - 1)), (1i128 << (d.bits() - 1)) - 1)
                } else {
                    (0, (1i128 << d.bits()) - 1)
                };
                if v < lo || v > hi {
                    return Err(self.err_at(lat, format!("{v} is outside the range of {d}")));
                }
                if d.is_sub_byte() {
                    codes.push(v as i8);
                } else {
                    bytes.extend(&(v as i64).to_le_bytes()[..d.bits() / 8]);
                }
            }
        }
        if d.is_sub_byte() {
            bytes = if d == DType::I4 {
                pack_i4(&codes)?
            } else {
                let bd = blob_dtype(d).ok_or_else(|| anyhow!("no packing for {d}"))?;
                pack_sub_byte(bd, &codes.iter().map(|&c| c as u8).collect::<Vec<_>>())?
            };
        }
        Ok(Value::Tensor(
            Tensor::new(d, shape, Bytes::from_vec(bytes))
                .map_err(|e| self.err_at(at, e.to_string()))?,
        ))
    }

    /// `name = value, ...` up to the closing `]`.
    fn attributes(&mut self) -> Result<BTreeMap<String, Value>> {
        let mut out = BTreeMap::new();
        if self.eat(']') {
            return Ok(out);
        }
        loop {
            let at = self.here();
            let k = self.ident("an attribute name")?;
            self.expect('=', "after an attribute name")?;
            let v = self.typed_value()?;
            if out.insert(k.clone(), v).is_some() {
                return Err(self.err_at(at, format!("attribute `{k}` is given twice")));
            }
            if self.eat(']') {
                return Ok(out);
            }
            self.expect(',', "between attributes")?;
        }
    }

    /// `(TYPE name, ...)`: function parameters and block inputs.
    fn params(&mut self) -> Result<Vec<Var>> {
        self.expect('(', "to open the parameters")?;
        let mut out = vec![];
        if self.eat(')') {
            return Ok(out);
        }
        loop {
            let ty = self.ty()?;
            let name = self.ident("a parameter name")?;
            out.push(Var { name, ty });
            if self.eat(')') {
                return Ok(out);
            }
            self.expect(',', "between parameters")?;
        }
    }

    /// One binding: a variable name or a typed value.
    fn binding(&mut self) -> Result<Arg> {
        // `name` alone, or `TYPE(...)`: a name followed by `(` or `<` starts a typed value.
        if let Tok::Ident(s) = self.peek().clone() {
            let typed = matches!(self.peek_at(1), Tok::Punct('(') | Tok::Punct('<'))
                && (DType::from_name(&s).is_some()
                    || matches!(s.as_str(), "tensor" | "list" | "tuple" | "dict" | "state"));
            if !typed {
                self.next();
                return Ok(Arg::Var(s));
            }
        }
        Ok(Arg::Value(self.typed_value()?))
    }

    /// `{ statements } -> (outputs)`, in `scope` (which the block's values extend).
    fn block_body(&mut self, inputs: Vec<Var>, opset: Opset, scope: &mut Scope) -> Result<Block> {
        for v in &inputs {
            if scope.contains_key(&v.name) {
                return Err(self.err(format!("block input `{}` redefines a visible name", v.name)));
            }
            scope.insert(v.name.clone(), (v.ty.clone(), None));
        }
        self.expect('{', "to open a block")?;
        let mut operations = vec![];
        while !self.eat('}') {
            if *self.peek() == Tok::Eof {
                return Err(self.err("the file ends inside a block (a `}` is missing)"));
            }
            operations.push(self.statement(opset, scope)?);
        }
        if *self.peek() != Tok::Arrow {
            return Err(self.err(format!(
                "expected `->` and the block's outputs, found {}",
                self.peek()
            )));
        }
        self.next();
        self.expect('(', "to open the block's outputs")?;
        let mut outputs = vec![];
        if !self.eat(')') {
            loop {
                let at = self.here();
                let o = self.ident("an output name")?;
                if !scope.contains_key(&o) {
                    return Err(self.err_at(at, format!("block output `{o}` is never defined")));
                }
                outputs.push(o);
                if self.eat(')') {
                    break;
                }
                self.expect(',', "between outputs")?;
            }
        }
        Ok(Block {
            inputs,
            operations,
            outputs,
        })
    }

    /// `TYPE out, ... = op(args)[attributes] blocks;`, checked against the op's definition.
    fn statement(&mut self, opset: Opset, scope: &mut Scope) -> Result<Operation> {
        let at = self.here();
        let mut outputs = vec![];
        loop {
            let ty = self.ty()?;
            let name = self.ident("an output name")?;
            outputs.push(Var { name, ty });
            if self.eat('=') {
                break;
            }
            self.expect(',', "between outputs or `=` before the op")?;
        }
        let op_at = self.here();
        let op_type = self.ident("an op type")?;
        self.expect('(', "to open the op's arguments")?;
        let mut inputs: BTreeMap<String, Vec<Arg>> = BTreeMap::new();
        if !self.eat(')') {
            loop {
                let pat = self.here();
                let p = self.ident("a parameter name")?;
                self.expect('=', "after a parameter name")?;
                let binds = if self.eat('(') {
                    let mut v = vec![];
                    if !self.eat(')') {
                        loop {
                            v.push(self.binding()?);
                            if self.eat(')') {
                                break;
                            }
                            self.expect(',', "between bindings")?;
                        }
                    }
                    v
                } else {
                    vec![self.binding()?]
                };
                if inputs.insert(p.clone(), binds).is_some() {
                    return Err(self.err_at(pat, format!("parameter `{p}` is bound twice")));
                }
                if self.eat(')') {
                    break;
                }
                self.expect(',', "between arguments")?;
            }
        }
        let mut attributes = if self.eat('[') {
            self.attributes()?
        } else {
            BTreeMap::new()
        };
        let name = match attributes.remove("name") {
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err_at(op_at, "the op's name is not a string"))?
                .to_string(),
            None => String::new(),
        };
        // The iOS16/iOS17 constexpr ops carry their parameters as attributes; the IR holds
        // them as constant inputs, as the package loader does.
        if op_type.starts_with("constexpr_") {
            for (k, v) in std::mem::take(&mut attributes) {
                inputs.insert(k, vec![Arg::Value(v)]);
            }
        }
        let mut blocks = vec![];
        while matches!(self.peek(), Tok::Punct('(') | Tok::Punct('{')) {
            let params = if *self.peek() == Tok::Punct('(') {
                self.params()?
            } else {
                vec![]
            };
            let mut inner = scope.clone();
            blocks.push(self.block_body(params, opset, &mut inner)?);
        }
        if !self.eat(';') {
            return Err(self.err(format!("expected `;` after the op, found {}", self.peek())));
        }
        let op = Operation {
            op_type,
            name,
            inputs,
            outputs,
            blocks,
            attributes,
        };
        let label = if op.name.is_empty() {
            op.outputs[0].name.clone()
        } else {
            op.name.clone()
        };
        let inferred = infer_op(&op, opset, scope)
            .map_err(|e| self.err_at(op_at, format!("op `{label}` ({}): {e:#}", op.op_type)))?;
        if inferred.len() != op.outputs.len() {
            return Err(self.err_at(
                at,
                format!(
                    "op `{label}` ({}) declares {} outputs, its definition has {}",
                    op.op_type,
                    op.outputs.len(),
                    inferred.len()
                ),
            ));
        }
        for (o, t) in op.outputs.iter().zip(&inferred) {
            if !agrees(&o.ty, t) {
                return Err(self.err_at(
                    at,
                    format!(
                        "op `{label}` ({}): output `{}` is declared {} but infers to {t}",
                        op.op_type, o.name, o.ty
                    ),
                ));
            }
            if scope.contains_key(&o.name) {
                return Err(self.err_at(at, format!("op `{label}` redefines `{}`", o.name)));
            }
        }
        let cval = op.const_val().cloned();
        for o in &op.outputs {
            scope.insert(o.name.clone(), (o.ty.clone(), cval.clone()));
        }
        Ok(op)
    }
}

fn lit_at(l: &Lit, at: (usize, usize)) -> (usize, usize) {
    match l {
        Lit::Num(_, a, b)
        | Lit::Word(_, a, b)
        | Lit::List(_, a, b)
        | Lit::Paren(_, a, b)
        | Lit::Brace(_, a, b)
        | Lit::Blob(_, a, b) => (*a, *b),
        Lit::Str(_) => at,
    }
}

fn flatten(
    lit: Lit,
    depth: usize,
    shape: &mut Vec<usize>,
    out: &mut Vec<Lit>,
    err: &mut dyn FnMut((usize, usize), String) -> anyhow::Error,
) -> Result<()> {
    match lit {
        Lit::List(items, l, c) => {
            if shape.len() == depth {
                shape.push(items.len());
            } else if shape.len() < depth || shape[depth] != items.len() {
                return Err(err((l, c), "a ragged nested list".into()));
            }
            for i in items {
                flatten(i, depth + 1, shape, out, err)?;
            }
        }
        other => {
            if depth != shape.len() && !(depth == 0 && shape.is_empty()) {
                return Err(err(lit_at(&other, (0, 0)), "a ragged nested list".into()));
            }
            out.push(other)
        }
    }
    Ok(())
}

/// `n` zero bytes that cost no memory until read: an anonymous mapping.
fn zeros(n: usize) -> Result<Bytes> {
    if n == 0 {
        return Ok(Bytes::from_vec(vec![]));
    }
    let m = memmap2::MmapMut::map_anon(n)
        .map_err(|e| anyhow!("cannot map {n} zero bytes for an absent weight: {e}"))?;
    Bytes::from_mmap(std::sync::Arc::new(m.make_read_only()?), 0..n)
}

/// Parses and checks the program text of `file` (named in errors). BLOBFILE references
/// resolve through `weights`; a function's opset may be at most `max_opset` when given.
pub fn parse_program(
    text: &str,
    file: &str,
    weights: &Weights,
    max_opset: Option<Opset>,
) -> Result<ParsedProgram> {
    let toks = lex(text, file)?;
    let mut p = Parser {
        toks,
        pos: 0,
        file,
        weights,
        used_blob: std::cell::Cell::new(false),
    };
    p.keyword("program")?;
    p.expect('(', "after `program`")?;
    let at = p.here();
    let version = match p.next() {
        Tok::Num(v) if v == "1.0" || v == "1.3" => v,
        t => {
            return Err(p.err_at(
                at,
                format!("program version {t} is not one milkit reads (1.0 or 1.3)"),
            ))
        }
    };
    p.expect(')', "after the program version")?;
    let attributes = if p.eat('[') {
        p.attributes()?
    } else {
        BTreeMap::new()
    };
    p.expect('{', "to open the program")?;
    let mut functions = BTreeMap::new();
    let mut function_attributes = BTreeMap::new();
    while !p.eat('}') {
        let fat = p.here();
        p.keyword("func")?;
        let name = p.ident("a function name")?;
        p.expect('<', "before the function's opset")?;
        let oat = p.here();
        let target = p.ident("an opset (ios15..ios18)")?;
        let opset = Opset::from_target_name(&target)
            .ok_or_else(|| p.err_at(oat, format!("unknown opset `{target}` (ios15..ios18)")))?;
        if let Some(mx) = max_opset {
            if opset > mx {
                return Err(p.err_at(
                    oat,
                    format!(
                        "function `{name}`: opset {target} needs specification version {}, the \
                         model declares {}",
                        opset.spec_version(),
                        mx.spec_version()
                    ),
                ));
            }
        }
        p.expect('>', "after the function's opset")?;
        let inputs = p.params()?;
        let fattrs = if p.eat('[') {
            p.attributes()?
        } else {
            BTreeMap::new()
        };
        let mut scope: Scope = HashMap::new();
        for v in &inputs {
            if scope.insert(v.name.clone(), (v.ty.clone(), None)).is_some() {
                return Err(p.err_at(fat, format!("function `{name}` takes `{}` twice", v.name)));
            }
        }
        let block = p.block_body(vec![], opset, &mut scope)?;
        p.expect(';', "after a function")?;
        if functions
            .insert(
                name.clone(),
                Function {
                    inputs,
                    opset,
                    block,
                },
            )
            .is_some()
        {
            return Err(p.err_at(fat, format!("function `{name}` is defined twice")));
        }
        function_attributes.insert(name, fattrs);
        if *p.peek() == Tok::Eof {
            return Err(p.err("the file ends before the program's closing `}`"));
        }
    }
    if *p.peek() != Tok::Eof {
        return Err(p.err(format!("unexpected {} after the program", p.peek())));
    }
    if functions.is_empty() {
        bail!("{file}: the program has no functions");
    }
    Ok(ParsedProgram {
        program: Program {
            functions,
            attributes,
            doc: String::new(),
        },
        version,
        function_attributes,
        references_blobs: p.used_blob.get(),
    })
}
