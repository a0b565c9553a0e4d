//! The JSON payloads of `blobs/have` and `blobs/put` (`store_ops::payload`)
//! and the `refs` PUT body (`store_ops::refs::SetRefRequest`): parsing any
//! bytes never panics, and whatever parses serialises and parses back to
//! an equal value.

use serde::de::DeserializeOwned;
use serde::Serialize;
use store_ops::payload::{HaveRequest, HaveResponse, PutResponse};
use store_ops::refs::SetRefRequest;

/// The fuzzer's input: a request or response body.
pub type Input = Vec<u8>;

fn round_trip<T>(bytes: &[u8])
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let Ok(v) = serde_json::from_slice::<T>(bytes) else {
        return;
    };
    let out = serde_json::to_vec(&v).expect("a parsed payload serialises");
    let back: T = serde_json::from_slice(&out).unwrap_or_else(|e| {
        panic!(
            "{v:?} serialised as {:?} does not parse back: {e}",
            String::from_utf8_lossy(&out)
        )
    });
    assert_eq!(back, v);
    // Serialising is deterministic: the same value, the same bytes.
    assert_eq!(serde_json::to_vec(&back).expect("serialises"), out);
}

/// Parses `body` as each payload type.
pub fn check(body: Input) {
    round_trip::<HaveRequest>(&body);
    round_trip::<HaveResponse>(&body);
    round_trip::<PutResponse>(&body);
    round_trip::<SetRefRequest>(&body);
}
