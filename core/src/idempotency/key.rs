//! What an idempotency key is when it arrives as bytes: the one rule, for
//! the Ruby gem's guard and stores (a Rust key is a `&str` already).

use crate::error::{Error, Result};

/// The bytes of `key` shown in a refusal at most: enough to find it.
const SHOWN: usize = 60;

/// `key` as text, or an invalid-argument error saying it is not.
///
/// A key is text: the same bytes are the same key whatever encoding a
/// caller labelled them with (a binary string from a delivery, or UTF-8
/// text), and they are bound as text, because SQLite never finds a BLOB
/// equal to the TEXT of the same bytes. Bytes that are not UTF-8 are
/// refused rather than replaced, because replacing them would make two keys
/// one; the same key function finds the same bytes on every retry, so a
/// guard treats the refusal as a missing key (a fatal reject with this
/// message as its reason).
pub fn key_text(key: &[u8]) -> Result<&str> {
    std::str::from_utf8(key).map_err(|_| {
        let shown = key.escape_ascii().to_string();
        let shown = match shown.char_indices().nth(SHOWN) {
            Some((i, _)) => format!("{}...", &shown[..i]),
            None => shown,
        };
        Error::invalid(format!(
            "idempotency key is not UTF-8 text (\"{shown}\"): key messages on text (hex-encode binary ids), \
             since replacing the bytes would make two keys one"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_passes_and_other_bytes_are_refused_naming_them() {
        assert_eq!(key_text("order:1 ✓".as_bytes()).unwrap(), "order:1 ✓");
        let e = key_text(b"\xff\xfekey").unwrap_err();
        assert!(e.is_invalid_argument());
        assert!(e.message().starts_with(r#"idempotency key is not UTF-8 text ("\xff\xfekey")"#), "{e}");
        assert!(e.message().contains("hex-encode"), "{e}");
    }
}
