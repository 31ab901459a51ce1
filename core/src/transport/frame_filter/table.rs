//! The field-table walker, which never recurses, and the byte helpers it uses.

use super::*;

/// One table or array being walked.
pub(super) struct Level {
    table: bool,
    pos: usize,
    end: usize,
    /// Where its type letter is (unused for the top table).
    tag_at: usize,
    depth: usize,
    /// Its key in its parent table, or its index in its parent array.
    label: Label,
    /// Elements seen, for arrays' labels.
    index: usize,
    edits_mark: usize,
    notes_mark: (usize, usize, usize),
}

#[derive(Clone, Copy)]
pub(super) enum Label {
    Root,
    Key(usize, usize),
    Index(usize),
}

/// Walk the field table `src[start..end]` without recursing, recording in
/// `edits` the bytes to change to make it readable by amq-protocol (see the
/// module docs) and in `notes` why. Err(at) when the top table itself
/// cannot be read from the entry at `at` on; what precedes it is sound.
pub(super) fn walk_table(
    src: &[u8],
    start: usize,
    end: usize,
    what: &str,
    stack: &mut Vec<Level>,
    edits: &mut Vec<(usize, u8)>,
    notes: &mut Notes,
) -> Result<(), usize> {
    stack.clear();
    stack.push(Level {
        table: true,
        pos: start,
        end,
        tag_at: 0,
        depth: 1,
        label: Label::Root,
        index: 0,
        edits_mark: 0,
        notes_mark: notes.mark(),
    });
    'walk: while let Some(level) = stack.last_mut() {
        if level.pos == level.end {
            stack.pop();
            continue;
        }
        let entry_at = level.pos;
        let mut pos = level.pos;
        let label;
        let failure: String;
        'entry: {
            if level.table {
                let len = src[pos] as usize;
                if pos + 1 + len > level.end {
                    failure = "a name runs past the end of its table".into();
                    label = Label::Key(pos + 1, 0);
                    break 'entry;
                }
                label = Label::Key(pos + 1, len);
                if repair_utf8(src, pos + 1, pos + 1 + len, edits) {
                    let name = path(src, stack, label, what);
                    notes.push(format!("{what} name {name}: not UTF-8"));
                }
                pos += 1 + len;
            } else {
                label = Label::Index(level.index);
                level.index += 1;
            }
            let level = stack.last_mut().expect("the level being walked");
            if pos >= level.end {
                failure = "a name has no value".into();
                break 'entry;
            }
            let tag = src[pos];
            pos += 1;
            let Some(size) = value_size(tag, &src[pos..level.end]) else {
                failure = format!("unknown field type {}", quoted(&[tag]));
                break 'entry;
            };
            if size > level.end - pos {
                failure = "a value runs past the end of its table".into();
                break 'entry;
            }
            level.pos = pos + size;
            if tag == b'A' || tag == b'F' {
                let depth = level.depth + 1;
                if depth > MAX_HEADER_DEPTH {
                    edits.push((pos - 1, b'S'));
                    let at = path(src, stack, label, what);
                    notes.push(format!(
                        "{what} {at}: nested deeper than {MAX_HEADER_DEPTH} levels, kept as a long string of its raw bytes"
                    ));
                } else {
                    stack.push(Level {
                        table: tag == b'F',
                        pos: pos + 4,
                        end: pos + size,
                        tag_at: pos - 1,
                        depth,
                        label,
                        index: 0,
                        edits_mark: edits.len(),
                        notes_mark: notes.mark(),
                    });
                }
            }
            continue 'walk;
        }
        // This table or array cannot be read: the smallest one holding the
        // problem becomes a long string of its raw bytes, undoing whatever
        // was repaired inside it (the raw bytes are the point).
        let entry = path(src, stack, label, what);
        let level = stack.pop().expect("the level being walked");
        if stack.is_empty() {
            notes.push(format!(
                "{what} {entry}: {failure}; the {what}s from byte {} of the table on kept as {MALFORMED_RAW_HEADER}, a long string of their raw bytes",
                entry_at - start
            ));
            return Err(entry_at);
        }
        edits.truncate(level.edits_mark);
        notes.reset(level.notes_mark);
        edits.push((level.tag_at, b'S'));
        let container = path(src, stack, level.label, what);
        let kind = if level.table { "table" } else { "array" };
        notes.push(format!("{what} {entry}: {failure}; the {kind} {container} kept as a long string of its raw bytes"));
    }
    Ok(())
}

