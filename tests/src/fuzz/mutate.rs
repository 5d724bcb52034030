//! Mutators: byte-level (bit flips, interesting bytes, inserts, deletes, duplicated chunks, splices with another
//! corpus entry, truncation, dictionary tokens, invalid UTF-8, deep nesting), JSON trees (a random node replaced
//! by an interesting value or nested deeply, keys removed or added, arrays shrunk or grown, types changed) and
//! protobuf wire format (fields re-encoded with overlong varints, huge or short lengths, unknown fields, bad wire
//! types, group markers, recursively into nested messages).

use crate::crashtrial::Rng;
use serde_json::{Map, Number, Value};

/// Picks an element of a non-empty slice.
pub fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.range(0, items.len() as u64 - 1) as usize]
}

/// Text tokens that tend to break parsers: numeric extremes, special floats, JSON fragments, escapes.
pub const TEXT_TOKENS: &[&str] = &[
    "0",
    "-1",
    "1",
    "-0",
    "0.5",
    "1e308",
    "-1e308",
    "1e400",
    "NaN",
    "Infinity",
    "2147483647",
    "-2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "null",
    "true",
    "false",
    "\"\"",
    "[]",
    "{}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\u202e\"",
    "\\",
    "\"",
    ",",
    ":",
    "%",
    "%00",
    "%FF",
    "%C3%28",
    "&",
    "=",
    "+",
    "/",
    "..",
    "\u{0}",
    "\u{1b}[2J",
    "\u{200b}",
    "\u{2028}",
    "\u{feff}",
    "\u{1f600}",
    "2026-01-02T03:04:05Z",
    "0000-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
    "1970-01-01T00:00:00Z",
    "30d",
    "0s",
    "99999999999999999999d",
];

/// Byte sequences that are not UTF-8 (lone continuation bytes, truncated sequences, surrogates, overlongs).
const INVALID_UTF8: &[&[u8]] =
    &[&[0xff], &[0x80], &[0xc3, 0x28], &[0xe2, 0x82], &[0xf0, 0x9f, 0x98], &[0xed, 0xa0, 0x80], &[0xc0, 0x80]];

/// Single bytes worth trying.
const BYTES: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'%', b'&', b'=', b'/', b'0', b'9', b'-',
    b'.',
];

/// One byte-level mutation of `buf`. `dict` adds format-specific tokens to [`TEXT_TOKENS`].
pub fn bytes(rng: &mut Rng, buf: &mut Vec<u8>, corpus: &[Vec<u8>], dict: &[Vec<u8>]) {
    let len = buf.len();
    let pos = |rng: &mut Rng, len: usize| rng.range(0, len as u64) as usize;
    match rng.range(0, 11) {
        0 if len > 0 => {
            for _ in 0..rng.range(1, 4) {
                let i = rng.range(0, len as u64 - 1) as usize;
                buf[i] ^= 1 << rng.range(0, 7);
            }
        }
        1 if len > 0 => {
            let i = rng.range(0, len as u64 - 1) as usize;
            buf[i] = *pick(rng, BYTES);
        }
        2 => {
            let at = pos(rng, len);
            let n = rng.range(1, 16) as usize;
            let ins: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            buf.splice(at..at, ins);
        }
        3 if len > 0 => {
            let at = rng.range(0, len as u64 - 1) as usize;
            let n = (rng.range(1, 64) as usize).min(len - at);
            buf.drain(at..at + n);
        }
        4 if len > 0 => {
            // A duplicated chunk, possibly many times over.
            let at = rng.range(0, len as u64 - 1) as usize;
            let n = (rng.range(1, 256) as usize).min(len - at);
            let chunk = buf[at..at + n].to_vec();
            let copies = if rng.chance(0.1) { rng.range(2, 200) } else { 1 } as usize;
            let to = pos(rng, len);
            buf.splice(to..to, chunk.repeat(copies));
        }
        5 if !corpus.is_empty() => {
            // Splice: a prefix of this input and a suffix of another.
            let other = pick(rng, corpus);
            let cut = pos(rng, len);
            let from = rng.range(0, other.len() as u64) as usize;
            buf.truncate(cut);
            buf.extend_from_slice(&other[from..]);
        }
        6 if len > 0 => buf.truncate(rng.range(0, len as u64 - 1) as usize),
        7 | 8 => {
            let token: Vec<u8> = if !dict.is_empty() && rng.chance(0.5) {
                pick(rng, dict).clone()
            } else {
                pick(rng, TEXT_TOKENS).as_bytes().to_vec()
            };
            let at = pos(rng, len);
            if rng.chance(0.5) || len == 0 {
                buf.splice(at..at, token);
            } else {
                let end = (at + token.len()).min(len);
                buf.splice(at..end, token);
            }
        }
        9 => {
            let at = pos(rng, len);
            buf.splice(at..at, pick(rng, INVALID_UTF8).iter().copied());
        }
        10 => {
            // Deep nesting, textually (a parser's recursion limit, or its stack).
            let depth = *pick(rng, &[64usize, 127, 128, 129, 1000, 20_000]);
            let (open, close) = if rng.chance(0.5) { ("[", "]") } else { ("{\"a\":", "}") };
            let at = pos(rng, len);
            let mut nest = open.repeat(depth).into_bytes();
            if rng.chance(0.7) {
                nest.extend_from_slice(b"1");
                nest.extend_from_slice(close.repeat(depth).as_bytes());
            }
            buf.splice(at..at, nest);
        }
        _ => {
            let at = pos(rng, len);
            buf.insert(at, rng.next_u64() as u8);
        }
    }
}

