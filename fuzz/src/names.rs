//! `Digest::parse` / `from_str`, `Namespace::new` and `RefName::new` accept
//! exactly their documented grammars, and `Display` prints what they
//! parsed (so a parsed value round-trips).

use std::str::FromStr;

use store_types::{Digest, Namespace, RefName};

/// The fuzzer's input: one candidate string for all three parsers.
pub type Input = String;

/// The grammar of a digest: exactly 64 characters of `[0-9a-f]`.
fn digest_grammar(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// The grammar of a namespace: `[a-z0-9][a-z0-9._-]{0,63}`.
fn namespace_grammar(s: &str) -> bool {
    let mut cs = s.chars();
    let first_ok = matches!(cs.next(), Some('a'..='z' | '0'..='9'));
    first_ok
        && s.chars().count() <= 64
        && cs.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '-'))
}

/// The grammar of a reference name: 1–255 characters of `[A-Za-z0-9._/-]`
/// in `/`-separated segments, none empty, `.` or `..`.
fn ref_name_grammar(s: &str) -> bool {
    (1..=255).contains(&s.chars().count())
        && s.chars()
            .all(|c| matches!(c, 'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '/' | '-'))
        && s.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// Checks the three parsers against their grammars on `s`.
pub fn check(s: Input) {
    let d = Digest::parse(&s);
    assert_eq!(
        d.is_ok(),
        digest_grammar(&s),
        "Digest::parse({s:?}) = {d:?}"
    );
    assert_eq!(Digest::from_str(&s).ok(), d.as_ref().ok().copied());
    if let Ok(d) = d {
        assert_eq!(d.to_string(), s);
        assert_eq!(d.to_hex(), s);
        assert_eq!(d.prefix2(), s[..2]);
    }
    // Any digest prints in the canonical form and parses back.
    let of = Digest::of(s.as_bytes());
    assert_eq!(Digest::parse(&of.to_string()).ok(), Some(of));

    let ns = Namespace::new(s.clone());
    assert_eq!(
        ns.is_ok(),
        namespace_grammar(&s),
        "Namespace::new({s:?}) = {ns:?}"
    );
    assert_eq!(Namespace::from_str(&s).ok(), ns.as_ref().ok().cloned());
    let json = serde_json::to_string(&s).expect("a string serialises");
    let via_serde = serde_json::from_str::<Namespace>(&json);
    assert_eq!(
        via_serde.is_ok(),
        ns.is_ok(),
        "serde and new disagree on {s:?}"
    );
    if let Ok(ns) = ns {
        assert_eq!(ns.to_string(), s);
        assert_eq!(ns.as_str(), s);
        assert_eq!(serde_json::to_string(&ns).expect("serialises"), json);
    }

    let r = RefName::new(s.clone());
    assert_eq!(
        r.is_ok(),
        ref_name_grammar(&s),
        "RefName::new({s:?}) = {r:?}"
    );
    if let Ok(r) = r {
        assert_eq!(r.to_string(), s);
        assert_eq!(r.as_str(), s);
    }
}