/// A readable name for the entry `last` under the levels in `stack`:
/// `"a.b[2].c"`, each key quoted as it arrived.
pub(super) fn path(src: &[u8], stack: &[Level], last: Label, what: &str) -> String {
    let mut out = Vec::new();
    for label in stack.iter().map(|l| l.label).chain(std::iter::once(last)) {
        match label {
            Label::Root => {}
            Label::Key(at, len) => {
                if !out.is_empty() {
                    out.push(b'.');
                }
                out.extend_from_slice(&src[at..at + len]);
            }
            Label::Index(i) => out.extend_from_slice(format!("[{i}]").as_bytes()),
        }
    }
    if out.is_empty() {
        return format!("(the {what} table)");
    }
    quoted(&out)
}

/// Record in `edits` a `?` for every byte of `src[start..end]` that is not
/// part of valid UTF-8. True if there was one.
pub(super) fn repair_utf8(src: &[u8], start: usize, end: usize, edits: &mut Vec<(usize, u8)>) -> bool {
    let s = &src[start..end];
    // Nearly every name and value is ASCII, told a word at a time, where
    // from_utf8 checks byte by byte: on lapin's I/O thread, which reads
    // every delivery's short strings.
    if s.is_ascii() {
        return false;
    }
    let mut i = 0;
    let mut bad = false;
    while let Err(e) = std::str::from_utf8(&s[i..]) {
        let from = i + e.valid_up_to();
        let len = e.error_len().unwrap_or(s.len() - from);
        edits.extend((from..from + len).map(|j| (start + j, b'?')));
        bad = true;
        i = from + len;
    }
    bad
}

/// Bytes as a quoted, escaped, exact string: `"id-\xff"`.
pub(super) fn quoted(bytes: &[u8]) -> String {
    format!("\"{}\"", bytes.escape_ascii())
}

pub(super) fn entry_size(text: &str) -> usize {
    1 + MALFORMED_HEADER.len().max(MALFORMED_RAW_HEADER.len()) + 5 + text.len()
}

pub(super) fn push_long_entry(table: &mut Vec<u8>, key: &str, value: &[u8]) {
    table.push(key.len() as u8);
    table.extend_from_slice(key.as_bytes());
    table.push(b'S');
    table.extend_from_slice(&(value.len() as u32).to_be_bytes());
    table.extend_from_slice(value);
}

/// The `version` entry (a long string) of connection.start's server
/// properties, read without recursing: nested tables are skipped by their
/// length. None when the table has no such entry or cannot be read.
pub(super) fn server_version(table: &[u8]) -> Option<String> {
    let mut pos = 0;
    while pos < table.len() {
        let klen = *table.get(pos)? as usize;
        let key = table.get(pos + 1..pos + 1 + klen)?;
        pos += 1 + klen;
        let tag = *table.get(pos)?;
        pos += 1;
        let size = value_size(tag, &table[pos.min(table.len())..])?;
        let value = table.get(pos..pos.checked_add(size)?)?;
        if key == b"version" && tag == b'S' {
            return Some(String::from_utf8_lossy(&value[4..]).into_owned());
        }
        pos += size;
    }
    None
}

/// The encoded size of a field value of type `tag` whose bytes start
/// `rest`: None for a type AMQP has not got, usize::MAX for a
/// length-prefixed value (string, byte array, array, table) whose length
/// itself is cut off, which no table can hold.
pub(super) fn value_size(tag: u8, rest: &[u8]) -> Option<usize> {
    Some(match tag {
        b't' | b'b' | b'B' => 1,
        b's' | b'U' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'L' | b'l' | b'd' | b'T' => 8,
        b'V' => 0,
        b'S' | b'x' | b'A' | b'F' => rest.get(..4).map_or(usize::MAX, |n| 4 + be32(n) as usize),
        _ => return None,
    })
}

pub(super) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