/// Interesting JSON numbers.
fn number(rng: &mut Rng) -> Value {
    match rng.range(0, 14) {
        0 => Value::from(0),
        1 => Value::from(-1),
        2 => Value::from(i64::MAX),
        3 => Value::from(i64::MIN),
        4 => Value::from(u64::MAX),
        5 => Value::from(u32::MAX),
        6 => Value::from(u64::from(u32::MAX) + 1),
        7 => Value::from(i64::from(i32::MIN)),
        8 => Number::from_f64(1e308).map_or(Value::Null, Value::Number),
        9 => Number::from_f64(-1e308).map_or(Value::Null, Value::Number),
        10 => Number::from_f64(0.5).map_or(Value::Null, Value::Number),
        11 => Number::from_f64(-0.0).map_or(Value::Null, Value::Number),
        12 => Value::from(9_007_199_254_740_993u64),
        13 => Value::from(rng.range(0, 20_000_000_000) as i64 - 10_000_000_000),
        _ => Value::from(rng.next_u64() as i64),
    }
}

/// Interesting JSON strings; `dict` holds strings from the seeds.
fn string(rng: &mut Rng, dict: &[String]) -> Value {
    Value::String(match rng.range(0, 10) {
        0 => String::new(),
        1 => "A".repeat(*pick(rng, &[64usize, 129, 257, 1025, 70_000])),
        2 => "\u{0}\u{1b}\n\t".into(),
        3 => "a\u{200b}b\u{202e}c".into(),
        4 => "x\u{2028}y".into(),
        5 => "\u{1f600}\u{e9}\u{4e2d}".into(),
        6 => pick(rng, TEXT_TOKENS).to_string(),
        7 => rng.next_u64().to_string(),
        _ if !dict.is_empty() => pick(rng, dict).clone(),
        _ => "x".into(),
    })
}

/// An interesting JSON value of any type.
fn value(rng: &mut Rng, dict: &[String]) -> Value {
    match rng.range(0, 9) {
        0..=2 => number(rng),
        3..=5 => string(rng, dict),
        6 => Value::Null,
        7 => Value::Bool(rng.chance(0.5)),
        8 => Value::Array((0..rng.range(0, 3)).map(|_| number(rng)).collect()),
        _ => Value::Object(Map::new()),
    }
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count_nodes).sum(),
        Value::Object(o) => o.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// The `k`-th node in pre-order, counting down `k`.
fn nth_node<'a>(v: &'a mut Value, k: &mut usize) -> Option<&'a mut Value> {
    if *k == 0 {
        return Some(v);
    }
    *k -= 1;
    match v {
        Value::Array(a) => a.iter_mut().find_map(|x| nth_node(x, k)),
        Value::Object(o) => o.values_mut().find_map(|x| nth_node(x, k)),
        _ => None,
    }
}

