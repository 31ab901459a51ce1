//! JSON to Ruby objects, as `JSON.parse` would build them (string keys,
//! frozen): a payload straight from its bytes (`body_to_ruby`), headers and
//! events from serde_json values.

use magnus::{prelude::*, Error, IntoValue, RArray, RHash, RString, Ruby, Value};
use serde_json::Value as Json;

pub fn to_ruby(ruby: &Ruby, v: &Json) -> Result<Value, Error> {
    to_ruby_noting(ruby, v, &mut false)
}

/// A JSON object (headers) as a Ruby Hash, without copying it first.
pub fn map_to_ruby(ruby: &Ruby, map: &serde_json::Map<String, Json>) -> Result<Value, Error> {
    let h: RHash = ruby.hash_new();
    for (k, item) in map {
        let key = ruby.str_new(k);
        key.freeze();
        h.aset(key, to_ruby_noting(ruby, item, &mut false)?)?;
    }
    Ok(h.into_value_with(ruby))
}

/// Whether `body` has a number (outside strings) with 16 or more digits.
fn long_number(body: &[u8]) -> bool {
    let (mut in_string, mut escaped, mut digits) = (false, false, 0usize);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                digits = 0;
            }
            b'0'..=b'9' => {
                digits += 1;
                if digits >= 16 {
                    return true;
                }
            }
            b'.' => {}
            _ => digits = 0,
        }
    }
    false
}

fn to_ruby_noting(ruby: &Ruby, v: &Json, saw_float: &mut bool) -> Result<Value, Error> {
    Ok(match v {
        Json::Null => ruby.qnil().into_value_with(ruby),
        Json::Bool(b) => b.into_value_with(ruby),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_value_with(ruby)
            } else if let Some(u) = n.as_u64() {
                u.into_value_with(ruby)
            } else {
                *saw_float = true;
                n.as_f64().unwrap_or(f64::NAN).into_value_with(ruby)
            }
        }
        Json::String(s) => ruby.str_new(s).into_value_with(ruby),
        Json::Array(a) => {
            let arr: RArray = ruby.ary_new_capa(a.len());
            for item in a {
                arr.push(to_ruby_noting(ruby, item, saw_float)?)?;
            }
            arr.into_value_with(ruby)
        }
        Json::Object(o) => {
            let h: RHash = ruby.hash_new();
            for (k, item) in o {
                let key = ruby.str_new(k);
                key.freeze();
                h.aset(key, to_ruby_noting(ruby, item, saw_float)?)?;
            }
            h.into_value_with(ruby)
        }
    })
}

pub fn parse(ruby: &Ruby, text: &str, what: &str) -> Result<Json, Error> {
    serde_json::from_str(text).map_err(|e| {
        crate::errors::to_ruby(ruby, acemq::Error::new(acemq::ErrorKind::Encoding, format!("{what} is not valid JSON: {e}")))
    })
}

/// A JSON body straight to Ruby objects, in one pass over the bytes: no
/// serde_json `Value` built and dropped on the way. Built as `JSON.parse`
/// builds them; a body whose numbers a float cannot hold exactly goes to
/// `JSON.parse` itself, as `payload_to_ruby` does.
///
/// Text, not bytes: the parser then takes its strings as they are, where
/// from bytes it checks each one is UTF-8 again, which core has already
/// done for this body.
pub fn body_to_ruby(ruby: &Ruby, body: &str) -> Result<Value, Error> {
    match build(ruby, body) {
        Ok(Built::Value(v)) => Ok(v),
        Ok(Built::Later) => {
            let json: magnus::RModule = ruby.class_object().const_get("JSON")?;
            json.funcall("parse", (ruby.str_new(body),))
        }
        Err(e) => Err(not_json(ruby, e)),
    }
}

/// What [`build`] made of a JSON body.
pub enum Built {
    Value(Value),
    /// JSON, with a number a float cannot hold exactly: `JSON.parse` builds
    /// it ([`body_to_ruby`]), as `payload_to_ruby` does.
    Later,
}

