//! A payload as JSON text, byte for byte what `JSON.generate` writes: a
//! walk of the Ruby objects for what its C generator writes itself, and
//! `JSON.generate` for the rest.

use super::raw::{raw, value};
use magnus::{prelude::*, Error, RString, Ruby, Value};

/// The deepest nesting `JSON.generate` writes (its `max_nesting`, 100):
/// deeper goes to `JSON.generate`, which raises its NestingError.
const MAX_NESTING: usize = 100;

/// A payload as JSON text, byte for byte what `JSON.generate` writes, for
/// the values its C generator writes itself: a Hash, an Array or a String
/// of exactly those classes (a subclass, such as ActiveSupport's
/// HashWithIndifferentAccess, has its own `to_json`), String and Symbol
/// keys, a valid UTF-8 or US-ASCII String, an Integer, a finite Float
/// (through its `to_s`, as the generator does), true, false and nil. None
/// for anything else, or for a value `JSON.generate` refuses (NaN,
/// malformed text, nesting past 100): [`encode`] then runs `JSON.generate`
/// itself, with every `to_json` and every error it has. Why not always
/// `JSON.generate`: it was much of what publishing spends in Ruby, and
/// builds a Ruby String of the whole body that is copied again; this walk
/// writes the same bytes without a Ruby String per value, straight into the
/// message's body.
pub fn generate(ruby: &Ruby, payload: Value) -> Option<Vec<u8>> {
    // Sized from the last payload written: a batch sends payloads of much
    // the same size, and growing from a guess copied each one three times.
    let mut out = Vec::with_capacity(LAST_SIZE.get().clamp(64, 64 * 1024) + 64);
    if !write_value(ruby, &mut out, raw(payload), 0) {
        return None;
    }
    LAST_SIZE.set(out.len());
    Some(out)
}