/// One structural mutation of a JSON tree. `keys` and `strings` come from the seeds.
pub fn json(rng: &mut Rng, root: &mut Value, keys: &[String], strings: &[String]) {
    let mut k = rng.range(0, count_nodes(root) as u64 - 1) as usize;
    let Some(node) = nth_node(root, &mut k) else { return };
    match rng.range(0, 9) {
        0..=2 => *node = value(rng, strings),
        3 => {
            // Same value, other type: numbers as strings and back.
            *node = match node.take() {
                Value::Number(n) => Value::String(n.to_string()),
                Value::String(s) => s.parse::<f64>().ok().and_then(Number::from_f64).map_or(Value::Null, Value::Number),
                Value::Array(mut a) => a.pop().unwrap_or(Value::Null),
                other => Value::Array(vec![other]),
            }
        }
        4 => {
            // Deep nesting (serde_json's recursion limit is 128).
            let depth = *pick(rng, &[10usize, 126, 127, 128, 200]);
            let mut v = node.take();
            for _ in 0..depth {
                v = if rng.chance(0.5) {
                    Value::Array(vec![v])
                } else {
                    Value::Object(Map::from_iter([("a".into(), v)]))
                };
            }
            *node = v;
        }
        5 => match node {
            Value::Object(o) if !o.is_empty() => {
                let i = rng.range(0, o.len() as u64 - 1) as usize;
                if let Some(key) = o.keys().nth(i).cloned() {
                    o.remove(&key);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                let i = rng.range(0, a.len() as u64 - 1) as usize;
                a.remove(i);
            }
            _ => *node = Value::Null,
        },
        6 => match node {
            Value::Object(o) => {
                let key = if !keys.is_empty() && rng.chance(0.8) { pick(rng, keys).clone() } else { "zz".into() };
                o.insert(key, value(rng, strings));
            }
            Value::Array(a) if !a.is_empty() => {
                // Duplicated elements: many copies of one entry.
                let i = rng.range(0, a.len() as u64 - 1) as usize;
                let size = serde_json::to_vec(&a[i]).map_or(usize::MAX, |b| b.len().max(1));
                let copies = (*pick(rng, &[1usize, 2, 10, 1000])).min((256 << 10) / size);
                for _ in 0..copies {
                    a.push(a[i].clone());
                }
            }
            _ => *node = Value::Object(Map::new()),
        },
        7 => {
            if let Value::Number(n) = node {
                *node = match (n.as_i64(), rng.range(0, 3)) {
                    (Some(i), 0) => Value::from(i.wrapping_neg()),
                    (Some(i), 1) => Value::from(i.wrapping_add(rng.range(0, 2) as i64 - 1)),
                    (Some(i), 2) => Value::from(i.wrapping_mul(1000)),
                    _ => number(rng),
                };
            } else if let Value::String(s) = node {
                // A character or two changed, inserted or removed.
                let mut b = std::mem::take(s).into_bytes();
                bytes(rng, &mut b, &[], &[]);
                *s = String::from_utf8_lossy(&b).into_owned();
            }
        }
        _ => {
            if let Value::Array(a) = node {
                a.clear();
            } else {
                *node = string(rng, strings);
            }
        }
    }
}

/// Every object key and short string value in `v` (a mutation dictionary).
pub fn json_dictionary(v: &Value, keys: &mut Vec<String>, strings: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
                json_dictionary(x, keys, strings);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| json_dictionary(x, keys, strings)),
        Value::String(s) if s.len() <= 64 && !strings.contains(s) => strings.push(s.clone()),
        _ => {}
    }
}

/// A varint, padded to `width` bytes with continuation bytes (overlong, as decoders may accept up to 10 bytes).
pub fn varint(mut v: u64, width: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
    while out.len() < width {
        if let Some(last) = out.last_mut() {
            *last |= 0x80;
        }
        out.push(0);
    }
    out
}

fn read_varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One field of a protobuf message on the wire.
enum Field {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Vec<u8>),
    Fixed32([u8; 4]),
}