/// A body into Ruby objects, or what the parser said when it is not JSON:
/// the one read of a consumed delivery's body (core's
/// `Consumer::fetch_blocking`), check and build in one pass.
///
/// Read by core's `json_read` first ([`Objects`]); what that leaves (text
/// that is not JSON, and the few kinds of JSON it does not take) is read by
/// serde_json, which builds the same objects or says what is wrong.
pub fn build(ruby: &Ruby, body: &str) -> Result<Built, serde_json::Error> {
    let mut state = Build { ruby, saw_float: false, keys: 0 };
    if let Some(v) = acemq::json_read::read(body, &mut Objects(&mut state)) {
        return Ok(if state.saw_float && long_number(body.as_bytes()) { Built::Later } else { Built::Value(value(v)) });
    }
    let mut state = Build { ruby, saw_float: false, keys: 0 };
    let mut de = serde_json::Deserializer::from_str(body);
    let v = serde::de::DeserializeSeed::deserialize(RubySeed(&mut state), &mut de)?;
    de.end()?;
    Ok(if state.saw_float && long_number(body.as_bytes()) { Built::Later } else { Built::Value(v) })
}

/// [`build`] under `rb_protect`: called from inside a consumer's `_next`,
/// where an exception Ruby raises mid-build (NoMemoryError) must not jump
/// over the delivery in hand. Such a build is `Later`: the payload is then
/// built when the handler reads it, and raises there.
pub fn build_protected(ruby: &Ruby, body: &str) -> Result<Built, serde_json::Error> {
    let mut out = None;
    let protected = magnus::rb_sys::protect(|| {
        out = Some(build(ruby, body));
        raw(ruby.qnil().as_value())
    });
    match (protected, out) {
        (Ok(_), Some(built)) => built,
        _ => Ok(Built::Later),
    }
}

/// A payload that cannot be read as JSON, as the Ruby error it raises.
pub fn not_json(ruby: &Ruby, why: impl std::fmt::Display) -> Error {
    crate::errors::to_ruby(ruby, acemq::Error::new(acemq::ErrorKind::Encoding, format!("payload is not valid JSON: {why}")))
}

struct Build<'r> {
    ruby: &'r Ruby,
    saw_float: bool,
    /// Keys read so far: the next one's place in the payload ([`Keys::get`]).
    keys: usize,
}

struct RubySeed<'a, 'r>(&'a mut Build<'r>);

impl<'de> serde::de::DeserializeSeed<'de> for RubySeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

// The payload is built with Ruby's C API directly rather than through
// magnus's checked wrappers: every object here is one this function just
// made (a fresh Hash or Array, a String), so the only exception any of these
// calls can raise is NoMemoryError, which magnus's own allocators let through
// as well; magnus's `aset`/`push` wrap each call in rb_protect for the
// general case (a frozen receiver, a key whose #hash raises), and on a 1 KiB
// payload of some 40 objects that wrapping was a tenth of the build.
// Values live on this thread's stack or inside the object being built until
// they are returned, where Ruby's GC sees them.

/// A String of `s`, UTF-8 (serde_json has checked it is).
///
/// Made as `rb_utf8_str_new` makes it, a binary String then given UTF-8,
/// but with the encoding's index written into the new String's flags
/// directly (Ruby's own `ENCODING_SET_INLINED`): `rb_enc_associate_index`
/// first checks that the String is not frozen, looks up both encodings and
/// compares them, for every String of every payload, where a String made
/// here is always new and always UTF-8. Its code range is left unknown, as
/// `rb_utf8_str_new` leaves it.
fn rstring(s: &str) -> rb_sys::VALUE {
    // SAFETY: called with the GVL held (a handler's thread, reading its
    // payload); the String was made just now, by this thread, and nothing
    // else has seen it.
    unsafe {
        let string = rb_sys::rb_str_new(s.as_ptr().cast(), s.len() as _);
        let basic = string as *mut rb_sys::RBasic;
        (*basic).flags = ((*basic).flags & !ENCODING_MASK) | utf8_flag();
        string
    }
}

