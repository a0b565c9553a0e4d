//! `store_ops::range`: a parsed `Range` header prints and re-parses to the
//! same request, and a single range resolves, against any size, to a
//! non-empty half-open range inside the entry, or to `None` exactly when
//! RFC 9110 calls it unsatisfiable.

use store_ops::range::{parse_range_header, ByteRange, RangeRequest};

/// The fuzzer's input: a `Range` header value.
pub type Input = String;

/// Checks `ByteRange::resolve` against the RFC's arithmetic for `size`.
fn check_resolve(r: ByteRange, size: u64) {
    let got = r.resolve(size);
    let want = match r {
        ByteRange::FromTo(a, b) => (a < size).then(|| a..b.saturating_add(1).min(size)),
        ByteRange::From(a) => (a < size).then_some(a..size),
        ByteRange::Suffix(n) => (n > 0 && size > 0).then(|| size - n.min(size)..size),
    };
    assert_eq!(got, want, "{r:?} against {size}");
    if let Some(g) = got {
        assert!(g.start < g.end, "{r:?} against {size}: empty {g:?}");
        assert!(g.end <= size, "{r:?} against {size}: {g:?} past the end");
    }
}

/// Parses `header` and checks what it yields.
pub fn check(header: Input) {
    let Some(req) = parse_range_header(&header) else {
        return;
    };
    let RangeRequest::Single(r) = req else {
        // Several ranges: at least one comma-separated spec besides the first.
        assert!(header.contains(','), "{header:?} parsed as several ranges");
        return;
    };
    if let ByteRange::FromTo(a, b) = r {
        assert!(a <= b, "{header:?} parsed as {r:?}");
    }
    // Display prints the header form; it parses back to the same range.
    assert_eq!(
        parse_range_header(&r.to_string()),
        Some(RangeRequest::Single(r)),
        "{header:?} → {r:?} → {r}"
    );
    let (a, b) = match r {
        ByteRange::FromTo(a, b) => (a, b),
        ByteRange::From(a) | ByteRange::Suffix(a) => (a, a),
    };
    for size in [0, 1, 2, a, b, u64::MAX, u64::MAX - 1].into_iter().chain(
        [a, b]
            .into_iter()
            .flat_map(|x| [x.wrapping_sub(1), x.wrapping_add(1)]),
    ) {
        check_resolve(r, size);
    }
}
