//! A JSON reader that hands what it reads to a [`Builder`]: for a caller
//! that builds its own objects from a body (the Ruby extension builds Ruby
//! Hashes, Arrays and Strings) without serde's visitor in between.
//!
//! It takes the common case and leaves the rest: [`read`] answers `None`
//! for any text that is not JSON, and also for JSON it does not take itself
//! (an integer of 19 digits or more, `-0`, an escape naming a lone
//! surrogate, nesting deeper than [`MAX_DEPTH`]). The caller then reads the
//! same text with serde_json, which either builds it or says what is wrong
//! with it, in its own words. So whatever `read` builds is what serde_json
//! builds from the same text (the tests and the fuzz target `json_read`
//! hold it to that), and what serde_json refuses is refused as before.
//!
//! Why: serde_json's visitor and its string scan were a large share of
//! what a Ruby consumer spent on a message (bench/README.md); this reader
//! scans a string 16 bytes at a time and calls the builder directly.

/// What [`read`] builds with. `Value` is whatever one JSON value becomes;
/// an Array or an Object is started, filled and ended, so a builder can
/// keep what it fills where its garbage collector sees it.
pub trait Builder {
    /// One JSON value, built.
    type Value;
    /// An object's key, built.
    type Key;
    /// An array being filled.
    type Array;
    /// An object being filled.
    type Object;
    /// `null`.
    fn null(&mut self) -> Self::Value;
    /// `true` or `false`.
    fn bool(&mut self, b: bool) -> Self::Value;
    /// An integer of at most 18 digits.
    fn int(&mut self, i: i64) -> Self::Value;
    /// Any other number, as serde_json reads it.
    fn float(&mut self, f: f64) -> Self::Value;
    /// A string, its escapes undone.
    fn string(&mut self, s: &str) -> Self::Value;
    /// An object's key, its escapes undone; `place` counts the keys read
    /// so far in this text (0 for its first).
    fn key(&mut self, s: &str, place: usize) -> Self::Key;
    /// A new, empty array.
    fn array(&mut self) -> Self::Array;
    /// Append to it.
    fn push(&mut self, array: &mut Self::Array, v: Self::Value);
    /// The array, filled.
    fn end_array(&mut self, array: Self::Array) -> Self::Value;
    /// A new, empty object.
    fn object(&mut self) -> Self::Object;
    /// Add a pair (a key seen before in the same object: the later one
    /// wins, as in serde_json).
    fn insert(&mut self, object: &mut Self::Object, k: Self::Key, v: Self::Value);
    /// The object, filled.
    fn end_object(&mut self, object: Self::Object) -> Self::Value;
}

/// The deepest nesting read here (serde_json's limit is 127).
pub const MAX_DEPTH: usize = 100;

/// `text` built with `b`, or `None`: it is not JSON, or it is JSON this
/// reader leaves to serde_json (see the module's documentation).
pub fn read<B: Builder>(text: &str, b: &mut B) -> Option<B::Value> {
    let mut r = Reader { text, bytes: text.as_bytes(), at: 0, keys: 0, scratch: String::new() };
    r.skip_space();
    let v = r.value(b, 0)?;
    r.skip_space();
    (r.at == r.bytes.len()).then_some(v)
}

struct Reader<'t> {
    text: &'t str,
    bytes: &'t [u8],
    at: usize,
    keys: usize,
    /// A string with escapes, put back together.
    scratch: String,
}

