//! The frame state machine: what each frame at the front of the bytes is, and what it becomes.

use super::*;

/// What [`Frames::step`] found at the front of the bytes it was given.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// The first n bytes are ready (checked, and repaired where they lie).
    Pass(usize),
    /// The first `skip` bytes are ready; the `consumed` after them are a
    /// frame to be replaced by `with`.
    Replace { skip: usize, consumed: usize, with: Vec<u8> },
    /// The bytes start with a frame that is not complete.
    NeedMore,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Mode {
    /// At the start of a frame.
    Boundary,
    /// Inside a frame that passes as it is: this many bytes of it are left,
    /// its end byte included.
    Through(usize),
    /// Not AMQP framing as we know it: everything passes.
    Off,
}

/// The frame state machine, without any I/O.
pub(super) struct Frames {
    mode: Mode,
    /// From connection.tune; None before it.
    server_frame_max: Option<u32>,
    client_frame_max: u32,
    /// Channels whose next content header is to be marked: a basic.deliver,
    /// basic.get-ok or basic.return on them had its strings repaired.
    marks: Vec<(u16, Notes)>,
    /// The walker's stack, kept between frames so that a clean message
    /// costs no allocation.
    levels: Vec<Level>,
    /// Given the broker's version from connection.start, when set.
    pub(super) server: Option<ServerVersion>,
}

impl Frames {
    pub(super) fn new(client_frame_max: u32) -> Self {
        Frames { mode: Mode::Boundary, server_frame_max: None, client_frame_max, marks: Vec::new(), levels: Vec::new(), server: None }
    }

    /// The frame_max lapin enforces on what it reads, negotiated as lapin
    /// does: the smaller of ours and the broker's where both are set, at
    /// least AMQP's minimum. None before connection.tune.
    pub(super) fn negotiated(&self) -> Option<usize> {
        let server = self.server_frame_max?;
        let max = match (server, self.client_frame_max) {
            (0, 0) => u32::MAX,
            (0, c) => c,
            (s, 0) => s,
            (s, c) => s.min(c),
        };
        Some(max.max(FRAME_MIN_SIZE) as usize)
    }

    pub(super) fn hold_limit(&self) -> usize {
        let server = self.server_frame_max.unwrap_or(0) as usize;
        self.negotiated().unwrap_or(0).max(server).max(HOLD_AT_LEAST)
    }

    /// How many more bytes the incomplete frame at the front of `input` needs.
    pub(super) fn missing(&self, input: &[u8]) -> usize {
        if input.len() < FRAME_PREFIX {
            return FRAME_PREFIX - input.len();
        }
        (be32(&input[3..7]) as usize + FRAME_OVERHEAD).saturating_sub(input.len())
    }

    /// Look at the bytes at the front of `data` (which continue the stream
    /// where the last call left off), repair what can be repaired in place,
    /// and say what is ready. `data` is never empty.
    pub(super) fn step(&mut self, data: &mut [u8]) -> Step {
        let mut pos = 0;
        loop {
            match self.mode {
                Mode::Off => return Step::Pass(data.len()),
                Mode::Through(remaining) => {
                    let available = data.len() - pos;
                    if available < remaining {
                        self.mode = Mode::Through(remaining - available);
                        return Step::Pass(data.len());
                    }
                    pos += remaining;
                    if data[pos - 1] != FRAME_END {
                        self.mode = Mode::Off;
                        return Step::Pass(data.len());
                    }
                    self.mode = Mode::Boundary;
                }
                Mode::Boundary => {
                    let rest = &data[pos..];
                    if rest.is_empty() {
                        return Step::Pass(pos);
                    }
                    let kind = rest[0];
                    if !matches!(kind, FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT) {
                        // Also the broker's "AMQP" + version refusing ours.
                        self.mode = Mode::Off;
                        return Step::Pass(data.len());
                    }
                    if rest.len() < FRAME_PREFIX {
                        return if pos > 0 { Step::Pass(pos) } else { Step::NeedMore };
                    }
                    let channel = be16(&rest[1..3]);
                    let size = be32(&rest[3..7]) as usize;
                    let total = size + FRAME_OVERHEAD;
                    if kind == FRAME_BODY || kind == FRAME_HEARTBEAT || total > self.hold_limit() {
                        pos += FRAME_PREFIX;
                        self.mode = Mode::Through(size + 1);
                        continue;
                    }
                    if rest.len() < total {
                        return if pos > 0 { Step::Pass(pos) } else { Step::NeedMore };
                    }
                    if rest[total - 1] != FRAME_END {
                        self.mode = Mode::Off;
                        return Step::Pass(data.len());
                    }
                    let payload = &mut data[pos + FRAME_PREFIX..pos + total - 1];
                    if kind == FRAME_METHOD {
                        self.method(channel, payload);
                    } else if let Some(repaired) = self.content_header(channel, payload) {
                        let mut with = Vec::with_capacity(repaired.len() + FRAME_OVERHEAD);
                        with.push(FRAME_HEADER);
                        with.extend_from_slice(&channel.to_be_bytes());
                        with.extend_from_slice(&(repaired.len() as u32).to_be_bytes());
                        with.extend_from_slice(&repaired);
                        with.push(FRAME_END);
                        return Step::Replace { skip: pos, consumed: total, with };
                    }
                    pos += total;
                }
            }
        }
    }