/// Where a String's flags keep its encoding's index, when it is one of
/// the first 127 (UTF-8 is the second, index 1, in every Ruby since 2.0).
const ENCODING_MASK: rb_sys::VALUE = rb_sys::ruby_encoding_consts::RUBY_ENCODING_MASK as rb_sys::VALUE;

/// UTF-8's index, in place in a String's flags.
fn utf8_flag() -> rb_sys::VALUE {
    static FLAG: std::sync::OnceLock<rb_sys::VALUE> = std::sync::OnceLock::new();
    *FLAG.get_or_init(|| {
        // SAFETY: a lookup in Ruby's table of encodings, GVL held.
        let index = unsafe { rb_sys::rb_utf8_encindex() };
        assert!((0..rb_sys::ruby_encoding_consts::RUBY_ENCODING_INLINE_MAX as i32).contains(&index));
        (index as rb_sys::VALUE) << rb_sys::ruby_encoding_consts::RUBY_ENCODING_SHIFT as u32
    })
}

/// A Hash key: the frozen, deduplicated String Ruby keeps for that text
/// (what `Hash#[]=` would make of a String key anyway, here without
/// allocating one first when the same key was seen before).
fn rkey(s: &str, place: usize) -> rb_sys::VALUE {
    // SAFETY: only ever called with the GVL held (a payload being built),
    // and `get` does not call back into here.
    unsafe { (*KEYS.0.get()).get(s, place) }
}

/// The keys interned so far, by their text. A payload's keys are the same
/// from one message to the next, and Ruby's interning looks each one up in
/// its table of frozen strings, hashing the text every time; a table of our
/// own, with std's keyed hash, does less work for each key.
/// The keys also come in the same order from one message to the next, so
/// each place in a payload (its 1st key, 2nd, ...) remembers the key it
/// held last time, and a key that matches it is one comparison of its text,
/// without the hash at all.
///
/// Bounded: keys up to [`KEY_TEXT`] bytes, [`KEY_SLOTS`] of them, kept for
/// the life of the process (pinned: a GC compaction must not move a String
/// whose address this table holds); past that, keys are interned as
/// before (a peer that sends thousands of distinct keys fills the table
/// with its own and leaves the rest at that speed, no slower). Under a
/// MiB, whatever the payloads.
struct Keys {
    /// The Strings, each slot's address registered with the GC once filled.
    /// Never grown past its first capacity, so the addresses stay put.
    slots: Vec<rb_sys::VALUE>,
    /// std's hasher, keyed per process: keys come from the network, and a
    /// peer must not be able to pick texts that all land in one bucket.
    index: Option<std::collections::HashMap<Box<str>, usize>>,
    /// Each slot's text, as `index` has it.
    texts: Vec<Box<str>>,
    /// By place in the last payload read, the slot of the key it held.
    /// Equal texts only: a peer choosing the keys gains nothing here.
    places: Vec<usize>,
}

const KEY_SLOTS: usize = 4096;
const KEY_TEXT: usize = 64;
/// The places remembered: a payload's first keys, where a message of a
/// given type has the same ones each time.
const KEY_PLACES: usize = 64;

/// The table, behind the GVL rather than a lock of its own: every payload
/// is built with the GVL held, so no two builds meet here, and a Mutex
/// taken for each key would be paid for every key of every message, for
/// nothing. Nor can an exception Ruby raises mid-lookup (NoMemoryError
/// from interning), which unwinds past Rust frames without running them,
/// leave a lock held behind it.
static KEYS: GvlCell = GvlCell(std::cell::UnsafeCell::new(Keys {
    slots: Vec::new(),
    index: None,
    texts: Vec::new(),
    places: Vec::new(),
}));

struct GvlCell(std::cell::UnsafeCell<Keys>);

// SAFETY: read and written only with the GVL held ([`rkey`]), which admits
// one thread at a time.
unsafe impl Sync for GvlCell {}