impl Reader<'_> {
    fn skip_space(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    fn eat(&mut self, literal: &[u8]) -> Option<()> {
        let end = self.at + literal.len();
        (self.bytes.get(self.at..end)? == literal).then(|| self.at = end)
    }

    fn value<B: Builder>(&mut self, b: &mut B, depth: usize) -> Option<B::Value> {
        match *self.bytes.get(self.at)? {
            b'"' => {
                self.at += 1;
                let s = self.string()?;
                Some(b.string(s))
            }
            b'{' => self.object(b, depth + 1),
            b'[' => self.array(b, depth + 1),
            b't' => self.eat(b"true").map(|()| b.bool(true)),
            b'f' => self.eat(b"false").map(|()| b.bool(false)),
            b'n' => self.eat(b"null").map(|()| b.null()),
            b'-' | b'0'..=b'9' => self.number(b),
            _ => None,
        }
    }

    fn array<B: Builder>(&mut self, b: &mut B, depth: usize) -> Option<B::Value> {
        let empty = self.open(depth, b']')?;
        let mut array = b.array();
        self.items(empty, b']', |r| {
            let v = r.value(b, depth)?;
            b.push(&mut array, v);
            Some(())
        })?;
        Some(b.end_array(array))
    }

    fn object<B: Builder>(&mut self, b: &mut B, depth: usize) -> Option<B::Value> {
        let empty = self.open(depth, b'}')?;
        let mut object = b.object();
        self.items(empty, b'}', |r| {
            if r.bytes.get(r.at) != Some(&b'"') {
                return None;
            }
            r.at += 1;
            let place = r.keys;
            r.keys += 1;
            let k = b.key(r.string()?, place);
            r.skip_space();
            if r.bytes.get(r.at) != Some(&b':') {
                return None;
            }
            r.at += 1;
            r.skip_space();
            let v = r.value(b, depth)?;
            b.insert(&mut object, k, v);
            Some(())
        })?;
        Some(b.end_object(object))
    }

    /// An array's or object's items, each read by `item`, up to its
    /// `close`; None when one is not there, or is not followed by a comma
    /// or the `close`.
    fn items(&mut self, empty: bool, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if empty {
            return Some(());
        }
        loop {
            self.skip_space();
            item(self)?;
            if self.item_ends(close)? {
                return Some(());
            }
        }
    }

    /// Past an array's or object's opening bracket: whether it is empty
    /// (its `close` read too); None past [`MAX_DEPTH`].
    fn open(&mut self, depth: usize, close: u8) -> Option<bool> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.skip_space();
        let empty = self.bytes.get(self.at) == Some(&close);
        self.at += usize::from(empty);
        Some(empty)
    }

    /// After an item: past a comma (false) or the `close` (true); None
    /// for anything else.
    fn item_ends(&mut self, close: u8) -> Option<bool> {
        self.skip_space();
        let c = *self.bytes.get(self.at)?;
        self.at += 1;
        match c {
            b',' => Some(false),
            c if c == close => Some(true),
            _ => None,
        }
    }

    /// A number. An integer of up to 18 digits is read here, in the same
    /// pass that finds its end; any other number (a fraction, an exponent)
    /// by serde_json, so that it is the same `f64` serde_json makes of it in
    /// a document.
    fn number<B: Builder>(&mut self, b: &mut B) -> Option<B::Value> {
        let start = self.at;
        let negative = self.bytes[start] == b'-';
        let digits = start + usize::from(negative);
        let mut at = digits;
        let mut n = 0i64;
        while let Some(&c) = self.bytes.get(at) {
            if !c.is_ascii_digit() {
                break;
            }
            // Past 18 digits n is no longer read (the number is left).
            n = n.wrapping_mul(10).wrapping_add(i64::from(c - b'0'));
            at += 1;
        }
        match self.bytes.get(at) {
            Some(b'.' | b'e' | b'E') => {
                let end = at + self.bytes[at..].iter().position(|c| !matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')).unwrap_or(self.bytes.len() - at);
                self.at = end;
                let f: f64 = serde_json::from_str(&self.text[start..end]).ok()?;
                Some(b.float(f))
            }
            _ => {
                self.at = at;
                let len = at - digits;
                // No leading zero but 0 itself, and no -0 (serde_json reads
                // that as the float -0.0).
                if len == 0 || len > 18 || (self.bytes[digits] == b'0' && (len > 1 || negative)) {
                    return None;
                }
                Some(b.int(if negative { -n } else { n }))
            }
        }
    }

    /// A string's text, the opening quote already read; escapes undone.
    fn string(&mut self) -> Option<&str> {
        let start = self.at;
        let stop = scan(self.bytes, start);
        match self.bytes.get(stop)? {
            b'"' => {
                self.at = stop + 1;
                // Cut at ASCII bytes, so at char boundaries.
                Some(&self.text[start..stop])
            }
            b'\\' => self.escaped(start, stop),
            _ => None, // a control character
        }
    }

    /// The rest of a string with escapes in it, put together in `scratch`.
    fn escaped(&mut self, start: usize, mut stop: usize) -> Option<&str> {
        self.scratch.clear();
        let mut from = start;
        loop {
            self.scratch.push_str(&self.text[from..stop]);
            match self.bytes.get(stop)? {
                b'"' => {
                    self.at = stop + 1;
                    return Some(&self.scratch);
                }
                b'\\' => {
                    let c = match *self.bytes.get(stop + 1)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let (c, len) = self.unicode(stop)?;
                            self.scratch.push(c);
                            from = stop + len;
                            stop = scan(self.bytes, from);
                            continue;
                        }
                        _ => return None,
                    };
                    self.scratch.push(c);
                    from = stop + 2;
                    stop = scan(self.bytes, from);
                }
                _ => return None,
            }
        }
    }

    /// The character of a `\u` escape at `at` (and of the low surrogate's
    /// escape after it), and how many bytes they took. A lone surrogate is
    /// left to serde_json, which refuses it.
    fn unicode(&self, at: usize) -> Option<(char, usize)> {
        let high = self.hex4(at + 2)?;
        if (0xDC00..0xE000).contains(&high) {
            return None;
        }
        if !(0xD800..0xDC00).contains(&high) {
            return Some((char::from_u32(high)?, 6));
        }
        if self.bytes.get(at + 6..at + 8)? != b"\\u" {
            return None;
        }
        let low = self.hex4(at + 8)?;
        if !(0xDC00..0xE000).contains(&low) {
            return None;
        }
        Some((char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?, 12))
    }

    fn hex4(&self, at: usize) -> Option<u32> {
        self.bytes.get(at..at + 4)?.iter().try_fold(0u32, |n, &c| Some(n * 16 + char::from(c).to_digit(16)?))
    }
}

