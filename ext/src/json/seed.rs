//! serde_json's deserializer building Ruby objects straight from the text,
//! for what core's `json_read` leaves ([`build`](super::body::build)).

use super::body::Build;
use super::keys::rkey;
use super::raw::{raw, rstring, value, PAIRS};
use magnus::{prelude::*, IntoValue, Value};

pub(super) struct RubySeed<'a, 'r>(pub(super) &'a mut Build<'r>);

impl<'de> serde::de::DeserializeSeed<'de> for RubySeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
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