impl Keys {
    /// The key `s`, read as the `place`th key of its payload.
    fn get(&mut self, s: &str, place: usize) -> rb_sys::VALUE {
        if let Some(&i) = self.places.get(place) {
            if *self.texts[i] == *s {
                return self.slots[i];
            }
        }
        let index = self.index.get_or_insert_with(std::collections::HashMap::new);
        if let Some(&i) = index.get(s) {
            self.remember(place, i);
            return self.slots[i];
        }
        // SAFETY: as rstring; rb_enc_interned_str copies the bytes.
        let key = unsafe { rb_sys::rb_enc_interned_str(s.as_ptr().cast(), s.len() as _, rb_sys::rb_utf8_encoding()) };
        if s.len() > KEY_TEXT || index.len() >= KEY_SLOTS {
            return key;
        }
        if self.slots.capacity() == 0 {
            self.slots.reserve_exact(KEY_SLOTS);
        }
        let i = self.slots.len();
        self.slots.push(key);
        // SAFETY: the GVL is held (a payload is being built); the slot's
        // address is stable (the Vec never grows past KEY_SLOTS) and lives
        // as long as the process, as the registration does.
        unsafe { rb_sys::rb_gc_register_address(self.slots.as_mut_ptr().add(i)) };
        index.insert(s.into(), i);
        self.texts.push(s.into());
        self.remember(place, i);
        key
    }

    fn remember(&mut self, place: usize, slot: usize) {
        if let Some(p) = self.places.get_mut(place) {
            *p = slot;
        } else if place == self.places.len() && place < KEY_PLACES {
            self.places.push(slot);
        }
    }
}


fn value(raw: rb_sys::VALUE) -> Value {
    use magnus::rb_sys::FromRawValue;
    // SAFETY: `raw` is an object just built by the C API on this thread.
    unsafe { Value::from_raw(raw) }
}

fn raw(v: Value) -> rb_sys::VALUE {
    use magnus::rb_sys::AsRawValue;
    v.as_raw()
}

/// A map key, straight from the bytes (a `Cow<str>` key would be an owned
/// String each time: serde's `Cow` never borrows).
struct KeySeed<'a, 'r>(&'a mut Build<'r>);

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed<'_, '_> {
    type Value = rb_sys::VALUE;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<rb_sys::VALUE, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed<'_, '_> {
    type Value = rb_sys::VALUE;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<rb_sys::VALUE, E> {
        let place = self.0.keys;
        self.0.keys += 1;
        Ok(rkey(s, place))
    }
}

impl<'de> serde::de::Visitor<'de> for RubySeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(self.0.ruby.qnil().into_value_with(self.0.ruby))
    }
    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(b.into_value_with(self.0.ruby))
    }
    fn visit_i64<E: serde::de::Error>(self, i: i64) -> Result<Value, E> {
        Ok(i.into_value_with(self.0.ruby))
    }
    fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Value, E> {
        Ok(u.into_value_with(self.0.ruby))
    }
    fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Value, E> {
        self.0.saw_float = true;
        Ok(f.into_value_with(self.0.ruby))
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(value(rstring(s)))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let arr = raw(self.0.ruby.ary_new_capa(seq.size_hint().unwrap_or(0)).as_value());
        while let Some(item) = seq.next_element_seed(RubySeed(self.0))? {
            // SAFETY: a fresh, unfrozen Array; the GVL is held.
            unsafe { rb_sys::rb_ary_push(arr, raw(item)) };
        }
        Ok(value(arr))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let h = raw(self.0.ruby.hash_new().as_value());
        // The pairs go in PAIRS at a time (a payload's objects mostly have
        // fewer keys: one insert each), through rb_hash_bulk_insert, which
        // is Hash#[]= for each pair in order (a repeated key: the last one
        // wins) without its checks of a receiver and key this function
        // made, once for every pair (rb_hash_aset would make them again).
        // Held on this stack until inserted, where Ruby's GC sees them.
        let mut pairs = [0 as rb_sys::VALUE; 2 * PAIRS];
        let mut len = 0;
        while let Some(key) = map.next_key_seed(KeySeed(self.0))? {
            let item = map.next_value_seed(RubySeed(self.0))?;
            pairs[len] = key;
            pairs[len + 1] = raw(item);
            len += 2;
            if len == pairs.len() {
                // SAFETY: a fresh, unfrozen Hash, frozen String keys, an
                // even count; the GVL is held.
                unsafe { rb_sys::rb_hash_bulk_insert(len as _, pairs.as_ptr(), h) };
                len = 0;
            }
        }
        if len > 0 {
            // SAFETY: as above.
            unsafe { rb_sys::rb_hash_bulk_insert(len as _, pairs.as_ptr(), h) };
        }
        std::hint::black_box(&pairs);
        Ok(value(h))
    }
}

