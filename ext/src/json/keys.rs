//! The Hash keys both readers make, interned once and kept: a table of our
//! own in front of Ruby's table of frozen strings, behind the GVL.

/// A Hash key: the frozen, deduplicated String Ruby keeps for that text
/// (what `Hash#[]=` would make of a String key anyway, here without
/// allocating one first when the same key was seen before).
pub(super) fn rkey(s: &str, place: usize) -> rb_sys::VALUE {
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
