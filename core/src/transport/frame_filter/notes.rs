//! What was repaired, in words: the marker's text.

use super::*;

/// What was repaired, in words, bounded: past [`MAX_MARKER`] bytes the rest
/// are only counted.
#[derive(Default, Debug)]
pub(super) struct Notes {
    list: Vec<String>,
    bytes: usize,
    more: usize,
}

impl Notes {
    pub(super) fn push(&mut self, note: String) {
        if self.bytes + note.len() > MAX_MARKER {
            self.more += 1;
        } else {
            self.bytes += note.len() + 2;
            self.list.push(note);
        }
    }

    pub(super) fn extend(&mut self, other: Notes) {
        for n in other.list {
            self.push(n);
        }
        self.more += other.more;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty() && self.more == 0
    }

    pub(super) fn mark(&self) -> (usize, usize, usize) {
        (self.list.len(), self.bytes, self.more)
    }

    pub(super) fn reset(&mut self, (len, bytes, more): (usize, usize, usize)) {
        self.list.truncate(len);
        self.bytes = bytes;
        self.more = more;
    }

    pub(super) fn text(&self, max: usize) -> String {
        let mut t = self.list.join("; ");
        if self.more > 0 {
            t.push_str(&format!("; and {} more", self.more));
        }
        crate::limits::bounded(&t, max)
    }
}