/// Where the first `"`, `\` or control character is, from `at` on (or the
/// end): 16 bytes at a time where SSE2 is (every x86_64), one at a time
/// elsewhere and for the last few.
fn scan(bytes: &[u8], mut at: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8};
        // SAFETY: SSE2 is part of x86_64; every load is of 16 bytes inside
        // `bytes` (at + 16 <= len), unaligned loads being allowed.
        unsafe {
            let quote = _mm_set1_epi8(b'"' as i8);
            let backslash = _mm_set1_epi8(b'\\' as i8);
            let control = _mm_set1_epi8(0x1F);
            while at + 16 <= bytes.len() {
                let x = _mm_loadu_si128(bytes.as_ptr().add(at).cast::<__m128i>());
                // A byte at most 0x1F is one whose unsigned max with 0x1F is 0x1F.
                let hits = _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                    _mm_cmpeq_epi8(_mm_max_epu8(x, control), control),
                );
                let mask = _mm_movemask_epi8(hits) as u32;
                if mask != 0 {
                    return at + mask.trailing_zeros() as usize;
                }
                at += 16;
            }
        }
    }
    while let Some(&c) = bytes.get(at) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return at;
        }
        at += 1;
    }
    at
}

/// A [`Builder`] of serde_json values: what [`read`] is checked against,
/// and a reader of its own for a Rust caller.
pub struct Values;

impl Builder for Values {
    type Value = serde_json::Value;
    type Key = String;
    type Array = Vec<serde_json::Value>;
    type Object = serde_json::Map<String, serde_json::Value>;
    fn null(&mut self) -> serde_json::Value {
        serde_json::Value::Null
    }
    fn bool(&mut self, b: bool) -> serde_json::Value {
        b.into()
    }
    fn int(&mut self, i: i64) -> serde_json::Value {
        i.into()
    }
    fn float(&mut self, f: f64) -> serde_json::Value {
        serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, serde_json::Value::Number)
    }
    fn string(&mut self, s: &str) -> serde_json::Value {
        s.into()
    }
    fn key(&mut self, s: &str, _place: usize) -> String {
        s.to_owned()
    }
    fn array(&mut self) -> Vec<serde_json::Value> {
        Vec::new()
    }
    fn push(&mut self, array: &mut Vec<serde_json::Value>, v: serde_json::Value) {
        array.push(v);
    }
    fn end_array(&mut self, array: Vec<serde_json::Value>) -> serde_json::Value {
        array.into()
    }
    fn object(&mut self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
    fn insert(&mut self, object: &mut serde_json::Map<String, serde_json::Value>, k: String, v: serde_json::Value) {
        object.insert(k, v);
    }
    fn end_object(&mut self, object: serde_json::Map<String, serde_json::Value>) -> serde_json::Value {
        object.into()
    }
}

#[cfg(test)]
mod tests {
    use super::{read, Values};

