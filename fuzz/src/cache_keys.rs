//! The build-cache keys and base paths (issue 31, ADR-048): what
//! `/cache/{ns}/{key}` accepts as a key
//! ([`store_ops::cache::parse_cache_key`]) and what a cache namespace's
//! `http_path` may be ([`store_ops::cache::check_cache_path`]), against
//! their documented grammars:
//!
//! - a key is 1–255 bytes of `[A-Za-z0-9._-]` segments separated by `/`,
//!   none empty, `.` or `..` (a reference name's rules); so an accepted
//!   key never has an empty segment, a `.`/`..` segment, a leading or
//!   trailing `/`, or a character outside that set, and it prints back as
//!   given;
//! - a key `cas/<rest>` is content addressed: accepted exactly when
//!   `<rest>` is a digest (64 lowercase hex), which it then names;
//!   [`store_ops::cache::cas_key`] of a digest is such a key;
//! - an `http_path` is `/` plus such a path (trailing `/`s ignored), not
//!   starting with `v1`, `cache`, `health` or `metrics`.
//!
//! The input is one string, tried as a key, as a key under `cas/`, and
//! as a base path (as given and with a leading `/`).

use store_ops::cache::{cas_key, check_cache_path, parse_cache_key};
use store_ops::ErrorCode;
use store_types::Digest;

/// The fuzzer's input: one candidate string.
pub type Input = String;

/// The documented key grammar (a reference name's).
fn key_grammar(s: &str) -> bool {
    (1..=255).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
        && s.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// The digest grammar: 64 characters of `[0-9a-f]`.
fn digest_grammar(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The documented `http_path` grammar.
fn path_grammar(p: &str) -> bool {
    let Some(rest) = p.strip_prefix('/') else {
        return false;
    };
    let rest = rest.trim_end_matches('/');
    let first = rest.split('/').next().unwrap_or_default();
    key_grammar(rest) && !["v1", "cache", "health", "metrics"].contains(&first)
}

fn check_key(s: &str) {
    let parsed = parse_cache_key(s);
    let cas = s.strip_prefix("cas/");
    let expected = key_grammar(s) && cas.is_none_or(digest_grammar);
    assert_eq!(
        parsed.is_ok(),
        expected,
        "parse_cache_key({s:?}) = {parsed:?}"
    );
    match parsed {
        Ok((key, digest)) => {
            let k = key.as_str();
            assert_eq!(k, s, "an accepted key is kept as given");
            assert_eq!(key.to_string(), s);
            assert!(!k.starts_with('/') && !k.ends_with('/') && !k.contains("//"));
            assert!(k.split('/').all(|seg| seg != "." && seg != ".."));
            assert!(k.len() <= 255);
            match (cas, digest) {
                (Some(hex), Some(d)) => {
                    assert_eq!(d.to_hex(), hex);
                    assert_eq!(cas_key(&d).as_str(), s, "cas_key round-trips");
                }
                (None, None) => {}
                (c, d) => panic!("key {s:?}: cas part {c:?} but digest {d:?}"),
            }
        }
        Err(e) => {
            assert_eq!(e.code, ErrorCode::KeyInvalid, "{s:?}: {e:?}");
            assert!(!e.message.is_empty() && !e.message.contains('\n'));
        }
    }
}

fn check_path(p: &str) {
    let r = check_cache_path(p);
    assert_eq!(
        r.is_ok(),
        path_grammar(p),
        "check_cache_path({p:?}) = {r:?}"
    );
    if let Err(e) = r {
        assert!(
            matches!(e, store_types::Error::Config(_)),
            "{p:?}: not a configuration error: {e:?}"
        );
    }
}

/// Checks the key parser and the path check on `s`.
pub fn check(s: Input) {
    check_key(&s);
    check_key(&format!("cas/{s}"));
    // Any digest's key is a valid cas key naming it.
    let d = Digest::of(s.as_bytes());
    let k = cas_key(&d);
    let (_, named) = parse_cache_key(k.as_str()).expect("cas_key is a valid key");
    assert_eq!(named, Some(d));
    check_path(&s);
    if !s.starts_with('/') {
        check_path(&format!("/{s}"));
    }
}
