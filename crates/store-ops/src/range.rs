//! Byte ranges (the HTTP `Range: bytes=...` grammar of RFC 9110 §14.1),
//! parsed without knowing the entry's size and resolved against it later.

use std::ops::Range;

/// One requested byte range, before the entry's size is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteRange {
    /// `first-last`, both inclusive (`last` is clamped to the size).
    FromTo(u64, u64),
    /// `first-`: from `first` to the end.
    From(u64),
    /// `-n`: the last `n` bytes.
    Suffix(u64),
}

/// What a `Range` header asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeRequest {
    /// Exactly one range.
    Single(ByteRange),
    /// Several ranges: not served (answered `invalid_range` / 416, see
    /// ADR-017).
    Multiple,
}

/// Parses a `Range` header value. `None` when the value is not a
/// syntactically valid `bytes` range set — RFC 9110 says such a header is
/// ignored, so the whole entry is served.
pub fn parse_range_header(value: &str) -> Option<RangeRequest> {
    let (unit, set) = value.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let specs: Vec<&str> = set
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut parsed = Vec::with_capacity(specs.len().min(2));
    for spec in &specs {
        parsed.push(parse_spec(spec)?);
    }
    match parsed.len() {
        0 => None,
        1 => Some(RangeRequest::Single(parsed[0])),
        _ => Some(RangeRequest::Multiple),
    }
}

/// A position or length: ASCII digits only. A value past `u64::MAX`
/// saturates (issue 39): no entry is that long, so a last position there
/// is clamped to the end like any other past it, a first position there is
/// past the end (unsatisfiable), and a suffix that long is the whole entry
/// (RFC 9110 §14.1.1) — never an invalid header served whole.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(s.parse().unwrap_or(u64::MAX))
}

/// Whether decimal `a` is at most decimal `b` (digits only, any length:
/// exact also where [`number`] saturates).
fn decimal_le(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    (a.len(), a) <= (b.len(), b)
}

fn parse_spec(spec: &str) -> Option<ByteRange> {
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    match (first.is_empty(), last.is_empty()) {
        (true, true) => None,
        (true, false) => Some(ByteRange::Suffix(number(last)?)),
        (false, true) => Some(ByteRange::From(number(first)?)),
        (false, false) => {
            let (a, b) = (number(first)?, number(last)?);
            // `last < first` is invalid syntax: the header is ignored
            // (compared as written: both may have saturated).
            decimal_le(first, last).then_some(ByteRange::FromTo(a, b))
        }
    }
}

impl std::fmt::Display for ByteRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ByteRange::FromTo(a, b) => write!(f, "bytes={a}-{b}"),
            ByteRange::From(a) => write!(f, "bytes={a}-"),
            ByteRange::Suffix(n) => write!(f, "bytes=-{n}"),
        }
    }
}