thread_local! {
    static LAST_SIZE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A payload's JSON as a publish sends it: [`generate`]'s walk, or, for what
/// only `JSON.generate` writes, Ruby's `Connection.generate` (which raises
/// EncodingError for what JSON cannot carry). The one place that decides a
/// payload's bytes, for `Connection#encode` and a batch's `_push` alike.
pub fn encode(ruby: &Ruby, payload: Value) -> Result<Vec<u8>, Error> {
    if let Some(bytes) = generate(ruby, payload) {
        return Ok(bytes);
    }
    let connection: magnus::RClass = crate::convert::amqp_const(ruby, "Connection");
    let text: RString = connection.funcall("generate", (payload,))?;
    // SAFETY: the GVL is held; the bytes are copied before Ruby runs again.
    Ok(unsafe { text.as_slice() }.to_vec())
}

/// The class an object has, singleton included (what the generator compares).
fn class_of(v: rb_sys::VALUE) -> rb_sys::VALUE {
    // SAFETY: only called on heap objects (not special constants).
    unsafe { (*(v as *const rb_sys::RBasic)).klass }
}

fn write_value(ruby: &Ruby, out: &mut Vec<u8>, v: rb_sys::VALUE, depth: usize) -> bool {
    use rb_sys::ruby_value_type::*;
    use rb_sys::special_consts::{Qfalse, Qnil, Qtrue};
    if v == Qnil as rb_sys::VALUE {
        out.extend_from_slice(b"null");
        return true;
    }
    if v == Qtrue as rb_sys::VALUE {
        out.extend_from_slice(b"true");
        return true;
    }
    if v == Qfalse as rb_sys::VALUE {
        out.extend_from_slice(b"false");
        return true;
    }
    if rb_sys::FIXNUM_P(v) {
        // SAFETY: a Fixnum.
        write_integer(out, unsafe { rb_sys::FIX2LONG(v) } as i64);
        return true;
    }
    // SAFETY: `v` is a valid object on this thread, which holds the GVL.
    unsafe {
        if rb_sys::RB_FLOAT_TYPE_P(v) {
            let f = rb_sys::rb_float_value(v);
            if !f.is_finite() {
                return false;
            }
            // Float#to_s, as the generator writes it ("1.0e+20", "100.0").
            return match value(v).funcall::<_, _, RString>("to_s", ()) {
                Ok(s) => {
                    out.extend_from_slice(s.as_slice());
                    true
                }
                Err(_) => false,
            };
        }
        if rb_sys::SPECIAL_CONST_P(v) {
            return false; // a Symbol: its to_json is its own (and may be replaced)
        }
        match rb_sys::RB_BUILTIN_TYPE(v) {
            RUBY_T_STRING if class_of(v) == rb_sys::rb_cString => write_string(out, v),
            RUBY_T_BIGNUM => {
                let s = rb_sys::rb_big2str(v, 10);
                out.extend_from_slice(std::slice::from_raw_parts(rb_sys::RSTRING_PTR(s).cast(), rb_sys::RSTRING_LEN(s) as usize));
                true
            }
            RUBY_T_ARRAY if class_of(v) == rb_sys::rb_cArray => {
                if depth >= MAX_NESTING {
                    return false;
                }
                out.push(b'[');
                let len = rb_sys::RARRAY_LEN(v);
                for i in 0..len {
                    if i > 0 {
                        out.push(b',');
                    }
                    // Read by index each time: a Float's to_s could, in
                    // principle, change the array under the walk.
                    if i >= rb_sys::RARRAY_LEN(v) || !write_value(ruby, out, rb_sys::RARRAY_AREF(v, i as isize), depth + 1) {
                        return false;
                    }
                }
                out.push(b']');
                true
            }
            RUBY_T_HASH if class_of(v) == rb_sys::rb_cHash => {
                if depth >= MAX_NESTING {
                    return false;
                }
                out.push(b'{');
                let mut walk = HashWalk { ruby, out, depth, first: true, ok: true };
                rb_sys::rb_hash_foreach(v, Some(each_pair), &mut walk as *mut HashWalk as rb_sys::VALUE);
                let ok = walk.ok;
                out.push(b'}');
                ok
            }
            _ => false,
        }
    }
}

/// `n` in decimal, without the formatting machinery (a payload's ids and
/// quantities are most of its numbers).
fn write_integer(out: &mut Vec<u8>, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut m = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if n < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

struct HashWalk<'a, 'r> {
    ruby: &'r Ruby,
    out: &'a mut Vec<u8>,
    depth: usize,
    first: bool,
    ok: bool,
}

/// One pair of a Hash being written. Never raises (a Ruby exception here
/// would unwind through rb_hash_foreach and this walk): whatever it cannot
/// write stops the walk, and the payload goes to `JSON.generate`.
unsafe extern "C" fn each_pair(key: rb_sys::VALUE, val: rb_sys::VALUE, arg: rb_sys::VALUE) -> std::os::raw::c_int {
    const CONTINUE: std::os::raw::c_int = 0; // ST_CONTINUE
    const STOP: std::os::raw::c_int = 1; // ST_STOP
    let walk = &mut *(arg as *mut HashWalk);
    if !walk.first {
        walk.out.push(b',');
    }
    walk.first = false;
    let key = if rb_sys::RB_SYMBOL_P(key) {
        rb_sys::rb_sym2str(key)
    } else if !rb_sys::SPECIAL_CONST_P(key) && rb_sys::RB_BUILTIN_TYPE(key) == rb_sys::ruby_value_type::RUBY_T_STRING {
        // Any String, subclasses too: the generator writes a key's text.
        key
    } else {
        walk.ok = false;
        return STOP;
    };
    if !write_string(walk.out, key) {
        walk.ok = false;
        return STOP;
    }
    walk.out.push(b':');
    if !write_value(walk.ruby, walk.out, val, walk.depth + 1) {
        walk.ok = false;
        return STOP;
    }
    CONTINUE
}

/// Whether any of the eight bytes in `w` is a control character, `"` or `\\`.
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` is zero exactly where this sets its high bit (the
    // classic test; borrows only ever flag bytes above a zero one, which are
    // then looked at one by one anyway).
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    (below_space | zero(w ^ (ONES * b'"' as u64)) | zero(w ^ (ONES * b'\\' as u64))) != 0
}

/// A String as the generator writes it: `"` and `\` escaped, control
/// characters as `\n`, `\r`, `\t`, `\f`, `\b` or `\u00XX` (lowercase),
/// everything else as it is (`/`, DEL and U+2028 included). False for text
/// that is not valid UTF-8 or US-ASCII, which the generator converts or
/// refuses.
fn write_string(out: &mut Vec<u8>, s: rb_sys::VALUE) -> bool {
    // SAFETY: `s` is a String; its bytes are read before Ruby runs again.
    let bytes = unsafe {
        let enc = rb_sys::rb_enc_get_index(s);
        if enc != rb_sys::rb_utf8_encindex() && enc != rb_sys::rb_usascii_encindex() {
            return false;
        }
        let range = rb_sys::rb_enc_str_coderange(s) as u32;
        if range == rb_sys::ruby_coderange_type::RUBY_ENC_CODERANGE_BROKEN as u32 {
            return false;
        }
        std::slice::from_raw_parts(rb_sys::RSTRING_PTR(s).cast::<u8>(), rb_sys::RSTRING_LEN(s) as usize)
    };
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Eight bytes at a time while none of them needs escaping: most text
        // has nothing to escape, and a byte at a time was most of the walk.
        if i + 8 <= bytes.len() {
            let word = u64::from_le_bytes(bytes[i..i + 8].try_into().expect("eight bytes"));
            if !needs_escape(word) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x0c => b"\\f",
            0x08 => b"\\b",
            0x00..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]]);
                i += 1;
                start = i;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        i += 1;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
    true
}
