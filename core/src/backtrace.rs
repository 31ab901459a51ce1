//! Where a failure happened, as its copy carries it round the retry ladder
//! and into the DLQ (`x-acemq-backtrace`): the one place it is bounded, for
//! Ruby's exceptions and Rust's errors alike.

use std::fmt::Write as _;

/// The first frames of a failure, bounded and made safe to travel as a
/// header: at most [`Backtrace::MAX_FRAMES`] lines and [`Backtrace::MAX_BYTES`]
/// bytes, cut at a line, with a last line `… N more frames` saying what was
/// left out. Each line is valid UTF-8 with no control characters (invalid
/// bytes become U+FFFD, a control character its escape, so `\n` inside a
/// frame cannot start a line), and one longer than [`Backtrace::MAX_LINE`]
/// is cut with a marker, so one huge frame cannot crowd out the rest.
///
/// From Ruby it is the exception's `backtrace` (innermost first, as Ruby
/// prints it). From Rust it is the error and then its chain of
/// `source()`s, one line each (`caused by: …`): a Rust error has no frames
/// unless it captured a `std::backtrace::Backtrace`, and there is no stable
/// way to ask a `dyn Error` for one; the chain is what the error itself says
/// about where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backtrace {
    text: String,
}

impl Backtrace {
    /// Frames kept: enough to see the raising line and the calls that led
    /// to it from the handler; a deep recursion's ten thousand frames would
    /// make every copy heavier for nothing.
    pub const MAX_FRAMES: usize = 20;
    /// Bytes, the marker line included. A copy's properties and headers
    /// share one frame with everything the publisher set (see
    /// [`crate::limits::MAX_PROPERTIES`]); 4 KiB beside the 4 KiB reason
    /// leaves them room.
    pub const MAX_BYTES: usize = 4096;
    /// Bytes of one line before it is cut: a frame of 100 KiB (a method
    /// name built at run time, a path from a fuzzer) keeps its start.
    pub const MAX_LINE: usize = 512;

    /// The longest source chain counted.
    const MAX_CHAIN: usize = 1000;

    /// Room kept for the `… N more frames` line, so it always fits.
    const MARKER_ROOM: usize = 32;

    /// The first frames of `frames`, innermost first; `len()` is how many
    /// there are in all, so only the ones kept are read. `None` when there
    /// are none.
    pub fn from_frames<I, S>(frames: I) -> Option<Backtrace>
    where
        I: IntoIterator<Item = S>,
        I::IntoIter: ExactSizeIterator,
        S: AsRef<[u8]>,
    {
        let frames = frames.into_iter();
        let total = frames.len();
        if total == 0 {
            return None;
        }
        let mut text = String::new();
        let mut kept = 0;
        for frame in frames.take(Self::MAX_FRAMES) {
            let line = line(frame.as_ref());
            let sep = usize::from(kept > 0);
            if text.len() + sep + line.len() > Self::MAX_BYTES - Self::MARKER_ROOM {
                break;
            }
            if sep == 1 {
                text.push('\n');
            }
            text.push_str(&line);
            kept += 1;
        }
        if kept < total {
            let left = total - kept;
            let _ = write!(text, "\n… {left} more {}", if left == 1 { "frame" } else { "frames" });
        }
        Some(Backtrace { text })
    }