    /// `read` builds what serde_json builds, or leaves the text to it.
    fn agrees(text: &str) -> Option<serde_json::Value> {
        let ours = read(text, &mut Values);
        let theirs = serde_json::from_str::<serde_json::Value>(text);
        if let Some(v) = &ours {
            let theirs = theirs.unwrap_or_else(|e| panic!("read took {text:?}, which serde_json refuses: {e}"));
            assert_eq!(*v, theirs, "{text:?}");
            // The same floats, bit for bit.
            assert_eq!(v.to_string(), theirs.to_string(), "{text:?}");
        }
        ours
    }

    #[test]
    fn the_common_json_is_read_as_serde_json_reads_it() {
        for text in [
            r#"{"order_id":"A-1","customer":{"id":4217,"name":"Ada","email":"ada@example.com"},"items":[{"sku":"BK-001","qty":2,"price":1250}],"note":"xx"}"#,
            " { \"a\" : [ 1 , 2 , { } , [ ] ] ,\n\t\"b\" : null , \"c\" : true , \"d\" : false } \r\n",
            "[]",
            "{}",
            "0",
            "-7",
            "123456789012345678",
            "-123456789012345678",
            "1.5",
            "-0.0",
            "1e3",
            "2.5E-3",
            "0.1",
            "1.7976931348623157e308",
            "5e-324",
            "\"\"",
            r#""a\"b\\c\/d\b\f\n\r\t""#,
            r#""\u00e9\u4e2d\ud83d\ude00 and é, 中, 😀""#,
            r#"{"k\u0065y":1,"key":2}"#,
            r#"{"a":1,"a":2}"#,
            r#""a string of more than sixteen bytes with a \"quote\" past them, and after""#,
        ] {
            assert!(agrees(text).is_some(), "left to serde_json: {text:?}");
        }
    }

    #[test]
    fn what_is_not_json_or_is_left_to_serde_json_is_not_built() {
        for text in [
            "", " ", "{", "}", "[1,]", "[,1]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "-", "-01", "1.", ".5", "1e", "+1",
            "tru", "nul", "truex", "[1 2]", "\"abc", "\"a\u{1}b\"", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"",
            "\"\\ud800\\u0041\"", "1e400", "\u{feff}{}", "{} {}", "-0", "1234567890123456789", "18446744073709551616",
        ] {
            assert!(agrees(text).is_none(), "built: {text:?}");
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_left_to_serde_json() {
        let at_limit = format!("{}{}", "[".repeat(super::MAX_DEPTH), "]".repeat(super::MAX_DEPTH));
        assert!(agrees(&at_limit).is_some());
        let past = format!("{}{}", "[".repeat(super::MAX_DEPTH + 1), "]".repeat(super::MAX_DEPTH + 1));
        assert!(agrees(&past).is_none());
    }

    /// Random documents, written out by serde_json compact and pretty, and
    /// cut short at every length: each either agrees or is not built.
    #[test]
    fn random_documents_agree_with_serde_json() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        fn text(next: &mut dyn FnMut(u64) -> u64) -> String {
            const PIECES: [&str; 10] = ["a", "é", "\"", "\\", "\n", "\u{1}", "😀", "0123456789abcdef", "/", "\u{7f}"];
            (0..next(6)).map(|_| PIECES[next(10) as usize]).collect()
        }
        fn doc(next: &mut dyn FnMut(u64) -> u64, depth: u32) -> serde_json::Value {
            match next(if depth > 3 { 6 } else { 8 }) {
                0 => serde_json::Value::Null,
                1 => (next(2) == 1).into(),
                2 => (next(u64::MAX) as i64 >> next(64)).into(),
                3 => serde_json::Number::from_f64((next(1 << 40) as f64 - 5e11) / (next(1000) + 1) as f64).map_or(serde_json::Value::Null, Into::into),
                4 | 5 => text(next).into(),
                6 => (0..next(5)).map(|_| doc(next, depth + 1)).collect::<Vec<_>>().into(),
                _ => (0..next(5)).map(|_| (text(next), doc(next, depth + 1))).collect::<serde_json::Map<_, _>>().into(),
            }
        }
        let mut built = 0;
        for _ in 0..2_000 {
            let v = doc(&mut next, 0);
            for text in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
                built += usize::from(agrees(&text).is_some());
                for cut in (0..text.len()).filter(|&i| text.is_char_boundary(i)).step_by(7) {
                    agrees(&text[..cut]);
                }
            }
        }
        assert!(built > 3_000, "built {built} of 4,000 whole documents");
    }
}
