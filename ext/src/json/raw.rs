//! The readers build a payload with Ruby's C API directly rather than
//! through magnus's checked wrappers: every object they make is one just
//! made (a fresh Hash or Array, a String), so the only exception any of these
//! calls can raise is NoMemoryError, which magnus's own allocators let through
//! as well; magnus's `aset`/`push` wrap each call in rb_protect for the
//! general case (a frozen receiver, a key whose #hash raises), and on a 1 KiB
//! payload of some 40 objects that wrapping was a tenth of the build.
//! Values live on this thread's stack or inside the object being built until
//! they are returned, where Ruby's GC sees them.

use magnus::Value;

/// A String of `s`, UTF-8 (serde_json has checked it is).
///
/// Made as `rb_utf8_str_new` makes it, a binary String then given UTF-8,
/// but with the encoding's index written into the new String's flags
/// directly (Ruby's own `ENCODING_SET_INLINED`): `rb_enc_associate_index`
/// first checks that the String is not frozen, looks up both encodings and
/// compares them, for every String of every payload, where a String made
/// here is always new and always UTF-8. Its code range is left unknown, as
/// `rb_utf8_str_new` leaves it.
pub(super) fn rstring(s: &str) -> rb_sys::VALUE {
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

pub(super) fn value(raw: rb_sys::VALUE) -> Value {
    use magnus::rb_sys::FromRawValue;
    // SAFETY: `raw` is an object just built by the C API on this thread.
    unsafe { Value::from_raw(raw) }
}

pub(super) fn raw(v: Value) -> rb_sys::VALUE {
    use magnus::rb_sys::AsRawValue;
    v.as_raw()
}

/// The pairs [`RubySeed`](super::seed::RubySeed) puts into a Hash at once:
/// a small Hash's most (Ruby keeps up to 8 pairs in an array, not a table).
pub(super) const PAIRS: usize = 8;