/// Splits a message into its fields; None if it is not well-formed.
fn fields(buf: &[u8]) -> Option<Vec<(u64, Field)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let key = read_varint(buf, &mut at)?;
        let f = match key & 7 {
            0 => Field::Varint(read_varint(buf, &mut at)?),
            1 => {
                let b: [u8; 8] = buf.get(at..at + 8)?.try_into().ok()?;
                at += 8;
                Field::Fixed64(b)
            }
            2 => {
                let n = usize::try_from(read_varint(buf, &mut at)?).ok()?;
                let b = buf.get(at..at.checked_add(n)?)?.to_vec();
                at += n;
                Field::Bytes(b)
            }
            5 => {
                let b: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
                at += 4;
                Field::Fixed32(b)
            }
            _ => return None,
        };
        out.push((key >> 3, f));
    }
    Some(out)
}

/// Re-encodes a message field by field, each varint (keys, values, lengths) sometimes overlong, nested messages
/// rewritten the same way (depth-limited), and one field sometimes damaged: a huge or short length, a bad wire
/// type, a group marker, an 11-byte varint, an unknown field, a duplicated field.
pub fn protobuf(rng: &mut Rng, buf: &[u8], depth: u32) -> Option<Vec<u8>> {
    let fs = fields(buf)?;
    let width = |rng: &mut Rng| if rng.chance(0.15) { rng.range(2, 10) as usize } else { 0 };
    let damage = if fs.is_empty() { 0 } else { rng.range(0, fs.len() as u64 - 1) as usize };
    let damage_kind = if rng.chance(if depth == 0 { 0.5 } else { 0.2 }) { rng.range(0, 8) } else { 99 };
    let mut out = Vec::with_capacity(buf.len() + 16);
    for (i, (num, f)) in fs.iter().enumerate() {
        let wt = match f {
            Field::Varint(_) => 0,
            Field::Fixed64(_) => 1,
            Field::Bytes(_) => 2,
            Field::Fixed32(_) => 5,
        };
        let mut key = varint((num << 3) | wt, width(rng));
        if i == damage {
            match damage_kind {
                0 => {
                    // A length far beyond the message.
                    out.extend_from_slice(&varint((num << 3) | 2, 0));
                    out.extend_from_slice(&varint(
                        *pick(rng, &[u64::from(u32::MAX), u64::MAX >> 1, 1 << 40, 0x7fff_ffff]),
                        0,
                    ));
                    continue;
                }
                1 => key = varint((num << 3) | rng.range(3, 7), 0),
                2 => out.extend_from_slice(&[0x80; 11]),
                3 => out.extend_from_slice(&varint((rng.range(16, 1 << 29) << 3) | rng.range(0, 2), 0)),
                4 => key = varint(wt, 0),
                5 => out.extend_from_slice(&varint(0, 0)),
                6 => {
                    if let Field::Bytes(b) = f {
                        // A length one short or one long.
                        out.extend_from_slice(&key);
                        let n = if rng.chance(0.5) { b.len() + 1 } else { b.len().saturating_sub(1) };
                        out.extend_from_slice(&varint(n as u64, 0));
                        out.extend_from_slice(b);
                        continue;
                    }
                }
                _ => {}
            }
        }
        out.extend_from_slice(&key);
        match f {
            Field::Varint(v) => {
                let v = if rng.chance(0.05) {
                    *pick(rng, &[0, u64::MAX, u64::from(u32::MAX), 1 << 31, 1 << 63])
                } else {
                    *v
                };
                out.extend_from_slice(&varint(v, width(rng)));
            }
            Field::Fixed64(b) => out.extend_from_slice(b),
            Field::Fixed32(b) => out.extend_from_slice(b),
            Field::Bytes(b) => {
                let inner = if depth < 3 && rng.chance(0.5) { protobuf(rng, b, depth + 1) } else { None };
                let inner = inner.unwrap_or_else(|| b.clone());
                out.extend_from_slice(&varint(inner.len() as u64, width(rng)));
                out.extend_from_slice(&inner);
            }
        }
        if i == damage && damage_kind == 7 {
            // The same field again, several times.
            let mut copy = key.clone();
            match f {
                Field::Varint(v) => copy.extend_from_slice(&varint(*v, 0)),
                Field::Fixed64(b) => copy.extend_from_slice(b),
                Field::Fixed32(b) => copy.extend_from_slice(b),
                Field::Bytes(b) => {
                    copy.extend_from_slice(&varint(b.len() as u64, 0));
                    copy.extend_from_slice(b);
                }
            }
            for _ in 0..rng.range(1, 64) {
                out.extend_from_slice(&copy);
            }
        }
    }
    Some(out)
}