    /// Check a method frame's short strings and tables, repairing them
    /// where they lie (no length changes). Learns frame_max from
    /// connection.tune.
    pub(super) fn method(&mut self, channel: u16, p: &mut [u8]) {
        if p.len() < 4 {
            return;
        }
        let (class, method) = (be16(&p[0..2]), be16(&p[2..4]));
        if (class, method) == (10, 30) {
            if p.len() >= 10 {
                self.server_frame_max = Some(be32(&p[6..10]));
            }
            return;
        }
        let Some((name, fields)) = server_method(class, method) else { return };
        let mut edits = Vec::new();
        let mut notes = Notes::default();
        let mut pos = 4;
        for field in fields {
            match *field {
                Field::Fixed(n) => pos += n,
                Field::Short(what) => {
                    let Some(&len) = p.get(pos) else { return };
                    let end = pos + 1 + len as usize;
                    if end > p.len() {
                        return;
                    }
                    if repair_utf8(p, pos + 1, end, &mut edits) {
                        notes.push(format!("{name} {what}: not UTF-8, was {}", quoted(&p[pos + 1..end])));
                    }
                    pos = end;
                }
                Field::Table(what) => {
                    if pos + 4 > p.len() {
                        return;
                    }
                    let end = pos + 4 + be32(&p[pos..pos + 4]) as usize;
                    if end > p.len() {
                        return;
                    }
                    // A table that cannot be read at its top level is left
                    // as it is: nothing of the same length would make it
                    // readable, and only the broker writes these.
                    let _ = walk_table(p, pos + 4, end, what, &mut self.levels, &mut edits, &mut notes);
                    pos = end;
                }
            }
        }
        for (at, byte) in edits {
            p[at] = byte;
        }
        if (class, method) == (10, 10) {
            // version-major, version-minor, then the server properties.
            if let (Some(slot), Some(len)) = (&self.server, p.get(6..10).map(be32)) {
                let table = p.get(10..10 + len as usize).unwrap_or_default();
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = server_version(table);
            }
        }
        if matches!((class, method), (60, 50) | (60, 60) | (60, 71)) && !notes.is_empty() {
            match self.marks.iter_mut().find(|(c, _)| *c == channel) {
                Some((_, pending)) => pending.extend(notes),
                None => self.marks.push((channel, notes)),
            }
        }
    }