impl ByteRange {
    /// The half-open byte range this selects in an entry of `size` bytes,
    /// or `None` when unsatisfiable (starts at or past the end, or a
    /// zero-length suffix).
    pub fn resolve(self, size: u64) -> Option<Range<u64>> {
        match self {
            ByteRange::FromTo(a, b) => (a < size).then(|| a..b.saturating_add(1).min(size)),
            ByteRange::From(a) => (a < size).then_some(a..size),
            ByteRange::Suffix(n) => (n > 0 && size > 0).then(|| size.saturating_sub(n)..size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ByteRange::*;

    #[test]
    fn parses_the_single_range_forms() {
        let one = |s| parse_range_header(s);
        assert_eq!(one("bytes=0-0"), Some(RangeRequest::Single(FromTo(0, 0))));
        assert_eq!(one("bytes=5-"), Some(RangeRequest::Single(From(5))));
        assert_eq!(one("bytes=-7"), Some(RangeRequest::Single(Suffix(7))));
        assert_eq!(
            one(" Bytes = 1 - 2 "),
            Some(RangeRequest::Single(FromTo(1, 2)))
        );
        assert_eq!(one("bytes=0-1, 4-5"), Some(RangeRequest::Multiple));
    }

    #[test]
    fn ignores_invalid_headers() {
        for bad in [
            "",
            "bytes",
            "bytes=",
            "bytes=-",
            "bytes=a-b",
            "items=0-1",
            "bytes=5-2",
            "bytes=1-2,x",
            "bytes=+1-2",
            "bytes=99999999999999999999999-99999999999999999999998",
            "bytes=18446744073709551616-18446744073709551615",
        ] {
            assert_eq!(parse_range_header(bad), None, "{bad:?}");
        }
    }

    /// Issue 39: positions past `u64::MAX` are valid syntax; they saturate.
    #[test]
    fn positions_past_u64_saturate() {
        let one = |s: &str| parse_range_header(s);
        let huge = "1000000000000000000000000000000";
        // A last position past the end is clamped: the satisfiable part.
        assert_eq!(
            one(&format!("bytes=0-{huge}")),
            Some(RangeRequest::Single(FromTo(0, u64::MAX)))
        );
        assert_eq!(FromTo(0, u64::MAX).resolve(10), Some(0..10));
        assert_eq!(
            one("bytes=5-18446744073709551616"),
            Some(RangeRequest::Single(FromTo(5, u64::MAX)))
        );
        assert_eq!(
            one("bytes=18446744073709551615-18446744073709551615"),
            Some(RangeRequest::Single(FromTo(u64::MAX, u64::MAX)))
        );
        // A first position past the end is unsatisfiable, as any start at
        // or past the size is.
        for first in [format!("bytes={huge}-"), format!("bytes={huge}-{huge}0")] {
            let Some(RangeRequest::Single(r)) = one(&first) else {
                panic!("{first:?} is a valid range");
            };
            assert_eq!(r.resolve(10), None, "{first:?}");
            assert_eq!(r.resolve(u64::MAX), None, "{first:?}");
        }
        // Equal values written differently, or with leading zeros.
        assert_eq!(
            one(&format!("bytes=00{huge}-{huge}")),
            Some(RangeRequest::Single(FromTo(u64::MAX, u64::MAX)))
        );
        // A suffix that long is the whole entry.
        assert_eq!(
            one(&format!("bytes=-{huge}")),
            Some(RangeRequest::Single(Suffix(u64::MAX)))
        );
        assert_eq!(Suffix(u64::MAX).resolve(10), Some(0..10));
        // Several ranges stay several, whatever their numbers.
        assert_eq!(
            one(&format!("bytes=0-{huge}, 4-5")),
            Some(RangeRequest::Multiple)
        );
    }

    #[test]
    fn decimals_compare_at_any_length() {
        assert!(decimal_le("0", "0"));
        assert!(decimal_le("007", "7"));
        assert!(decimal_le("9", "10"));
        assert!(!decimal_le("10", "9"));
        assert!(decimal_le(
            "99999999999999999999998",
            "99999999999999999999999"
        ));
        assert!(!decimal_le(
            "99999999999999999999999",
            "099999999999999999999998"
        ));
    }

    #[test]
    fn resolves_against_the_size() {
        assert_eq!(FromTo(0, 0).resolve(10), Some(0..1));
        assert_eq!(FromTo(9, 9).resolve(10), Some(9..10));
        assert_eq!(FromTo(5, 1000).resolve(10), Some(5..10));
        assert_eq!(FromTo(10, 12).resolve(10), None);
        assert_eq!(From(3).resolve(10), Some(3..10));
        assert_eq!(From(10).resolve(10), None);
        assert_eq!(Suffix(1).resolve(10), Some(9..10));
        assert_eq!(Suffix(100).resolve(10), Some(0..10));
        assert_eq!(Suffix(0).resolve(10), None);
        assert_eq!(Suffix(3).resolve(0), None);
        assert_eq!(From(0).resolve(0), None);
    }
}