/// core's `json_read` building Ruby objects, as [`RubySeed`] builds them
/// from serde_json (the same Strings, keys, Integers, Floats, and Hashes
/// filled [`PAIRS`] pairs at a time). Objects not yet in their Array or
/// Hash live on this thread's stack, where Ruby's GC sees them.
struct Objects<'a, 'r>(&'a mut Build<'r>);

/// A Hash being filled, with the pairs not yet inserted.
struct Pairs {
    hash: rb_sys::VALUE,
    pairs: [rb_sys::VALUE; 2 * PAIRS],
    len: usize,
}

impl Pairs {
    fn flush(&mut self) {
        if self.len > 0 {
            // SAFETY: a fresh, unfrozen Hash, frozen String keys, an even
            // count; the GVL is held.
            unsafe { rb_sys::rb_hash_bulk_insert(self.len as _, self.pairs.as_ptr(), self.hash) };
            self.len = 0;
        }
    }
}

impl acemq::json_read::Builder for Objects<'_, '_> {
    type Value = rb_sys::VALUE;
    type Key = rb_sys::VALUE;
    type Array = rb_sys::VALUE;
    type Object = Pairs;
    fn null(&mut self) -> rb_sys::VALUE {
        raw(self.0.ruby.qnil().as_value())
    }
    fn bool(&mut self, b: bool) -> rb_sys::VALUE {
        raw(b.into_value_with(self.0.ruby))
    }
    fn int(&mut self, i: i64) -> rb_sys::VALUE {
        raw(i.into_value_with(self.0.ruby))
    }
    fn float(&mut self, f: f64) -> rb_sys::VALUE {
        self.0.saw_float = true;
        raw(f.into_value_with(self.0.ruby))
    }
    fn string(&mut self, s: &str) -> rb_sys::VALUE {
        rstring(s)
    }
    fn key(&mut self, s: &str, place: usize) -> rb_sys::VALUE {
        rkey(s, place)
    }
    fn array(&mut self) -> rb_sys::VALUE {
        raw(self.0.ruby.ary_new().as_value())
    }
    fn push(&mut self, array: &mut rb_sys::VALUE, v: rb_sys::VALUE) {
        // SAFETY: a fresh, unfrozen Array; the GVL is held.
        unsafe { rb_sys::rb_ary_push(*array, v) };
    }
    fn end_array(&mut self, array: rb_sys::VALUE) -> rb_sys::VALUE {
        array
    }
    fn object(&mut self) -> Pairs {
        Pairs { hash: raw(self.0.ruby.hash_new().as_value()), pairs: [0; 2 * PAIRS], len: 0 }
    }
    fn insert(&mut self, object: &mut Pairs, k: rb_sys::VALUE, v: rb_sys::VALUE) {
        object.pairs[object.len] = k;
        object.pairs[object.len + 1] = v;
        object.len += 2;
        if object.len == object.pairs.len() {
            object.flush();
        }
    }
    fn end_object(&mut self, mut object: Pairs) -> rb_sys::VALUE {
        object.flush();
        std::hint::black_box(&object.pairs);
        object.hash
    }
}

/// The pairs [`RubySeed`] puts into a Hash at once: a small Hash's most
/// (Ruby keeps up to 8 pairs in an array, not a table).
const PAIRS: usize = 8;

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
