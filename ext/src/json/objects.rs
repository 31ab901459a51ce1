//! core's `json_read` building Ruby objects: the first reader of a body.

use super::body::Build;
use super::keys::rkey;
use super::raw::{raw, rstring, PAIRS};
use magnus::{prelude::*, IntoValue};

/// core's `json_read` building Ruby objects, as
/// [`RubySeed`](super::seed::RubySeed) builds them from serde_json (the
/// same Strings, keys, Integers, Floats, and Hashes filled [`PAIRS`] pairs
/// at a time). Objects not yet in their Array or
/// Hash live on this thread's stack, where Ruby's GC sees them.
pub(super) struct Objects<'a, 'r>(pub(super) &'a mut Build<'r>);

/// A Hash being filled, with the pairs not yet inserted.
pub(super) struct Pairs {
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