    /// Check a content header; None when it passes as it is, else the
    /// repaired payload with the marker in its headers.
    pub(super) fn content_header(&mut self, channel: u16, p: &[u8]) -> Option<Vec<u8>> {
        let mut notes = match self.marks.iter().position(|(c, _)| *c == channel) {
            Some(i) => self.marks.swap_remove(i).1,
            None => Notes::default(),
        };
        // Class, weight and body size are the broker's own; only the
        // properties after them come from the publisher.
        if p.len() < 14 {
            return None;
        }
        let flags = be16(&p[12..14]);
        let mut pos = 14;
        if flags & 1 != 0 {
            // Continuation: more flag words follow. Basic has 14 properties
            // and lapin reads one word, so the rest only misalign it.
            loop {
                if pos + 2 > p.len() {
                    return Some(self.rebuild(p, 14, notes, "the property flags run past the end of the frame"));
                }
                let more = be16(&p[pos..pos + 2]) & 1 != 0;
                pos += 2;
                if !more {
                    break;
                }
            }
            notes.push(format!("{} bytes of continued property flags dropped (basic has 14 properties)", pos - 14));
        }
        let props_start = pos;
        let mut edits = Vec::new();
        let mut headers_slot = pos;
        let mut headers: Option<(usize, usize, Option<usize>)> = None;
        for (bit, (what, kind)) in (2..16).rev().zip(PROPERTIES) {
            if bit == 13 {
                headers_slot = pos;
            }
            if flags & (1 << bit) == 0 {
                continue;
            }
            let need = match kind {
                Prop::Short => 1 + *p.get(pos).unwrap_or(&0) as usize,
                Prop::Octet => 1,
                Prop::Timestamp => 8,
                Prop::Table => 4 + p.get(pos..pos + 4).map_or(0, be32) as usize,
            };
            if pos + need > p.len() || (kind == Prop::Short && pos >= p.len()) {
                let why = format!("{what} runs past the end of the frame");
                return Some(self.rebuild(p, props_start, notes, &why));
            }
            match kind {
                Prop::Short => {
                    if repair_utf8(p, pos + 1, pos + need, &mut edits) {
                        notes.push(format!("{what}: not UTF-8, was {}", quoted(&p[pos + 1..pos + need])));
                    }
                }
                Prop::Table => {
                    let (start, end) = (pos + 4, pos + need);
                    let broken = walk_table(p, start, end, "header", &mut self.levels, &mut edits, &mut notes).err();
                    headers = Some((start, end, broken));
                }
                Prop::Octet | Prop::Timestamp => {}
            }
            pos += need;
        }
        if pos < p.len() {
            notes.push(format!("{} bytes after the properties dropped", p.len() - pos));
        }
        if notes.is_empty() {
            return None;
        }
        let mut fixed = p[..pos].to_vec();
        for (at, byte) in edits {
            fixed[at] = byte;
        }
        let mut table = match headers {
            Some((start, end, None)) => fixed[start..end].to_vec(),
            Some((start, end, Some(broken_at))) => {
                let mut t = fixed[start..broken_at].to_vec();
                push_long_entry(&mut t, MALFORMED_RAW_HEADER, &p[broken_at..end]);
                t
            }
            None => Vec::new(),
        };
        let after = match headers {
            Some((_, end, _)) => end,
            None => headers_slot,
        };
        // Everything but the table's entries and the marker.
        let base = FRAME_OVERHEAD + 14 + (headers_slot - props_start) + 4 + (pos - after);
        let budget = self.negotiated().unwrap_or(usize::MAX);
        let mut marker = notes.text(MAX_MARKER);
        if base + table.len() + entry_size(&marker) > budget {
            notes.push(format!("the other headers dropped to keep the frame within frame_max ({budget} bytes)"));
            marker = notes.text(MAX_MARKER);
            table.clear();
        }
        let room = budget.saturating_sub(base + table.len() + entry_size(""));
        if marker.len() > room {
            marker = crate::limits::bounded(&marker, room);
        }
        push_long_entry(&mut table, MALFORMED_HEADER, marker.as_bytes());

        let mut out = Vec::with_capacity(base + table.len());
        out.extend_from_slice(&fixed[..12]);
        out.extend_from_slice(&((flags & !1) | HEADERS_FLAG).to_be_bytes());
        out.extend_from_slice(&fixed[props_start..headers_slot]);
        out.extend_from_slice(&(table.len() as u32).to_be_bytes());
        out.extend_from_slice(&table);
        out.extend_from_slice(&fixed[after..pos]);
        Some(out)
    }

    /// Properties that cannot be walked at all: keep the class, weight and
    /// body size (the body frames must still match), and replace the
    /// properties by a header table with the marker and, if it fits, their
    /// raw bytes.
    pub(super) fn rebuild(&self, p: &[u8], props_start: usize, mut notes: Notes, why: &str) -> Vec<u8> {
        notes.push(format!("properties unreadable ({why}); all of them replaced by {MALFORMED_RAW_HEADER}, their raw bytes"));
        let marker = notes.text(MAX_MARKER);
        let raw = &p[props_start..];
        let budget = self.negotiated().unwrap_or(usize::MAX);
        let mut table = Vec::new();
        if FRAME_OVERHEAD + 18 + entry_size(&marker) + 5 + MALFORMED_RAW_HEADER.len() + 1 + raw.len() <= budget {
            push_long_entry(&mut table, MALFORMED_RAW_HEADER, raw);
        }
        let room = budget.saturating_sub(FRAME_OVERHEAD + 18 + table.len() + entry_size(""));
        push_long_entry(&mut table, MALFORMED_HEADER, crate::limits::bounded(&marker, room).as_bytes());
        let mut out = Vec::with_capacity(18 + table.len());
        out.extend_from_slice(&p[..12]);
        out.extend_from_slice(&HEADERS_FLAG.to_be_bytes());
        out.extend_from_slice(&(table.len() as u32).to_be_bytes());
        out.extend_from_slice(&table);
        out
    }
}