    /// A Rust error's chain: `"{class}: {error}"`, then `"caused by: {source}"`
    /// for each `source()`, bounded as frames are.
    pub fn of_error(class: &str, error: &(dyn std::error::Error + 'static)) -> Backtrace {
        let mut lines = vec![format!("{class}: {error}")];
        let mut source = error.source();
        // Past the frames shown a source is only counted (an empty String
        // allocates nothing); a chain that loops (a source that is its own
        // error) is counted up to MAX_CHAIN.
        while let Some(e) = source {
            if lines.len() >= Self::MAX_CHAIN {
                break;
            }
            lines.push(if lines.len() < Self::MAX_FRAMES { format!("caused by: {e}") } else { String::new() });
            source = e.source();
        }
        Backtrace::from_frames(lines).expect("the error itself is a line")
    }

    /// The header's text: lines joined by `\n`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for Backtrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// One frame as a line: UTF-8 (invalid bytes replaced), control characters
/// escaped, at most [`Backtrace::MAX_LINE`] bytes.
fn line(frame: &[u8]) -> String {
    let text = String::from_utf8_lossy(frame);
    let mut out = String::with_capacity(text.len().min(Backtrace::MAX_LINE + 16));
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > Backtrace::MAX_LINE {
            let marker = format!("… [line cut from {} bytes]", frame.len());
            let mut end = Backtrace::MAX_LINE - marker.len();
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            out.push_str(&marker);
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_backtraces_are_kept_whole() {
        let b = Backtrace::from_frames(["app/a.rb:3:in `charge'", "app/b.rb:9:in `call'"]).unwrap();
        assert_eq!(b.as_str(), "app/a.rb:3:in `charge'\napp/b.rb:9:in `call'");
        assert!(Backtrace::from_frames(Vec::<String>::new()).is_none());
    }

    #[test]
    fn at_most_twenty_frames_and_says_how_many_more() {
        let frames: Vec<String> = (0..57).map(|i| format!("app/deep.rb:{i}:in `down'")).collect();
        let b = Backtrace::from_frames(&frames).unwrap();
        let lines: Vec<&str> = b.as_str().lines().collect();
        assert_eq!(lines.len(), 21);
        assert_eq!(lines[0], "app/deep.rb:0:in `down'");
        assert_eq!(lines[19], "app/deep.rb:19:in `down'");
        assert_eq!(lines[20], "… 37 more frames");
    }

    #[test]
    fn at_most_4_kib_cut_at_a_frame() {
        let frames: Vec<String> = (0..20).map(|i| format!("{i}:{}", "x".repeat(400))).collect();
        let b = Backtrace::from_frames(&frames).unwrap();
        assert!(b.as_str().len() <= Backtrace::MAX_BYTES, "{}", b.as_str().len());
        let lines: Vec<&str> = b.as_str().lines().collect();
        let shown = lines.len() - 1;
        assert!(shown < 20 && shown > 5, "{shown}");
        for (i, l) in lines[..shown].iter().enumerate() {
            assert_eq!(**l, frames[i], "whole frames only");
        }
        assert_eq!(lines[shown], format!("… {} more frames", 20 - shown));
    }

    #[test]
    fn a_huge_frame_is_cut_and_the_next_still_shown() {
        let huge = format!("app/huge.rb:1:in `{}'", "m".repeat(100 * 1024));
        let b = Backtrace::from_frames([huge.as_str(), "app/next.rb:2"]).unwrap();
        let lines: Vec<&str> = b.as_str().lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("app/huge.rb:1:in `mmm"));
        assert!(lines[0].ends_with(&format!("… [line cut from {} bytes]", huge.len())), "{}", lines[0]);
        assert!(lines[0].len() <= Backtrace::MAX_LINE);
        assert_eq!(lines[1], "app/next.rb:2");
    }

    #[test]
    fn hostile_bytes_become_one_safe_line() {
        let frame: &[u8] = b"app/<script>alert(1)</script>.rb:1\n\x1b[31m\xff\xfe\0:in `x'";
        let b = Backtrace::from_frames([frame]).unwrap();
        assert_eq!(b.as_str(), "app/<script>alert(1)</script>.rb:1\\n\\u{1b}[31m\u{fffd}\u{fffd}\\u{0}:in `x'");
        assert_eq!(b.as_str().lines().count(), 1);
        // Many escapes in one long line still end within the line's bound.
        let controls = vec![0x01u8; 10_000];
        let b = Backtrace::from_frames([controls]).unwrap();
        assert!(b.as_str().len() <= Backtrace::MAX_LINE && b.as_str().contains("line cut from 10000 bytes"));
    }

    #[derive(Debug)]
    struct Outer(std::num::ParseIntError);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the amount could not be read")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[derive(Debug)]
    struct Loop;
    impl std::fmt::Display for Loop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("again")
        }
    }
    impl std::error::Error for Loop {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self)
        }
    }

    #[test]
    fn a_chain_that_loops_is_counted_to_a_bound() {
        let b = Backtrace::of_error("Loop", &Loop);
        let lines: Vec<&str> = b.as_str().lines().collect();
        assert_eq!(lines.len(), 21);
        assert_eq!(lines[0], "Loop: again");
        assert_eq!(lines[19], "caused by: again");
        assert_eq!(lines[20], "… 980 more frames");
    }

    #[test]
    fn a_rust_error_is_its_chain_of_sources() {
        let e = Outer("x".parse::<u8>().unwrap_err());
        let b = Backtrace::of_error("billing::Outer", &e);
        assert_eq!(b.as_str(), "billing::Outer: the amount could not be read\ncaused by: invalid digit found in string");
    }
}
