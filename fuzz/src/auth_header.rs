//! `Authorization` header parsing (ADR-023; the gate hands the header's
//! bytes to [`Auth::authenticate`]): `Bearer <key>`, or `Basic
//! base64(user:key)` with the key as the password (build tools).
//!
//! A server with two keys (a fixed one and one from the input) sees a
//! header that is either built (a `Bearer` or `Basic` credential with a
//! key or any password, scheme spelled in any case, padded with spaces)
//! or any bytes. Checked:
//!
//! - no panic; an open server ([`Auth::open`]) lets every header through
//!   as the open identity, and no header at all is the anonymous one;
//! - round trip: a `Basic` header of `user:password` (a user without
//!   `:`, any password, `:` included) is read as exactly that password,
//!   and a `Bearer` header as exactly its key (white space around it
//!   aside): the key's identity when the password or key is configured,
//!   else [`AuthError::UnknownKey`], never `Malformed` and never anonymous;
//! - any header is rejected or read as a model of the documented syntax
//!   reads it (scheme case-insensitive, one space, the value trimmed;
//!   `Basic` needs padded standard base64 of UTF-8 `user:password`): a
//!   malformed one is `Malformed`, never another identity, and a header
//!   is never read as a key it does not carry.

use arbitrary::Arbitrary;
use base64::Engine as _;
use store_ops::auth::{
    hash_key, parse_key_hash, ApiKey, Auth, AuthError, Credential, Grant, ANONYMOUS,
};

/// The fixed key's secret.
const FIXED: &str = "bpk_0123456789abcdef";

/// The fuzzer's input: the second key and a header.
#[derive(Arbitrary, Debug)]
pub struct Input {
    key: String,
    header: HeaderChoice,
}

#[derive(Arbitrary, Debug)]
enum HeaderChoice {
    Bearer {
        scheme: u8,
        spaces: u8,
        key: Secret,
        trailing: u8,
    },
    Basic {
        scheme: u8,
        user: String,
        password: Secret,
        /// Drop the base64 padding, or add white space around the value.
        variant: u8,
    },
    Raw(Vec<u8>),
    Text(String),
}

#[derive(Arbitrary, Debug)]
enum Secret {
    Fixed,
    Input,
    Other(String),
}

fn scheme(name: &str, case: u8) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if case >> (i % 8) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// What the documented syntax reads from a header: the key, or why it is
/// malformed.
fn model(h: &[u8]) -> Result<String, &'static str> {
    let h = std::str::from_utf8(h).map_err(|_| "not UTF-8")?.trim();
    let (scheme, value) = h.split_once(' ').ok_or("no scheme")?;
    if scheme.eq_ignore_ascii_case("bearer") {
        Ok(value.trim().to_string())
    } else if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .map_err(|_| "not base64")?;
        let text = String::from_utf8(raw).map_err(|_| "not UTF-8")?;
        let (_, password) = text.split_once(':').ok_or("no colon")?;
        Ok(password.to_string())
    } else {
        Err("another scheme")
    }
}

/// Checks one header against a server with the fixed key and `input.key`.
pub fn check(input: Input) {
    let mut keys = vec![ApiKey {
        name: "fixed".into(),
        hash: parse_key_hash(&hash_key(FIXED)).unwrap(),
        grants: Grant::parse_all(&["read"]).unwrap(),
    }];
    if input.key != FIXED {
        keys.push(ApiKey {
            name: "input".into(),
            hash: parse_key_hash(&hash_key(&input.key)).unwrap(),
            grants: Grant::parse_all(&["write"]).unwrap(),
        });
    }
    let auth = Auth::new(keys, vec![], vec![]).expect("two distinct keys");
    let identity_of = |key: &str| match key {
        k if k == FIXED => Some("fixed"),
        k if k == input.key => Some("input"),
        _ => None,
    };
    let secret = |s: &Secret| match s {
        Secret::Fixed => FIXED.to_string(),
        Secret::Input => input.key.clone(),
        Secret::Other(o) => o.clone(),
    };

    // What the header carries, when it is built to carry a key.
    let (header, carried): (Vec<u8>, Option<String>) = match &input.header {
        HeaderChoice::Bearer {
            scheme: case,
            spaces,
            key,
            trailing,
        } => {
            let k = secret(key);
            let h = format!(
                "{}{}{k}{}",
                scheme("bearer", *case),
                " ".repeat(1 + *spaces as usize % 3),
                " ".repeat(*trailing as usize % 3),
            );
            // A key with white space at its ends is read trimmed; an
            // empty one leaves no value.
            let plain = !k.is_empty() && k.trim() == k;
            (h.into_bytes(), plain.then_some(k))
        }
        HeaderChoice::Basic {
            scheme: case,
            user,
            password,
            variant,
        } => {
            let user: String = user.chars().filter(|c| *c != ':').collect();
            let p = secret(password);
            let mut b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{p}"));
            let mut exact = true;
            match variant % 4 {
                1 => b64 = format!(" {b64} "),
                2 if b64.ends_with('=') => {
                    b64 = b64.trim_end_matches('=').to_string();
                    exact = false;
                }
                _ => {}
            }
            let h = format!("{} {b64}", scheme("basic", *case));
            (h.into_bytes(), exact.then_some(p))
        }
        HeaderChoice::Raw(b) => (b.clone(), None),
        HeaderChoice::Text(t) => (t.clone().into_bytes(), None),
    };

    let got = auth.authenticate(Some(&header), None);
    let shown = String::from_utf8_lossy(&header);
    if let Some(k) = &carried {
        // The round trip: exactly the carried key.
        match identity_of(k) {
            Some(name) => {
                let id = got
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{shown:?} carries key {k:?}: {e:?}"));
                assert_eq!(id.name(), name, "{shown:?}");
                assert_eq!(id.credential(), Credential::Key);
            }
            None => assert_eq!(
                got,
                Err(AuthError::UnknownKey),
                "{shown:?} carries the unknown key {k:?}"
            ),
        }
    }
    match (model(&header), &got) {
        (Ok(k), Ok(id)) => {
            assert_eq!(
                Some(id.name()),
                identity_of(&k),
                "{shown:?} read as {k:?} by the model"
            );
            assert_eq!(id.credential(), Credential::Key);
        }
        (Ok(k), Err(AuthError::UnknownKey)) => {
            assert_eq!(
                identity_of(&k),
                None,
                "{shown:?}: {k:?} is a configured key"
            );
        }
        (Err(why), Err(AuthError::Malformed(_))) => {
            let _ = why;
        }
        (m, g) => panic!("{shown:?}: the model says {m:?}, authenticate {g:?}"),
    }
    if let Ok(id) = &got {
        assert_ne!(id.name(), ANONYMOUS, "a header is never anonymous");
    }
    if let Err(e) = &got {
        assert!(!e.to_string().contains('\n'));
    }

    // An open server lets everything through; no header is anonymous.
    let open = Auth::open().authenticate(Some(&header), None);
    assert!(open.is_ok_and(|id| id.allows(store_ops::auth::Scope::Admin, None)));
    let anon = auth.authenticate(None, None).expect("no header");
    assert!(anon.is_anonymous());
}
